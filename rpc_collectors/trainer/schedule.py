"""The request/wait loop of a collector front, and its sync and async schedules.

Sync: every worker is asked for a batch and the round's answers are combined in the class's
layout (``cat_results``); with ``preemptive_threshold`` the others are stopped once enough handed in.
Async: each worker keeps its request depth in flight, and the first batch ready is handed out,
unless :mod:`.continuity` drops it (asked before a cut of its worker's stream, or too far behind
the trainer's weights: ``max_policy_lag``). Every answer arrives through the front's one
:class:`~rpc_collectors.trainer.waits.Events`; a failed worker raises
:class:`~rpc_collectors.core.errors.Failure`, which :class:`~rpc_collectors.trainer.recovery.Recovery`
handles before the loop asks again. :class:`Schedule` owns the state of the loop: the sync round in
progress, the async worker whose batch the trainer holds, the elastic run's batch layout.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import torch
from tensordict import TensorDictBase

from rpc_collectors.core.errors import Failure
from rpc_collectors.single_process import preemption
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer import node_restarts
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.recovery import Recovery
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import BATCH, Answer, Events, Joined, Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.transport import layouts
from rpc_collectors.transport.data import BatchPlane


class Scheduled(Protocol):
    """What :class:`Schedule` uses of its collector front: the run's settings and the front's parts."""

    num_workers: int
    sync: bool
    elastic: bool
    join_timeout: float
    cat_results: str | int
    preempt_after: int | None
    max_policy_lag: int | None
    update_after_each_batch: bool
    max_weight_update_interval: int
    workers: Any
    roster: Roster
    events: Events
    waits: Waits
    recovery: Recovery
    continuity: Continuity
    pusher: WeightPusher
    _batches: BatchPlane | None

    def data_plane_call(self, method: Callable[..., Any], *args: Any) -> Any: ...

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int: ...


class Schedule:
    """The batch requests of one collector front and the order its batches are handed out in."""

    def __init__(self, front: Scheduled, meter: RunMeter | None = None) -> None:
        self.front = front
        self.meter = meter if meter is not None else RunMeter(on=False)  # its spans: "wait", "hand-out"
        self.round: dict[int, Any] | None = None  # the answers of a sync round in progress
        self.last_async: int | None = None  # async: the worker whose batch the trainer holds
        self.layout: dict | None = None  # elastic: keys, shapes and dtypes of the run's first batch

    # ---------------------------------------------------------------- the loop
    def deadline(self) -> float:
        """Until when to wait for the next batch: each outstanding request's answer within rpc_timeout
        of when its worker began on it (async too: one worker's answers never cover another's silence);
        with none outstanding (elastic, vacant slots), a collector within join_timeout."""
        front = self.front
        oldest = front.waits.batch_deadline()
        if oldest is not None:
            return oldest[0]
        return front.waits.deadline() if not front.elastic else time.monotonic() + front.join_timeout

    def next_batch(self) -> tuple[int, Any, bool]:
        """The next worker's batch answer (worker id, batch or ``Ready``, and False if it was asked
        before the worker's stream was cut); collectors that join meanwhile (elastic) are admitted.
        Deaths and timeouts raise :class:`Failure`."""
        front = self.front
        deadline = self.deadline()
        while True:
            waited = self.meter.span_start()
            item = front.events.take(lambda e: isinstance(e, Joined) or (isinstance(e, Answer) and e.tag == BATCH),
                                     deadline, front.waits.check)
            self.meter.span_end("wait", waited, answered=getattr(item, "worker_id", None))
            if item is None:
                oldest = front.waits.batch_deadline()
                if oldest is None:
                    raise front.recovery.no_collector()
                raise front.waits.late(oldest[1])
            if isinstance(item, Joined):
                front.recovery.admit(item.rank)
                deadline = self.deadline()
                continue
            record = front.roster[item.worker_id]
            if item.generation != record.generation:
                continue  # the answer of a replaced worker
            result = front.waits.result(item.worker_id, item.fut)  # a failure leaves it asked: its replacement redoes it
            fresh = record.answered()
            if record.info and "local_pids" in record.info:  # a node: its local restarts and own drops come with its answers
                result, dropped = node_restarts.answer_of(record, item.worker_id, result)
                front.continuity.count(dropped.frames, dropped.batches)
            if front.elastic:
                self._same_layout(item.worker_id, result)
            return item.worker_id, result, fresh

    def _same_layout(self, worker_id: int, result: Any) -> None:
        """Elastic: a member whose batch does not match the run's first one (keys, shapes,
        dtypes) fails, so its slot falls vacant, instead of mixing layouts in the run."""
        if not isinstance(result, TensorDictBase):  # in its own slots, laid out from its first batch
            return
        signature = layouts.signature_of(result)
        if self.layout is None:
            self.layout = signature
        differs = layouts.difference(signature, self.layout) if signature and self.layout else ""
        if differs:
            raise Failure(worker_id, f"delivered a batch unlike the run's: {differs}")

    def next_answer(self) -> tuple[int, Any, bool]:
        """:meth:`next_batch`, recovering failed workers; a replacement is asked what its
        predecessor left unanswered."""
        front = self.front
        while True:
            try:
                return self.next_batch()
            except Failure as failed:
                front.recovery.recover(failed)
                for worker_id, record in enumerate(front.roster):
                    for _ in range(record.redo):
                        self.request(worker_id)

    def request(self, worker_id: int, again: bool = False) -> None:
        """Ask ``worker_id`` for its next batch (``again``, or a request its predecessor left:
        into the same slot); a vacant elastic slot is asked once a collector takes it."""
        front, record = self.front, self.front.roster[worker_id]
        if not record.serving:
            return
        again = again or record.redo > 0
        if not again and front.pusher.plane is not None and record.weights_due(
                front.update_after_each_batch, front.max_weight_update_interval):
            front.pusher.push(list(range(front.num_workers)) if front.sync else [worker_id])
        slot = front._batches.slot_for(worker_id, again)
        fut = front._batches.ring(worker_id, record.weights_version, slot)  # a worker with slots
        if fut is None:
            fut = front.workers.calls.collect(worker_id, record.weights_version, slot)
        front.roster.asked(worker_id, front.frames_per_batch_worker(), again)
        front.events.watch(worker_id, record.generation, BATCH, fut)

    # ---------------------------------------------------------------- membership
    def admitted(self, worker_id: int) -> None:
        """A collector took ``worker_id``'s slot: a sync round that waits for the slot asks it at once."""
        if self.round is not None and worker_id not in self.round:
            self.request(worker_id, again=True)
        elif self.round is None and not self.front.sync:
            self.request(worker_id)

    def left(self, worker_id: int) -> None:
        """The collector in ``worker_id``'s slot left (elastic)."""
        if self.last_async == worker_id:
            self.last_async = None

    # ---------------------------------------------------------------- schedules
    def collect(self) -> TensorDictBase:
        """The next batch: a sync round's, or the first async batch kept."""
        return self._round() if self.front.sync else self._first_ready()

    def _round(self) -> TensorDictBase:
        front = self.front
        for worker_id in range(front.num_workers):
            self.request(worker_id)
        self.round = results = {}
        try:
            while len(results) < front.num_workers:
                if len(results) == front.preempt_after:
                    self._preempt([i for i in range(front.num_workers) if i not in results])
                worker_id, result, _ = self.next_answer()  # a sync round asks nothing before a cut
                results[worker_id] = result
        finally:
            self.round = None
        handing = self.meter.span_start()
        batch = self._combine([results[i] for i in range(front.num_workers)])
        batch = batch if front.preempt_after is None else self._without_padding(batch)
        self.meter.span_end("hand-out", handing)
        return batch

    def _first_ready(self) -> TensorDictBase:
        front = self.front
        if self.last_async is not None:
            self.request(self.last_async)  # after the trainer's step, with fresh weights if asked
        for worker_id in range(front.num_workers):
            if worker_id != self.last_async:
                for _ in range(front._batches.depth(worker_id) - front.roster[worker_id].outstanding):
                    self.request(worker_id)
        batch = self._next_kept()
        if not front.update_after_each_batch:
            self.request(self.last_async)  # keep the worker busy while the trainer works
            self.last_async = None
        return batch

    def _next_kept(self) -> TensorDictBase:
        """The next async batch not dropped (:mod:`.continuity`): one asked before its worker's stream
        was cut, or collected with weights more than ``max_policy_lag`` behind."""
        continuity, pusher, bounded = self.front.continuity, self.front.pusher, self.front.max_policy_lag is not None
        while True:
            self.last_async, result, fresh = self.next_answer()
            handing = self.meter.span_start()
            worker_id, batch = self.last_async, self._receive(self.last_async, result)
            self.meter.span_end("hand-out", handing, worker=worker_id)
            if not fresh:
                continuity.stale(batch)
            elif not bounded or not continuity.too_old(batch, pusher.version):
                return batch
            else:
                if continuity.left_behind(worker_id, pusher.version):
                    pusher.push([worker_id], version=pusher.version)
                continuity.drop(batch, [worker_id])
            self.request(worker_id)

    def _preempt(self, worker_ids: list[int]) -> None:
        """Ask ``worker_ids`` to end the batch in progress at their next step (not waited for: a
        worker that died meanwhile shows in the round's wait)."""
        front = self.front
        for worker_id in worker_ids:
            if front.roster[worker_id].serving:
                front.workers.calls.preempt(worker_id, front.roster[worker_id].requests)

    def _without_padding(self, batch: TensorDictBase) -> TensorDictBase:
        """As TorchRL: concatenated along time (``cat_results=-1``, or 0 over ``[T]`` batches),
        the steps a preempted worker did not collect are dropped; stacked, its mask marks them."""
        cat_results = self.front.cat_results
        if cat_results == -1 or (cat_results == 0 and batch.batch_dims == 1):
            return preemption.drop_padding(batch)
        return batch

    def _receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch of a worker's answer, labelled with its worker id."""
        batch = self.front.data_plane_call(self.front._batches.receive, worker_id, result)
        batch.set(layouts.WORKER_ID, torch.full(batch.shape, worker_id, dtype=torch.int64))
        return batch

    def _combine(self, results: list) -> TensorDictBase:
        front = self.front
        stacked = front.data_plane_call(front._batches.round, results)  # the round where the workers wrote it
        if stacked is None:
            return layouts.combine([self._receive(i, r) for i, r in enumerate(results)], front.cat_results)
        return layouts.lay_out(stacked, front.cat_results)
