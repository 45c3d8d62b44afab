"""One steady-state batch's path through the package, measured: which of its source files run.

A profile function (``sys.setprofile``, and ``threading.setprofile`` for the threads started
after it) records the file of every Python function called while a batch is on its way: in the
trainer, all of ``next(iter(collector))``, from asking the workers to handing the batch to the
loop; in each local worker process, everything it runs meanwhile (the tracer is installed there
by the env factory, before the worker's doorbell thread starts, and records while a byte of a
file shared with the trainer is set). What counts: the package's own files; the user's env and
policy, torch, tensordict and the standard library do not. The batches traced are the third
to fifth, well after the first (which set up the batch slots).
"""
from __future__ import annotations

import functools
import mmap
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Callable

import pytest
import torch
from torch import nn

import rpc_collectors
from conftest import CountEnv
from rpc_collectors import MultiAsyncCollector, MultiSyncCollector

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(180)]

ROOT = os.path.dirname(os.path.abspath(rpc_collectors.__file__)) + os.sep
COLLECTION = "single_process" + os.sep  # the single-process collection, at both ends of the path
TRACED = (2, 3, 4)  # the batches (0-based) whose path is recorded: three, as an async worker collects up to two ahead


class Tracer:
    """Records ``side path:function`` of each package function called while ``flag[0]`` is set."""

    def __init__(self, side: str, flag: mmap.mmap, sink: Callable[[str], object]) -> None:
        self.side, self.flag, self.sink = side, flag, sink
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.on = True  # False: each thread that calls it next removes it (threads started meanwhile hold it)

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.on:
            sys.setprofile(None)
            return
        if event != "call" or not self.flag[0]:
            return
        code = frame.f_code
        if not code.co_filename.startswith(ROOT):
            return
        entry = f"{self.side} {code.co_filename[len(ROOT):]}:{getattr(code, 'co_qualname', code.co_name)}"
        with self.lock:
            if entry not in self.seen:
                self.seen.add(entry)
                self.sink(entry)

    def install(self) -> None:
        sys.setprofile(self)
        threading.setprofile(self)


def _open_flag(path: str) -> mmap.mmap:
    with open(path, "r+b") as file:
        return mmap.mmap(file.fileno(), 1)


def traced_env(flag_path: str, log_path: str, trainer_pid: int) -> CountEnv:
    """The env of a worker whose calls are traced (in a worker process; an env built in the trainer is not)."""
    if os.getpid() != trainer_pid:
        log = open(log_path, "a", buffering=1)  # open while the process lives
        Tracer("worker", _open_flag(flag_path), lambda entry: log.write(entry + "\n")).install()
    return CountEnv()


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def batch_path(tmp_path: Path, cls: type, **kwargs) -> list[str]:
    """``side path:function`` of every package function one steady-state batch runs, sorted."""
    flag_path, log_path = tmp_path / "flag", tmp_path / "worker.log"
    flag_path.write_bytes(b"\0")
    log_path.write_text("")
    flag = _open_flag(str(flag_path))
    entries: list[str] = []
    tracer = Tracer("trainer", flag, entries.append)
    tracer.install()
    try:
        env = functools.partial(traced_env, str(flag_path), str(log_path), os.getpid())
        with cls([env, env], Policy(), frames_per_batch=20, total_frames=20 * (max(TRACED) + 2),
                 launcher="local", rpc_timeout=60, **kwargs) as collector:
            for i, _ in enumerate(collector):
                flag[0] = (i + 1) in TRACED  # on while the next batch is on its way
    finally:
        tracer.on = False
        sys.setprofile(None)
        threading.setprofile(None)
    return sorted(set(entries) | set(log_path.read_text().split("\n")) - {""})


def files_of(entries: list[str]) -> dict[str, set[str]]:
    """``{side: files on the path}``, ``"all"`` of them, and ``"collection"``: the single-process
    collection's files (not counted)."""
    sides: dict[str, set[str]] = {"trainer": set(), "worker": set(), "collection": set()}
    for entry in entries:
        side, where = entry.split(" ", 1)
        path = where.split(":")[0]
        sides["collection" if path.startswith(COLLECTION) else side].add(path)
    sides["all"] = sides["trainer"] | sides["worker"]
    return sides


# 9: worker/single.py, the worker's face of its Collector (worker/served_collector.py's interface), joined the path
@pytest.mark.parametrize("cls, most", [(MultiSyncCollector, 9), (MultiAsyncCollector, 9)])
def test_one_steady_state_batch_runs_in_a_bounded_set_of_files(tmp_path, cls, most):
    """A steady-state batch of local workers, from the trainer's request to the loop, runs in at
    most ``most`` of the package's files, trainer and worker together (the path of
    docs/architecture.md's walk)."""
    entries = batch_path(tmp_path, cls)
    files = files_of(entries)
    print("\n".join(entries))
    for side in ("trainer", "worker", "all", "collection"):
        print(f"{side}: {len(files[side])} files: {sorted(files[side])}")
    assert files["worker"], "the workers' tracer recorded nothing"
    assert len(files["all"]) <= most, sorted(files["all"])
