"""The front's continuity part and worker records on their own, without processes: which answers a
cut makes stale, what is counted as dropped, and what a replacement or a vacated slot is asked again."""
from __future__ import annotations

import torch
from tensordict import TensorDict

from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.single_process.batch_record import WORKER_ID
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.roster import WorkerRecord


class Front:
    """The workers of a front, each served by a process; every ``cut`` they are told is recorded."""

    def __init__(self, n: int) -> None:
        self.num_workers = n
        self.roster = [WorkerRecord(info={}) for _ in range(n)]
        self.cuts: list[tuple[int, int]] = []
        self.deferred = WorkerCalls(self._send)

    def _send(self, worker_id: int, method: str, *args: int):
        assert method == "cut"
        return lambda: self.cuts.append((worker_id, *args))

    def gather(self, calls: dict) -> list:
        return [calls[i]() for i in sorted(calls)]


def ask(record: WorkerRecord, times: int) -> None:
    for _ in range(times):
        record.asked()


def batch_of(worker_id: int, frames: int) -> TensorDict:
    return TensorDict({WORKER_ID: torch.full((frames,), worker_id)}, [frames])


def test_the_answers_asked_before_a_cut_are_dropped_and_counted():
    front = Front(2)
    ask(front.roster[0], 3)  # three batches asked of worker 0
    front.roster[0].answered()  # one of them handed out
    continuity = Continuity(front.roster, front, None)
    continuity.cut([0])
    assert front.cuts == [(0, 1)]  # the cut follows its first answer
    ask(front.roster[1], 1)
    assert [front.roster[0].answered() for _ in range(3)] == [False, False, True] and front.roster[1].answered()
    for _ in range(2):
        continuity.stale(batch_of(0, 4))
    assert (continuity.dropped_frames, continuity.dropped_batches) == (8, 2)


def test_a_dropped_batch_cuts_the_streams_of_the_workers_in_it():
    front = Front(3)
    front.roster[2].vacated()  # a vacant slot is told nothing
    continuity = Continuity(front.roster, front, None)
    batch = torch.cat([batch_of(0, 2), batch_of(2, 3)])
    continuity.drop(batch)
    assert front.cuts == [(0, 0)] and (continuity.dropped_frames, continuity.dropped_batches) == (5, 1)
    continuity.count(7, 2)  # a node's own drops, told with its answer
    assert (continuity.dropped_frames, continuity.dropped_batches) == (12, 3)


def test_a_replacement_answers_nothing_stale_and_a_resume_makes_every_answer_in_flight_stale():
    front = Front(2)
    ask(front.roster[0], 2)
    ask(front.roster[1], 1)
    Continuity(front.roster, front, None).resumed()
    assert [record.stale for record in front.roster] == [2, 1]
    front.roster[0].replaced()
    assert [record.stale for record in front.roster] == [0, 1]


def test_a_replaced_worker_is_asked_again_what_its_predecessor_left_and_a_vacated_slot_nothing():
    record = WorkerRecord(info={"envs": 1})
    ask(record, 2)
    generation = record.generation
    record.replaced()
    assert record.generation == generation + 1 and record.redo == 2 and record.outstanding == 0 and record.info is None
    record.asked(again=True)
    assert record.redo == 1 and record.outstanding == 1 and record.serving_since is not None
    record.vacated()
    assert record.redo == 0 and record.outstanding == 0 and record.generation == generation + 2
