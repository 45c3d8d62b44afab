"""The request/wait loop of a collector front, and its sync and async schedules.

Sync: every worker is asked for a batch and the round's answers are combined in the class's
layout (``cat_results``); with ``preemptive_threshold`` the others are stopped once enough handed
in. Async: each worker keeps its request depth in flight, and the first batch ready is handed out,
unless :mod:`.continuity` drops it (asked before a cut of its worker's stream, or, with
``policy_lag_mode="drop"``, too far behind the trainer's weights: ``max_policy_lag``); with
``policy_lag_mode="admit"`` :mod:`.admission` decides when a request is asked and when a batch
that came may be handed out, so that none falls behind. Every answer arrives through the front's one
:class:`~rpc_collectors.trainer.waits.Events`; a failed worker raises
:class:`~rpc_collectors.core.errors.Failure`, which
:class:`~rpc_collectors.trainer.recovery.Recovery` handles before the loop asks again.
:class:`Schedule` owns the state of the loop: the sync round in progress, the async worker whose
batch the trainer holds, the elastic run's batch layout.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch
from tensordict import TensorDictBase

from rpc_collectors.core.errors import Failure
from rpc_collectors.single_process import preemption
from rpc_collectors.single_process.batch_record import oldest_version
from rpc_collectors.single_process.frame_ledger import Ledger
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer import node_restarts
from rpc_collectors.trainer.admission import Admission
from rpc_collectors.trainer.batch_slots import BatchSlots
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.plan import Plan
from rpc_collectors.trainer.recovery import Recovery
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import BATCH, Answer, Events, Joined, Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.transport import layouts


class Schedule:
    """The batch requests of one collector front and the order its batches are handed out in.

    It asks ``pool``'s workers (``roster``'s records) for batches into ``slots``, takes their
    answers from ``events``, waits through ``waits``, pushes weights due through ``pusher``, drops
    through ``continuity``, recovers through ``recovery`` and counts each answer's frames into
    ``ledger``; ``plan`` holds the run's options.
    ``fail(error)`` shuts the front down and hands back the error to raise.
    """

    def __init__(
        self, plan: Plan, roster: Roster, events: Events, waits: Waits, pool: Any,
        pusher: WeightPusher, slots: BatchSlots, continuity: Continuity, recovery: Recovery,
        ledger: Ledger, fail: Callable[[BaseException], BaseException],
        meter: RunMeter | None = None,
    ) -> None:
        self.plan, self.roster, self.events, self.waits = plan, roster, events, waits
        self.pool = pool
        # the option groups it reads (Plan's properties would put plan.py on a batch's path)
        options = plan.options
        self.run, self.weights, self.launch = options.run, options.weights, options.launch
        self.pusher, self.slots, self.continuity = pusher, slots, continuity
        self.recovery, self.ledger, self.fail = recovery, ledger, fail
        # its spans: "wait", "hand-out"
        self.meter = meter if meter is not None else RunMeter(on=False)
        # the answers of a sync round in progress
        self.round: dict[int, Any] | None = None
        # async: the worker whose batch the trainer holds
        self.last_async: int | None = None
        # elastic: keys, shapes and dtypes of the run's first batch
        self.layout: dict | None = None
        # async, policy_lag_mode="admit": the batches in flight, and the requests not yet admitted
        self.admission = Admission(self.run.max_policy_lag) if self.run.admits else None
        self.waiting: list[int] = []
        # async, a node's local front under its trainer's admission: a worker is asked only by
        # ask(), one batch per request of the trainer (worker.node_credits)
        self.on_demand = False

    # ---------------------------------------------------------------- the loop
    def deadline(self) -> float:
        """Until when to wait for the next batch: each outstanding request's answer within
        rpc_timeout of when its worker began on it (async too: one worker's answers never cover
        another's silence); with none outstanding (elastic, vacant slots), a collector within
        join_timeout."""
        oldest = self.waits.batch_deadline()
        if oldest is not None:
            return oldest[0]
        if not self.launch.elastic:
            return self.waits.deadline()
        return time.monotonic() + self.launch.join_timeout

    def next_batch(self) -> tuple[int, Any, bool]:
        """The next worker's batch answer (worker id, batch or ``Ready``, and False if it was asked
        before the worker's stream was cut); collectors that join meanwhile (elastic) are admitted.
        Deaths and timeouts raise :class:`Failure`."""
        deadline = self.deadline()
        while True:
            waited = self.meter.span_start()
            item = self.events.take(
                lambda e: isinstance(e, Joined) or (isinstance(e, Answer) and e.tag == BATCH),
                deadline, self.waits.check)
            self.meter.span_end("wait", waited, answered=getattr(item, "worker_id", None))
            if item is None:
                oldest = self.waits.batch_deadline()
                if oldest is None:
                    raise self.recovery.no_collector()
                raise self.waits.late(oldest[1])
            if isinstance(item, Joined):
                self.recovery.admit(item.rank)
                deadline = self.deadline()
                continue
            record = self.roster[item.worker_id]
            if item.generation != record.generation:
                # the answer of a replaced worker
                continue
            # a failure leaves it asked: its replacement redoes it
            result = self.waits.result(item.worker_id, item.fut)
            fresh = record.answered()
            # a node: its local restarts and own drops come with its answers
            if record.info and "local_pids" in record.info:
                result, dropped = node_restarts.answer_of(record, item.worker_id, result)
                self.continuity.count(dropped.frames, dropped.batches)
                self.ledger.took(item.worker_id, dropped.frames)
            if self.launch.elastic:
                self._same_layout(item.worker_id, result)
            return item.worker_id, result, fresh

    def _same_layout(self, worker_id: int, result: Any) -> None:
        """Elastic: a member whose batch does not match the run's first one (keys, shapes,
        dtypes) fails, so its slot falls vacant, instead of mixing layouts in the run."""
        # in its own slots, laid out from its first batch
        if not isinstance(result, TensorDictBase):
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
        while True:
            try:
                return self.next_batch()
            except Failure as failed:
                self.recovery.recover(failed)
                for worker_id, record in enumerate(self.roster):
                    if record.redo and self.admission is not None:
                        self.admission.forget(worker_id)
                    for _ in range(record.redo):
                        self._asked(worker_id, self.request(worker_id))

    def request(self, worker_id: int, again: bool = False) -> bool:
        """Ask ``worker_id`` for its next batch (``again``, or a request its predecessor left:
        into the same slot); a vacant elastic slot is asked once a collector takes it (False)."""
        plan, record = self.plan, self.roster[worker_id]
        if not record.serving:
            return False
        again = again or record.redo > 0
        due = record.weights_due(plan.update_after_each_batch,
                                 self.weights.max_weight_update_interval)
        if not again and self.pusher.plane is not None and due:
            self.pusher.push(list(range(plan.num_workers)) if self.run.sync else [worker_id])
        slot = self.slots.plane.slot_for(worker_id, again)
        # a worker with slots is rung; any other asked by a call
        fut = self.slots.plane.ring(worker_id, record.weights_version, slot)
        if fut is None:
            fut = self.pool.calls.collect(worker_id, record.weights_version, slot)
        self.roster.asked(worker_id, max(plan.frames_per_batch_worker), again)
        self.events.watch(worker_id, record.generation, BATCH, fut)
        return True

    def _ask(self, worker_id: int, handed_out: bool = False) -> None:
        """Async: ask ``worker_id`` for a batch, once :mod:`.admission` lets the request in;
        ``handed_out``: a batch was just handed out, so the trainer's push after it is counted."""
        if self.admission is None:
            self.request(worker_id)
            return
        self.waiting.append(worker_id)
        self._admit_waiting(int(handed_out))

    def _admit_waiting(self, pushes_due: int = 0) -> None:
        """Ask the waiting requests that admission lets in, in the order they came, as if
        ``pushes_due`` more pushes came first; one whose worker holds weights too old for it gets
        the trainer's first."""
        admission, version = self.admission, self.pusher.version
        while self.waiting:
            record = self.roster[self.waiting[0]]
            if record.serving and not admission.admits(record.weights_version,
                                                       version + pushes_due):
                if self.pusher.plane is None or not admission.admits(version,
                                                                     version + pushes_due):
                    return
                self.pusher.push([self.waiting[0]], version=version)
            worker_id = self.waiting.pop(0)
            self._asked(worker_id, self.request(worker_id))

    def _asked(self, worker_id: int, asked: bool) -> None:
        if asked and self.admission is not None:
            self.admission.asked(worker_id, self.roster[worker_id].weights_version)

    # ---------------------------------------------------------------- membership
    def admitted(self, worker_id: int) -> None:
        """A collector took ``worker_id``'s slot: a sync round that waits for the slot asks it at
        once."""
        if self.round is not None and worker_id not in self.round:
            self.request(worker_id, again=True)
        elif self.round is None and not self.run.sync:
            self._ask(worker_id)

    def left(self, worker_id: int) -> None:
        """The collector in ``worker_id``'s slot left (elastic)."""
        if self.last_async == worker_id:
            self.last_async = None
        if self.admission is not None:
            self.admission.forget(worker_id)

    # ---------------------------------------------------------------- schedules
    def collect(self) -> TensorDictBase:
        """The next batch: a sync round's, or the first async batch kept."""
        return self._round() if self.run.sync else self._first_ready()

    def _round(self) -> TensorDictBase:
        plan = self.plan
        for worker_id in range(plan.num_workers):
            self.request(worker_id)
        self.round = results = {}
        try:
            while len(results) < plan.num_workers:
                if len(results) == plan.preempt_after:
                    self._preempt([i for i in range(plan.num_workers) if i not in results])
                # a sync round asks nothing before a cut
                worker_id, result, _ = self.next_answer()
                results[worker_id] = result
        finally:
            self.round = None
        handing = self.meter.span_start()
        batch = self._combine([results[i] for i in range(plan.num_workers)])
        batch = batch if plan.preempt_after is None else self._without_padding(batch)
        self.meter.span_end("hand-out", handing)
        return batch

    def ask(self, worker_id: int) -> None:
        """On demand: ask ``worker_id`` for one batch now."""
        self._asked(worker_id, self.request(worker_id))

    def _first_ready(self) -> TensorDictBase:
        if self.on_demand:
            return self._next_kept()
        if self.last_async is not None:
            # after the trainer's step, with fresh weights if asked
            self._ask(self.last_async)
        for worker_id in range(self.plan.num_workers):
            if worker_id != self.last_async:
                missing = self.slots.plane.depth(worker_id) - self.roster[worker_id].outstanding
                for _ in range(missing - self.waiting.count(worker_id)):
                    self._ask(worker_id)
        batch = self._next_kept()
        if not self.plan.update_after_each_batch and self.last_async is not None:
            # keep the worker busy while the trainer works
            self._ask(self.last_async, handed_out=True)
            self.last_async = None
        return batch

    def _next_kept(self) -> TensorDictBase:
        """The next async batch not dropped (:mod:`.continuity`): one asked before its worker's
        stream was cut, or collected with weights more than ``max_policy_lag`` behind."""
        continuity, pusher, admission = self.continuity, self.pusher, self.admission
        bounded = self.run.max_policy_lag is not None
        while True:
            if admission is not None:
                self._admit_waiting()
                held = admission.next_held(pusher.version)
                if held is not None:
                    admission.gone(held)
                    # its worker was asked again when its batch was held
                    self.last_async = None
                    return held.batch
            self.last_async, result, fresh = self.next_answer()
            handing = self.meter.span_start()
            worker_id, batch = self.last_async, self._receive(self.last_async, result)
            self.meter.span_end("hand-out", handing, worker=worker_id)
            entry = None if admission is None else admission.came(worker_id, oldest_version(batch))
            if not fresh:
                continuity.stale(batch)
            elif not bounded or not continuity.too_old(batch, pusher.version):
                if entry is None or admission.may_hand_out(entry, pusher.version):
                    if entry is not None:
                        admission.gone(entry)
                    return batch
                admission.hold(entry, batch)
                entry = None
            else:
                if continuity.left_behind(worker_id, pusher.version):
                    pusher.push([worker_id], version=pusher.version)
                continuity.drop(batch, [worker_id])
            if entry is not None:
                admission.gone(entry)
            self._ask(worker_id)

    def _preempt(self, worker_ids: list[int]) -> None:
        """Ask ``worker_ids`` to end the batch in progress at their next step (not waited for: a
        worker that died meanwhile shows in the round's wait)."""
        for worker_id in worker_ids:
            if self.roster[worker_id].serving:
                self.pool.calls.preempt(worker_id, self.roster[worker_id].requests)

    def _without_padding(self, batch: TensorDictBase) -> TensorDictBase:
        """As TorchRL: concatenated along time (``cat_results=-1``, or 0 over ``[T]`` batches),
        the steps a preempted worker did not collect are dropped; stacked, its mask marks them."""
        cat_results = self.plan.cat_results
        if cat_results == -1 or (cat_results == 0 and batch.batch_dims == 1):
            return preemption.drop_padding(batch)
        return batch

    def _receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch of a worker's answer, labelled with its worker id."""
        batch = self._plane_call(self.slots.plane.receive, worker_id, result)
        batch.set(layouts.WORKER_ID, torch.full(batch.shape, worker_id, dtype=torch.int64))
        self.ledger.took(worker_id, preemption.valid_frames(batch))
        return batch

    def _combine(self, results: list) -> TensorDictBase:
        # the round where the workers wrote it
        stacked = self._plane_call(self.slots.plane.round, results)
        if stacked is None:
            return layouts.combine([self._receive(i, r) for i, r in enumerate(results)],
                                   self.plan.cat_results)
        for worker_id, frames in enumerate(preemption.row_frames(stacked)):
            self.ledger.took(worker_id, frames)
        return layouts.lay_out(stacked, self.plan.cat_results)

    def _plane_call(self, method: Callable[..., Any], *args: Any) -> Any:
        """A call of the batch plane (:meth:`.BatchSlots.call`, here: a batch's path stays in this
        module)."""
        try:
            return method(*args)
        except OSError as err:
            raise self.fail(err) from None

