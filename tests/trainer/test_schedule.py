"""The front's sync and async schedules on their own, without processes: workers that answer each
request at once with a batch numbering their own requests, the front's real waits and parts."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from rpc_collectors.core.errors import Failure
from rpc_collectors.core.options import Run
from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.single_process.batch_record import VERSION, WORKER_ID
from rpc_collectors.single_process.frame_ledger import Ledger
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.lifetime import Resources
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.schedule import Schedule
from rpc_collectors.trainer.waits import Events, Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher

FRAMES = 3


class Workers:
    """Workers that answer ``collect`` at once with their ``n``-th batch: steps ``n*FRAMES ...``,
    under policy version ``versions[i]``; ``preempt`` and ``cut`` calls are recorded."""

    def __init__(self, n: int) -> None:
        self.asked = [0] * n
        self.versions = [0] * n
        self.told: list[tuple] = []

    @property
    def calls(self) -> WorkerCalls:
        return WorkerCalls(self.call)

    def call(self, worker_id: int, method: str, *args: object) -> torch.futures.Future:
        fut = torch.futures.Future()
        if method == "collect":
            n = self.asked[worker_id]
            self.asked[worker_id] += 1
            steps = torch.arange(n * FRAMES, (n + 1) * FRAMES)
            fut.set_result(TensorDict({"step": steps, VERSION: torch.full((FRAMES,), self.versions[worker_id])}, [FRAMES]))
        else:
            self.told.append((worker_id, method, *args))
            fut.set_result(None)
        return fut

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        return str(err), ""


class Slots:
    """A data plane without shared memory: every answer is the batch itself, one request in flight per worker."""

    def slot_for(self, worker_id: int, again: bool) -> int:
        return 0

    def ring(self, worker_id: int, min_version: int, slot: int) -> None:
        return None

    def depth(self, worker_id: int) -> int:
        return 1

    def receive(self, worker_id: int, result: TensorDict) -> TensorDict:
        return result

    def round(self, results: list) -> None:
        return None


def front(n: int = 2, sync: bool = True, **options: object) -> SimpleNamespace:
    """A front's parts over ``n`` workers that answer at once; ``options``: the plan's, as given."""
    workers, events = Workers(n), Events()
    roster = Roster(n, max_worker_restarts=0)
    for worker_id in range(n):
        roster.served(worker_id, {"envs": 1})
    given = {"sync": sync, "elastic": False, "max_policy_lag": None, "policy_lag_mode": "admit", "preempt_after": None,
             **options}
    groups = SimpleNamespace(
        run=Run(sync=given["sync"], max_policy_lag=given["max_policy_lag"], policy_lag_mode=given["policy_lag_mode"]),
        weights=SimpleNamespace(max_weight_update_interval=-1),
        launch=SimpleNamespace(elastic=given["elastic"], join_timeout=10.0),
    )
    plan = SimpleNamespace(options=groups, num_workers=n, cat_results="stack", preempt_after=given["preempt_after"],
                           update_after_each_batch=False, frames_per_batch_worker=[FRAMES] * n)
    waits = Waits(events, roster, workers, 10.0, lambda: None, _no_recovery)
    waits.deferred = WorkerCalls(lambda i, method, *args: lambda: workers.call(i, method, *args))
    slots = SimpleNamespace(plane=Slots())
    continuity = Continuity(roster, waits, groups.run.max_policy_lag)
    pusher = WeightPusher(None, workers, roster, waits.deferred, waits.gather, transport="rpc", factory=False,
                          no_push=False, policy_device=None, backend="gloo", elastic=False, rpc_timeout=10.0,
                          refill=False, resources=Resources())
    recovery = SimpleNamespace(recover=_no_recovery)
    schedule = Schedule(plan, roster, events, waits, workers, pusher, slots, continuity, recovery, Ledger(n),
                        _no_failure)
    return SimpleNamespace(workers=workers, roster=roster, continuity=continuity, pusher=pusher, schedule=schedule)


def _no_failure(error: BaseException) -> BaseException:
    raise AssertionError(f"nothing fails here: {error}")


def _no_recovery(failed: Failure) -> bool:
    raise AssertionError(f"no worker fails here: {failed}")


def test_a_sync_round_stacks_one_batch_of_every_worker_in_worker_order():
    f = front(3)
    for n in range(2):
        batch = f.schedule.collect()
        assert batch.shape == (3, FRAMES)
        assert batch.get(WORKER_ID)[:, 0].tolist() == [0, 1, 2]
        assert batch["step"].tolist() == [list(range(n * FRAMES, (n + 1) * FRAMES))] * 3
    assert f.workers.asked == [2, 2, 2] and all(record.outstanding == 0 for record in f.roster)


def test_a_preemptive_round_tells_the_workers_not_handed_in_to_end_their_batch():
    f = front(3, preempt_after=1)
    f.schedule.collect()
    assert sorted(told[:2] for told in f.workers.told) == [(1, "preempt"), (2, "preempt")]


def test_async_batches_come_one_worker_at_a_time_each_worker_kept_busy():
    f = front(2, sync=False)
    seen = []
    for _ in range(4):
        batch = f.schedule.collect()
        assert batch.shape == (FRAMES,)
        seen.append(int(batch.get(WORKER_ID)[0]))
    assert sorted(seen) == [0, 0, 1, 1]  # first ready first served: both answer at once, in turn
    assert all(record.outstanding == 1 for record in f.roster)  # each asked again while the trainer works


def test_an_async_batch_too_far_behind_the_trainer_is_dropped_and_its_worker_asked_again():
    f = front(1, sync=False, max_policy_lag=1, policy_lag_mode="drop")
    f.pusher.version = 3  # the trainer is at version 3; the worker's first batch was collected with 0
    f.workers.versions[0] = 0
    f.pusher.plane = SimpleNamespace()
    f.roster[0].sent_weights(3)  # already sent version 3
    first = f.schedule.collect
    f.workers.call = _then_version(f.workers, 3)
    batch = first()
    assert batch["step"].tolist() == list(range(FRAMES, 2 * FRAMES))  # the second batch, collected with version 3
    assert (f.continuity.dropped_frames, f.continuity.dropped_batches) == (FRAMES, 1)
    assert (0, "cut", 1) in f.workers.told  # its stream goes on under new ids after the dropped batch


def test_an_async_answer_asked_before_its_workers_stream_was_cut_is_dropped_and_the_next_handed_out():
    f = front(1, sync=False)
    assert f.schedule.collect()["step"].tolist() == list(range(FRAMES))
    f.continuity.cut([0])  # the batch asked meanwhile continues the stream the cut ends
    assert f.schedule.collect()["step"].tolist() == list(range(2 * FRAMES, 3 * FRAMES))
    assert (f.continuity.dropped_frames, f.continuity.dropped_batches) == (FRAMES, 1)
    assert (0, "cut", 1) in f.workers.told and f.roster[0].stale == 0


def test_an_admitted_worker_is_asked_at_once_and_one_that_left_is_no_longer_the_async_one():
    f = front(2, sync=False)
    f.schedule.last_async = 1
    f.schedule.left(1)
    assert f.schedule.last_async is None
    f.schedule.admitted(0)
    assert f.roster[0].outstanding == 1


def test_an_elastic_member_whose_batch_differs_from_the_runs_fails_to_recovery():
    f = front(2, sync=False, elastic=True)
    failures = []

    def leave(failed: Failure) -> bool:
        failures.append(failed)
        raise Left

    f.schedule.recovery = SimpleNamespace(recover=leave)
    f.schedule.collect()
    f.workers.call = _wider(f.workers)
    with pytest.raises(Left):
        for _ in range(3):
            f.schedule.collect()
    assert len(failures) == 1 and "unlike the run's" in failures[0].reason


class Left(Exception):
    """The recovery of the test: it stops the schedule at the first failure."""


def _then_version(workers: Workers, version: int):
    """After the first batch, the worker collects with ``version``."""
    call = workers.call

    def answer(worker_id: int, method: str, *args: object) -> torch.futures.Future:
        fut = call(worker_id, method, *args)
        if method == "collect":
            workers.versions[worker_id] = version
        return fut

    return answer


def _wider(workers: Workers):
    """Batches with one more key than before."""
    call = workers.call

    def answer(worker_id: int, method: str, *args: object) -> torch.futures.Future:
        fut = call(worker_id, method, *args)
        if method != "collect":
            return fut
        batch = fut.wait()
        batch.set("extra", torch.zeros(FRAMES))
        wider = torch.futures.Future()
        wider.set_result(batch)
        return wider

    return answer


def test_admitted_lag_zero_keeps_one_request_in_flight_and_the_workers_take_turns():
    """``max_policy_lag=0`` admitted: a batch asked while another is in flight could be handed out after it
    and its push, one version late, so each request waits for the hand-out before it; nothing is dropped."""
    f = front(2, sync=False, max_policy_lag=0, policy_lag_mode="admit")
    handed = []
    for _ in range(6):
        batch = f.schedule.collect()
        handed.append(int(batch.get(WORKER_ID)[0]))
        assert sum(record.outstanding for record in f.roster) <= 1
    assert handed == [0, 1, 0, 1, 0, 1]
    assert f.continuity.dropped_batches == 0
