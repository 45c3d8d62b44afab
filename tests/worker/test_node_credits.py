"""An async node's credits (:mod:`rpc_collectors.worker.node_credits`) against a model of its local front:
whatever order requests arrive in and local batches finish in, each request is answered in turn with the
batch asked for it, only after its weights were taken, and a local worker is never asked twice at once."""
from __future__ import annotations

import collections
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rpc_collectors.single_process.batch_record import WORKER_ID
from rpc_collectors.worker.node_credits import Credits


class LocalFront:
    """A local front asked on demand: ``schedule.ask(w)`` starts a batch of worker ``w``; ``next()`` hands out
    the batch of the busy worker ``finish()`` picks, stamped with its worker and the request's mark."""

    def __init__(self, finish) -> None:
        self.busy: dict[int, int] = {}
        self.asks = 0
        self.finish = finish
        self.schedule = SimpleNamespace(ask=self._ask)
        # the weights version the node's policy holds; the one each batch was asked with
        self.version = -1
        self.asked_with: list[int] = []

    def _ask(self, worker: int) -> None:
        assert worker not in self.busy, f"local worker {worker} asked while it collects"
        self.busy[worker] = self.asks
        self.asks += 1
        self.asked_with.append(self.version)

    def next(self) -> TensorDict:
        assert self.busy, "next() with no local batch asked: it would wait forever"
        worker = sorted(self.busy)[self.finish(len(self.busy))]
        mark = self.busy.pop(worker)
        return TensorDict({WORKER_ID: torch.full((2,), worker), "mark": torch.full((2,), mark)}, [2])


@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 4), data=st.data())
def test_each_request_gets_the_batch_asked_for_it_in_the_order_requests_came(workers, data):
    credits = Credits(workers)
    local = LocalFront(lambda busy: data.draw(st.integers(0, busy - 1)))
    # the trainer keeps at most one request per local worker in flight; the versions of every request sent
    in_flight: collections.deque[int] = collections.deque()
    sent, answered = [], []
    version = 0
    for _ in range(data.draw(st.integers(1, 25))):
        while len(in_flight) < workers and data.draw(st.booleans()):
            version += data.draw(st.integers(0, 1))
            credits.announce(version)
            in_flight.append(version)
            sent.append(version)
        if not in_flight:
            continue
        # the server applies the newest version announced before the node asks
        taken = credits.take()
        if taken is not None:
            local.version = max(local.version, taken)
        answered.append(int(credits.next(local)["mark"][0]))
        in_flight.popleft()
    # request k was answered with the k-th batch asked, whatever order the local batches finished in
    assert answered == list(range(len(answered)))
    # and each batch was asked with at least the weights its request named
    assert all(with_ >= wanted for with_, wanted in zip(local.asked_with, sent)), (local.asked_with, sent)
    assert local.asks <= len(sent)
