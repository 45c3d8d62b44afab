"""The front's weight pusher on its own, without processes: the versions it pushes, those each
worker acknowledged, and the weights a push without weights sends when the workers build their policies."""
from __future__ import annotations

import time
from collections import deque

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from rpc_collectors.core.metrics import FrameAccount
from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.single_process.run_meter import PUSH_THREAD, RunMeter
from rpc_collectors.trainer import weight_pushes
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
        self.receipts: dict[int, tuple] = {}  # worker -> its answer to receive_weights (default: None)

    def call(self, worker_id: int, method: str, *args: object) -> torch.futures.Future:
        answer = None
        if method == "receive_weights":
            self.received[worker_id].append(args)
            answer = self.receipts.get(worker_id)
        fut = torch.futures.Future()
        if self.hold:
            self.held.append((fut, answer))
        else:
            fut.set_result(answer)
        return fut

    def answer(self) -> None:
        for fut, answer in self.held:
            fut.set_result(answer)
        self.held = []


def gather(calls: dict, futures: dict | None = None) -> list:
    futures = futures if futures is not None else {i: call() for i, call in calls.items()}
    return [futures[i].wait() for i in sorted(calls)]


def pusher(n: int = 2, policy: object = None, factory: bool = False, meter: RunMeter | None = None,
           transport: str = "rpc") -> tuple[WeightPusher, Workers]:
    workers = Workers(n)
    roster = [WorkerRecord(info={"host_id": host_id()}) for _ in range(n)]

    def call(worker_id: int, method: str, *args: object):
        return lambda: workers.call(worker_id, method, *args)

    p = WeightPusher(
        policy, workers, roster, WorkerCalls(call), gather, transport=transport, factory=factory, no_push=False,
        policy_device=None, backend="gloo", elastic=False, rpc_timeout=10.0, refill=False, resources=Resources(), meter=meter,
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


PHASES = ("pause", "transfer", "acknowledge", "apply")
SECOND = 10**9


@pytest.mark.parametrize("transport", ["shm", "rpc"])
def test_each_push_splits_into_phases_that_lie_within_it_and_the_workers_apply_is_theirs(transport):
    """Pause, transfer and acknowledge are the trainer's, back to back within the push; apply is what
    the workers' answers report (a worker that took 2 s applying shows in apply, not in transfer)."""
    meter = RunMeter()
    meter.spans = deque()
    p, workers = pusher(2, nn.Linear(2, 1), meter=meter, transport=transport)
    p.open()
    took = []
    for version in (1, 2, 3):
        # each answer: its receipt of the bytes, then its last apply (of the version before)
        workers.receipts = {0: (1000, version - 1, 2 * SECOND), 1: (3000, version - 1, SECOND)} if version > 1 else {}
        start = time.monotonic()
        p.push([0, 1])
        took.append(time.monotonic() - start)
    m = meter.snapshot(0, (0, 0), None, (), FrameAccount(), data_plane=True).pushes
    phases = [getattr(m, f"{phase}_s") for phase in PHASES]
    last = [getattr(m, f"last_{phase}_s") for phase in PHASES]
    assert all(t >= 0 for t in phases + last) and all(lt <= t for lt, t in zip(last, phases))
    assert m.pause_s + m.transfer_s + m.acknowledge_s <= sum(took) + 1e-6  # all three lie within each push
    assert m.transfer_s >= 2 * 3000e-9  # from the second push on: the slowest worker's receipt
    assert (m.apply_s, m.last_apply_s) == (4.0, 2.0)  # versions 1 and 2: the slower worker's, each once
    assert m.transfer_s < 1.0  # the workers' 2 s of applying lie in apply alone
    rows = meter.take_spans()[PUSH_THREAD]
    assert [name for name, *_ in rows] == ["pause", "transfer", "acknowledge"] * 3
    assert all(before[2] <= after[1] for before, after in zip(rows, rows[1:]))  # back to back, in order


def test_an_apply_reported_again_with_a_later_push_counts_once_and_a_failed_answer_none():
    meter = RunMeter()
    p, workers = pusher(2, nn.Linear(2, 1), meter=meter)
    p.open()
    workers.receipts = {0: (0, 1, SECOND), 1: (0, None, 0)}
    p.push([0, 1])
    workers.receipts = {1: (0, 1, SECOND // 2)}  # worker 1 applied version 1 late, and faster than worker 0
    p.push([1])
    m = meter.snapshot(0, (0, 0), None, (), FrameAccount(), data_plane=True).pushes
    assert m.apply_s == 1.0 and m.count == 2
    receipts = [torch.futures.Future(), torch.futures.Future()]
    receipts[0].set_exception(RuntimeError("gone"))
    receipts[1].set_result((0, 2, SECOND))
    meter.acknowledged(meter.pushed(1), (1, 2, 3), weight_pushes.receipts_of(receipts))
    assert meter.snapshot(0, (0, 0), None, (), FrameAccount(), data_plane=True).pushes.apply_s == 2.0


def test_with_metrics_off_a_push_reads_no_clock_for_its_phases():
    meter = RunMeter(on=False)
    p, workers = pusher(2, nn.Linear(2, 1), meter=meter)
    p.open()
    workers.receipts = {0: (5, 1, 7)}
    p.push([0, 1])
    p.push([0, 1])
    assert meter.push_clock() == 0 and set(meter.phase_ns.values()) == {0}
