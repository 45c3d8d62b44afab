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
