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
