"""What a multi-worker collector does when a worker fails or a collector joins.

The front's waits raise :class:`~rpc_collectors.core.errors.Failure`; the front hands it to
:meth:`Recovery.recover` between waits, never from inside one. A failed worker is replaced
while ``max_worker_restarts`` lasts (same worker id, a fresh process, new trajectory ids,
its seed's sequence, the weights its slot holds and its batch slots); an elastic collector that
fails leaves its slot vacant for a spare or the next collector to join (:meth:`Recovery.admit`).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

from rpc_collectors.core.errors import Failure, WorkerError, remote_summary
from rpc_collectors.single_process.frame_ledger import Ledger
from rpc_collectors.trainer.batch_slots import BatchSlots
from rpc_collectors.trainer.plan import Plan
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.transport.membership import WorkerLeftWarning


class Recovery:
    """Restarts and elastic membership of one collector front.

    It replaces ``pool``'s workers (``roster``'s records) through ``waits``, and brings a new
    process where the others are: its spec (``plan.specs``), weights (``pusher``) and batch slots
    (``slots``); ``ledger`` is told what the process that ended stepped.
    What it tells the front: ``fail(error)`` shuts it down and hands back the error to raise;
    ``admitted(worker_id)`` and ``left(worker_id)``: a slot was taken or left (elastic);
    ``delivered_frames(worker_id)``: the frames the front counts of a worker, where a new process
    starts counting from. ``ready``: failures are recovered only once the collector is up.
    """

    def __init__(
        self, plan: Plan, roster: Roster, pool: Any, waits: Waits, pusher: WeightPusher,
        slots: BatchSlots, ledger: Ledger, *, fail: Callable[[BaseException], BaseException],
        admitted: Callable[[int], None], left: Callable[[int], None],
        delivered_frames: Callable[[int], int],
    ) -> None:
        self.plan, self.roster, self.pool, self.waits = plan, roster, pool, waits
        self.pusher, self.slots, self.ledger = pusher, slots, ledger
        self.fail, self.admitted, self.left = fail, admitted, left
        self.delivered_frames = delivered_frames
        self.ready = False

    def recover(self, failed: Failure) -> bool:
        """Replace ``failed``'s worker while the budget lasts (a replacement that fails too costs
        another restart), and return True; elastic: its slot falls vacant, False. Otherwise shut
        the collector down and raise the worker's :class:`WorkerError`."""
        if self.plan.elastic:
            self.leave(failed.worker_id, failed.reason + remote_summary(failed.remote))
            return False
        while True:
            self.waits.require_running()
            worker_id, record = failed.worker_id, self.roster[failed.worker_id]
            # a raise comes first
            reason = failed.reason if failed.remote or record.dead is None else record.dead
            # a raise: its traceback is in the error's message
            cause = None if failed.remote else failed.__cause__
            if not self.ready:
                # a worker that fails while the collector starts is not replaced
                error = self.error(worker_id, f"{reason} during start-up", failed.remote)
                raise self.fail(error) from cause
            if not self.roster.take(worker_id, reason + remote_summary(failed.remote)):
                raise self.fail(self.error(worker_id, reason, failed.remote)) from cause
            try:
                self._replace(worker_id)
                return True
            except Failure as again:
                failed = again
            # the replacement did not start
            except WorkerError as err:
                failed = Failure(worker_id, err.reason)

    def error(self, worker_id: int, reason: str, remote: str = "") -> WorkerError:
        """The :class:`WorkerError` of ``worker_id``, naming the process that served it."""
        info = self.roster[worker_id].info or self.pool.identity(worker_id)
        return WorkerError.from_info(worker_id, info, reason, remote)

    def _replace(self, worker_id: int) -> None:
        # first: a late death report of the old process is ignored from here on
        self.ledger.process_ended(worker_id, self.pool.replace(worker_id))
        self.roster.replaced(worker_id)
        self.set_up(worker_id)

    def set_up(self, worker_id: int) -> None:
        """Build the collector of the process that now serves ``worker_id`` (replaced or newly
        joined) and bring it where the others are: trajectory ids, seed, weights, batch slots.
        Only this worker's failure interrupts it (:class:`Failure`)."""
        pool, gather = self.pool, self.waits.gather
        start = self.roster.traj_id_start(worker_id)
        create = functools.partial(pool.create, worker_id, self.plan.specs[worker_id], start)
        info = gather({worker_id: create}, recover=False)[0]
        self.roster.served(worker_id, info)
        # the new process counts from 0
        self.roster[worker_id].uncounted = self.delivered_frames(worker_id)
        steps = []
        seed = self.roster.seed(worker_id)
        if seed is not None:
            steps.append(functools.partial(pool.calls.set_seed, worker_id, seed))
        if self.pusher.plane is not None:
            steps.append(functools.partial(pool.calls.join_weights, worker_id,
                                           self.pusher.plane.spec))
            # what its slot holds: its own weights, or the trainer's
            held = self.pusher.rejoin(worker_id)
            if held is not None:
                steps.append(functools.partial(pool.calls.receive_weights, worker_id, *held))
        for step in steps:
            gather({worker_id: step}, recover=False)
        self.slots.rejoin(worker_id)

    # ------------------------------------------------------------------ elastic membership
    def admit(self, rank: int) -> None:
        """Give collector ``rank`` a vacant slot (or keep it as a spare), set it up and tell the
        front (``admitted``); one that fails meanwhile
        leaves the slot vacant again."""
        worker_id = self.pool.assign(rank)
        if worker_id is None:
            return
        # a new generation: the slot's old answers are dropped
        self.roster.joining(worker_id)
        try:
            self.set_up(worker_id)
        except Failure as failed:
            self.leave(worker_id,
                       f"failed while it joined: {failed.reason}{remote_summary(failed.remote)}")
            return
        self.admitted(worker_id)

    def leave(self, worker_id: int, reason: str) -> None:
        """The collector in ``worker_id``'s slot failed: evict it; a spare, if any, takes the
        slot."""
        pool = self.pool
        self.waits.require_running()
        rank = pool.ranks[worker_id]
        self.roster.left_slot(worker_id)
        self.ledger.process_ended(worker_id, pool.stepped(worker_id))
        self.left(worker_id)
        pool.vacate(worker_id)
        warnings.warn(
            f"collector worker {worker_id} (rank {rank}) {reason}; its slot is vacant until a "
            f"collector joins (join_timeout={self.plan.join_timeout} s)",
            WorkerLeftWarning, stacklevel=5,
        )
        spare = pool.spare()
        if spare is not None:
            self.admit(spare)

    def no_collector(self) -> BaseException:
        """The error of an elastic collector that waited ``join_timeout`` for a collector to
        join."""
        vacant = [i for i in range(self.plan.num_workers) if not self.roster[i].serving]
        return self.fail(TimeoutError(
            f"no collector joined within join_timeout={self.plan.join_timeout} s while the trainer "
            f"waited (vacant collector slots: {vacant}); {self.pool.join_advice()}"
        ))
