"""The front's weight pusher on its own, without processes: the versions it pushes, those each
worker acknowledged, and the weights a push without weights sends when the workers build their policies."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.trainer.lifetime import Resources
from rpc_collectors.trainer.roster import WorkerRecord
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.transport import factory_weights
from rpc_collectors.transport.rendezvous import host_id


class Workers:
    """A pool of ``n`` workers that answer each call at once, or hold it (``hold``) until told to."""

    in_process, process_groups = False, True

    def __init__(self, n: int) -> None:
        self.hold = False
        self.held: list[torch.futures.Future] = []
        self.received: dict[int, list[tuple]] = {i: [] for i in range(n)}

    def call(self, worker_id: int, method: str, *args: object) -> torch.futures.Future:
        if method == "receive_weights":
            self.received[worker_id].append(args)
        fut = torch.futures.Future()
        if self.hold:
            self.held.append(fut)
        else:
            fut.set_result(None)
        return fut

    def answer(self) -> None:
        for fut in self.held:
            fut.set_result(None)
        self.held = []


def gather(calls: dict, futures: dict | None = None) -> list:
    futures = futures if futures is not None else {i: call() for i, call in calls.items()}
    return [futures[i].wait() for i in sorted(calls)]


def pusher(n: int = 2, policy: object = None, factory: bool = False) -> tuple[WeightPusher, Workers]:
    workers = Workers(n)
    roster = [WorkerRecord(info={"host_id": host_id()}) for _ in range(n)]

    def call(worker_id: int, method: str, *args: object):
        return lambda: workers.call(worker_id, method, *args)

    p = WeightPusher(
        policy, workers, roster, WorkerCalls(call), gather, transport="rpc", factory=factory, no_push=False, policy_device=None,
        backend="gloo", elastic=False, rpc_timeout=10.0, refill=False, resources=Resources(),
    )
    return p, workers


def test_versions_before_any_push_are_zero_and_a_vacant_slot_has_none():
    p, workers = pusher(3)
    assert p.worker_versions() == [0, 0, 0] and p.acknowledged() == 0
    p.roster[1].vacated()
    assert p.worker_versions() == [0, None, 0] and p.acknowledged() == 0  # a vacant slot does not count


def test_a_push_to_some_workers_leaves_no_acknowledged_version_until_all_hold_it():
    p, workers = pusher(2, nn.Linear(2, 1))
    p.open()
    p.push([0, 1])
    assert p.version == 1 and p.worker_versions() == [1, 1] and p.acknowledged() == 1
    p.push([0])
    assert p.version == 2 and p.worker_versions() == [2, 1] and p.acknowledged() is None
    p.push([1], version=2)  # a worker left behind gets the trainer's version, not a new one
    assert p.version == 2 and p.worker_versions() == [2, 2] and p.acknowledged() == 2
    assert [args[0] for args in workers.received[0]] == [1, 2] and [args[0] for args in workers.received[1]] == [1, 2]


def test_a_push_in_flight_is_not_acknowledged_until_its_workers_answer():
    p, workers = pusher(2, nn.Linear(2, 1))
    p.open()
    workers.hold = True
    p.update(None, None, non_blocking=True)
    assert p.version == 1 and p.worker_versions() == [None, None] and p.acknowledged() is None
    workers.answer()
    assert p.worker_versions() == [1, 1] and p.acknowledged() == 1
    p.finish()


def test_a_checked_update_that_fails_changes_no_version():
    p, workers = pusher(2, nn.Linear(2, 1))
    p.open()
    with pytest.raises((ValueError, TypeError)):
        p.update({"weight": torch.zeros(3, 3), "bias": torch.zeros(1)}, None, non_blocking=False)
    assert p.version == 0 and p.worker_versions() == [0, 0] and workers.received == {0: [], 1: []}


def test_workers_that_build_their_policies_get_the_weights_given_last():
    p, workers = pusher(2, factory=True)
    with pytest.raises(TypeError, match="no weights"):
        p.update(None, None, non_blocking=False)
    weights = TensorDict({"weight": torch.ones(1, 2), "bias": torch.ones(1)})
    workers.call = _signature_of(weights, workers.call)
    p.update(weights, None, non_blocking=False)
    later = TensorDict({"weight": torch.full((1, 2), 2.0), "bias": torch.full((1,), 3.0)})
    p.update(later, None, non_blocking=False)
    assert p.given is later and p.worker_versions() == [2, 2]
    p.push([0, 1])  # a push without weights sends the ones given last
    version, mode, buffer = workers.received[1][-1]
    sent = [view.clone() for view in p.plane.sender.flat.views(buffer)]
    assert version == 3 and mode == "rpc"
    assert sorted(float(t.sum()) for t in sent) == [3.0, 4.0]  # later's bias and weight, not weights' ones


def _signature_of(weights: TensorDict, call):
    """Answer ``weights_signature`` as workers whose policies hold ``weights`` do."""
    signature = factory_weights.signature_of(weights)

    def answer(worker_id: int, method: str, *args: object) -> torch.futures.Future:
        if method != "weights_signature":
            return call(worker_id, method, *args)
        fut = torch.futures.Future()
        fut.set_result(signature)
        return fut

    return answer
