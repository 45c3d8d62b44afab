"""Where the spawner of local workers comes from: forked, or a fresh interpreter where a fork of the
trainer could not run CUDA (torch's fork poisoning once the devices were queried) or RPC."""
from __future__ import annotations

import pytest
import torch

from rpc_collectors.worker import spawner


@pytest.fixture
def chosen(monkeypatch) -> list[bool]:
    """The ``fresh_interpreter`` each new spawner is started with (none is started)."""
    fresh: list[bool] = []

    class Recorded:
        alive = True

        def __init__(self, fresh_interpreter: bool) -> None:
            fresh.append(fresh_interpreter)

    monkeypatch.setattr(spawner, "Spawner", Recorded)
    monkeypatch.setattr(spawner, "_shared", None)
    monkeypatch.setattr(spawner, "_forked_safely", True)
    return fresh


def test_a_cpu_build_forks_its_spawner(chosen, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    spawner.shared_spawner()
    assert chosen == [False]


def test_a_cuda_build_starts_its_spawner_fresh_before_cuda_is_initialised(chosen, monkeypatch):
    """``torch.cuda.is_available()`` in the trainer's checks poisons later forks without initialising CUDA."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    spawner.shared_spawner()
    assert chosen == [True]


def test_after_an_rpc_agent_the_spawner_starts_fresh(chosen, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    spawner.rpc_starts_here(fork_now=False)
    spawner.shared_spawner()
    assert chosen == [True]


NODE_RUN = """
import sys
sys.path[:0] = {paths!r}
from conftest import CountEnv
from rpc_collectors import GymEnv, RPCCollector

def make():
    return GymEnv(CountEnv())

with RPCCollector([make], None, frames_per_batch=20, total_frames=40, collector_class="sync",
                  num_workers_per_collector=2, launcher="local") as collector:
    frames = sum(batch.numel() for batch in collector)
print("frames", frames)
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_node_collector_run_with_every_warning_on_prints_none():
    """Python's warnings all on (``-W default``, as a user debugging a run has them): a node
    collector's start, batches and shutdown print no warning, none of the file objects a forked
    spawner inherits from its parent among them."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-W", "default", "-c",
                           NODE_RUN.format(paths=[str(tests), str(tests.parent)])],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0 and "frames 40" in done.stdout, done.stderr
    assert "Warning" not in done.stderr, done.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("fresh_interpreter", [False, True])
def test_a_closed_spawner_kills_its_children_and_exits_cleanly(fresh_interpreter):
    """``close()`` ends a spawner's children and the spawner itself, which exits with 0 (it skips
    the interpreter's teardown)."""
    import os

    spawned = spawner.Spawner(fresh_interpreter=fresh_interpreter)
    try:
        child = spawned.spawn("time:sleep", [60], timeout=30, on_exit=lambda *_: None)
        os.kill(child, 0)  # it runs
    finally:
        spawned.close(timeout=20)
    assert not spawned.alive
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    if fresh_interpreter:
        assert spawned.proc.returncode == 0


def huge_pages_here() -> bool:
    """Whether this kernel can move memory to 2 MiB pages on request (``MADV_COLLAPSE``: Linux
    6.1, transparent huge pages not off)."""
    import platform
    from pathlib import Path

    setting = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    release = tuple(int(part) for part in platform.release().split(".")[:2])
    return release >= (6, 1) and setting.exists() and "[never]" not in setting.read_text()


def anon_huge_kib(pid: int) -> int:
    from pathlib import Path

    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    return next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
@pytest.mark.parametrize("fresh_interpreter", [False, True])
def test_a_spawner_on_huge_pages_forks_from_them_and_reports_its_childrens_exits(fresh_interpreter):
    """``use_huge_pages()``: the spawner's memory is in 2 MiB pages before its next fork (which
    the children inherit), and children run and exit as before."""
    import threading

    if not huge_pages_here():
        pytest.skip("this kernel does not move memory to huge pages on request (MADV_COLLAPSE)")
    spawned = spawner.Spawner(fresh_interpreter=fresh_interpreter)
    exits: dict[int, int] = {}
    exited = threading.Event()
    try:
        spawned.spawn("time:sleep", [0], timeout=30, on_exit=lambda pid, code: None)
        before = anon_huge_kib(spawned.pid)
        spawned.use_huge_pages()
        child = spawned.spawn("time:sleep", [60], timeout=30,
                              on_exit=lambda pid, code: (exits.update({pid: code}), exited.set()))
        # the spawner moved its memory before this fork; the child inherits the huge pages
        assert anon_huge_kib(spawned.pid) >= before + 8 * 1024
        assert anon_huge_kib(child) >= 8 * 1024
        spawned.kill(child)
        assert exited.wait(30) and exits == {child: -9}
    finally:
        spawned.close(timeout=20)


@pytest.mark.parametrize("shape, asked", [(lambda n: (n - 1, 0), False), (lambda n: (n, 0), True),
                                          (lambda n: (4, n // 4 - 2), False),
                                          (lambda n: (4, n // 4 - 1), True)])
def test_a_pool_of_many_processes_has_its_spawner_use_huge_pages(monkeypatch, shape, asked):
    """The processes counted are the pool's workers and, for nodes, their local workers: from
    ``HUGE_PAGES_AT`` on, the spawner is asked before the first fork."""
    from rpc_collectors.pools import local

    workers, per_node = shape(local.HUGE_PAGES_AT)

    calls: list[str] = []

    class Recording:
        def use_huge_pages(self) -> None:
            calls.append("huge pages")

        def spawn(self, *args, **kwargs) -> int:
            calls.append("spawn")
            raise RuntimeError("no process in this test")

    monkeypatch.setattr(spawner, "shared_spawner", Recording)
    with pytest.raises(RuntimeError, match="no process"):
        local.LocalPool(workers, 10.0, lambda *_: None, per_node=per_node)
    assert calls == (["huge pages", "spawn"] if asked else ["spawn"])
