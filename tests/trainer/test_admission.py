"""``policy_lag_mode="admit"``'s rule (:mod:`rpc_collectors.trainer.admission`), as a property.

A run of N workers is played out as the async schedule plays it (``trainer/schedule.py``): each
worker is asked up to its depth, requests wait until admitted, batches come back in any order
hypothesis picks, each with weights between those sent when it was asked and those its worker
holds when it comes, and after each batch handed out the trainer may push. Whatever the order:
every batch handed out is within the bound, none is dropped, the run never stalls with nothing
asked, and each worker's batches are handed out in the order they were collected.
"""
from __future__ import annotations

from collections import deque

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rpc_collectors.trainer.admission import Admission


class Run:
    """The trainer's version, what each worker was sent, its unanswered requests, and the queue."""

    def __init__(self, workers: int, bound: int) -> None:
        self.admission, self.version = Admission(bound), 0
        self.sent = [0] * workers
        self.unanswered: list[deque] = [deque() for _ in range(workers)]
        self.waiting: deque = deque()
        self.collected = [0] * workers
        self.handed: list[tuple[int, int, int]] = []

    def ask(self, worker: int, handed_out: bool = False) -> None:
        self.waiting.append(worker)
        self.admit(int(handed_out))

    def admit(self, pushes_due: int = 0) -> None:
        admission, version = self.admission, self.version
        while self.waiting:
            worker = self.waiting[0]
            if not admission.admits(self.sent[worker], version + pushes_due):
                if not admission.admits(version, version + pushes_due):
                    return
                self.sent[worker] = version
            self.waiting.popleft()
            admission.asked(worker, self.sent[worker])
            self.unanswered[worker].append(self.sent[worker])

    def hand_out(self, worker: int, w: int, order: int) -> None:
        self.handed.append((worker, self.version - w, order))


@settings(max_examples=150, deadline=None)
@given(workers=st.integers(1, 5), depth=st.integers(1, 2), bound=st.integers(0, 4), data=st.data())
def test_every_batch_handed_out_is_within_the_bound_and_none_is_dropped(workers, depth, bound, data):
    run = Run(workers, bound)
    for worker in range(workers):
        for _ in range(depth):
            run.ask(worker)
    while len(run.handed) < 25:
        run.admit()
        held = run.admission.next_held(run.version)
        if held is not None:
            run.admission.gone(held)
            run.hand_out(held.worker_id, held.w, int(held.batch["order"]))
        else:
            asked = [worker for worker in range(workers) if run.unanswered[worker]]
            assert asked, "nothing is asked, nothing held may go: the run would stall"
            worker = data.draw(st.sampled_from(asked))
            w = data.draw(st.integers(run.unanswered[worker].popleft(), run.sent[worker]))
            order, run.collected[worker] = run.collected[worker], run.collected[worker] + 1
            entry = run.admission.came(worker, w)
            if not run.admission.may_hand_out(entry, run.version):
                run.admission.hold(entry, TensorDict({"order": torch.tensor(order)}, []))
                run.ask(worker)
                continue
            run.admission.gone(entry)
            run.hand_out(worker, entry.w, order)
            # the worker is asked again while the trainer trains
            run.ask(worker, handed_out=True)
        if data.draw(st.booleans()):
            run.version += 1
            run.sent = [run.version] * workers
    assert all(0 <= lag <= bound for _, lag, _ in run.handed), run.handed
    for worker in range(workers):
        orders = [order for w, _, order in run.handed if w == worker]
        assert orders == sorted(orders), (worker, orders)


def test_a_request_that_would_overstep_the_bound_waits_and_the_oldest_batch_may_always_go():
    admission = Admission(bound=1)
    admission.asked(0, w=0)
    admission.asked(1, w=0)
    # a third batch of version 0 could be handed out after two pushes
    assert not admission.admits(0, version=0)
    first = admission.came(1, 0)
    # after it and one push, worker 0's batch would still be within 1
    assert admission.may_hand_out(first, version=0)
    admission.gone(first)
    second = admission.came(0, 0)
    assert admission.may_hand_out(second, version=1)
