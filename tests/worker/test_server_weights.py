"""A collector server's weights between batches, without processes: what was pushed to it is
applied before its next batch, also a push that came after that batch was asked for, and a
batch with nothing pushed since goes on with the weights its policy holds."""
from __future__ import annotations

import pytest
import torch

from conftest import CountEnv, FixedAction
from rpc_collectors.core import worker_warnings
from rpc_collectors.core.protocol import WorkerSpec
from rpc_collectors.transport.weight_sync import TransportSpec
from rpc_collectors.transport.weights import FlatWeights
from rpc_collectors.worker.server import WorkerState

pytestmark = pytest.mark.timeout(60)
VERSION, FRAMES = ("collector", "policy_version"), 6


def server() -> WorkerState:
    options = {"frames_per_batch": FRAMES, worker_warnings.KEY: worker_warnings.for_workers()}
    state = WorkerState(WorkerSpec(CountEnv, FixedAction(0, obs_size=3), options).dumps(), 0, 1, 0, in_process=True)
    flat = FlatWeights(state.collector.weights_holder(()))
    state.join_weights(TransportSpec("rpc", flat.nbytes, signature=flat.signature))
    return state


def pushed(version: int, choice: int) -> tuple[int, str, torch.Tensor]:
    """``receive_weights`` arguments of the trainer's push of ``FixedAction(choice, obs_size=3)`` as ``version``."""
    flat = FlatWeights(FixedAction(choice, obs_size=3))
    payload = flat.new_buffer()
    flat.pack(payload)
    return version, "rpc", payload


def chosen(batch) -> tuple[set[int], set[int]]:
    """The actions in ``batch``, and the weights versions its steps name."""
    return set(batch["action"].tolist()), set(batch.get(VERSION).tolist())


def test_weights_pushed_after_a_batch_was_asked_for_are_applied_before_it():
    state = server()
    assert chosen(state.collect(0)) == ({0}, {0})
    state.receive_weights(*pushed(1, choice=1))  # arrives after the next request, asked with version 0
    assert chosen(state.collect(0)) == ({1}, {1})  # every step chosen by version 1, and named so


def test_a_batch_with_nothing_pushed_since_keeps_the_weights_and_version_its_policy_holds():
    state = server()
    state.receive_weights(*pushed(1, choice=1))
    assert chosen(state.collect(1)) == ({1}, {1})
    assert chosen(state.collect(1)) == ({1}, {1}) and state.collector.policy_version == 1
    state.receive_weights(*pushed(2, choice=0))
    assert chosen(state.collect(2)) == ({0}, {2})
