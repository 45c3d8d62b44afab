"""What a multi-worker collector does when a worker fails or a collector joins.

The front's waits raise :class:`~rpc_collectors.core.errors.Failure`; the front hands it to
:meth:`Recovery.recover` between waits, never from inside one. A failed worker is replaced
while ``max_worker_restarts`` lasts (same worker id, a fresh process, new trajectory ids,
its seed's sequence, the weights its slot holds and its batch slots); an elastic collector that fails
leaves its slot vacant for a spare or the next collector to join (:meth:`Recovery.admit`).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Protocol

from rpc_collectors.core.errors import Failure, WorkerError, remote_summary
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.transport.membership import WorkerLeftWarning


class Recovered(Protocol):
    """What :class:`Recovery` uses of its collector front: its parts, and what it tells the front."""

    num_workers: int
    elastic: bool
    join_timeout: float
    ready: bool
    specs: list
    workers: Any
    roster: Roster
    continuity: Continuity
    pusher: WeightPusher
    gather: Callable[..., list]

    def require_running(self) -> None: ...

    def fail(self, error: BaseException) -> BaseException: ...

    def worker_error(self, worker_id: int, reason: str, remote: str = "") -> WorkerError: ...

    def _delivered_frames(self, worker: int) -> int: ...

    def rejoin_batches(self, worker_id: int) -> None: ...

    def admitted(self, worker_id: int) -> None: ...

    def left(self, worker_id: int) -> None: ...


class Recovery:
    """Restarts and elastic membership of one collector front."""

    def __init__(self, front: Recovered) -> None:
        self.front = front

    def recover(self, failed: Failure) -> bool:
        """Replace ``failed``'s worker while the budget lasts (a replacement that fails too costs
        another restart), and return True; elastic: its slot falls vacant, False. Otherwise shut
        the collector down and raise the worker's :class:`WorkerError`."""
        front = self.front
        if front.elastic:
            self.leave(failed.worker_id, failed.reason + remote_summary(failed.remote))
            return False
        while True:
            front.require_running()
            worker_id, record = failed.worker_id, front.roster[failed.worker_id]
            reason = failed.reason if failed.remote or record.dead is None else record.dead  # a raise comes first
            cause = None if failed.remote else failed.__cause__  # a raise: its traceback is in the error's message
            if not front.ready:  # a worker that fails while the collector starts is not replaced
                raise front.fail(front.worker_error(worker_id, f"{reason} during start-up", failed.remote)) from cause
            if not front.roster.take(worker_id, reason + remote_summary(failed.remote)):
                raise front.fail(front.worker_error(worker_id, reason, failed.remote)) from cause
            try:
                self._replace(worker_id)
                return True
            except Failure as again:
                failed = again
            except WorkerError as err:  # the replacement did not start
                failed = Failure(worker_id, err.reason)

    def _replace(self, worker_id: int) -> None:
        front = self.front
        front.workers.replace(worker_id)  # first: a late death report of the old process is ignored from here on
        front.roster.replaced(worker_id)
        self.set_up(worker_id)

    def set_up(self, worker_id: int) -> None:
        """Build the collector of the process that now serves ``worker_id`` (replaced or newly
        joined) and bring it where the others are: trajectory ids, seed, weights, batch slots.
        Only this worker's failure interrupts it (:class:`Failure`)."""
        front, pool = self.front, self.front.workers
        start = front.roster.traj_id_start(worker_id)
        create = functools.partial(pool.create, worker_id, front.specs[worker_id], start)
        info = front.gather({worker_id: create}, recover=False)[0]
        front.roster.served(worker_id, info)
        front.roster[worker_id].uncounted = front._delivered_frames(worker_id)  # the new process counts from 0
        steps = []
        seed = front.roster.seed(worker_id)
        if seed is not None:
            steps.append(functools.partial(pool.calls.set_seed, worker_id, seed))
        if front.pusher.plane is not None:
            steps.append(functools.partial(pool.calls.join_weights, worker_id, front.pusher.plane.spec))
            held = front.pusher.rejoin(worker_id)  # what its slot holds: its own weights, or the trainer's
            if held is not None:
                steps.append(functools.partial(pool.calls.receive_weights, worker_id, *held))
        for step in steps:
            front.gather({worker_id: step}, recover=False)
        front.rejoin_batches(worker_id)

    # ------------------------------------------------------------------ elastic membership
    def admit(self, rank: int) -> None:
        """Give collector ``rank`` a vacant slot (or keep it as a spare), set it up and tell the
        front (``admitted``); one that fails meanwhile
        leaves the slot vacant again."""
        front = self.front
        worker_id = front.workers.assign(rank)
        if worker_id is None:
            return
        front.roster.joining(worker_id)  # a new generation: the slot's old answers are dropped
        try:
            self.set_up(worker_id)
        except Failure as failed:
            self.leave(worker_id, f"failed while it joined: {failed.reason}{remote_summary(failed.remote)}")
            return
        front.admitted(worker_id)

    def leave(self, worker_id: int, reason: str) -> None:
        """The collector in ``worker_id``'s slot failed: evict it; a spare, if any, takes the slot."""
        front, pool = self.front, self.front.workers
        front.require_running()
        rank = pool.ranks[worker_id]
        front.roster.left_slot(worker_id)
        front.left(worker_id)
        pool.vacate(worker_id)
        warnings.warn(
            f"collector worker {worker_id} (rank {rank}) {reason}; its slot is vacant until a collector joins "
            f"(join_timeout={front.join_timeout} s)",
            WorkerLeftWarning, stacklevel=5,
        )
        spare = pool.spare()
        if spare is not None:
            self.admit(spare)

    def no_collector(self) -> BaseException:
        """The error of an elastic collector that waited ``join_timeout`` for a collector to join."""
        front = self.front
        vacant = [i for i in range(front.num_workers) if not front.roster[i].serving]
        return front.fail(TimeoutError(
            f"no collector joined within join_timeout={front.join_timeout} s while the trainer waited "
            f"(vacant collector slots: {vacant}); {front.workers.join_advice()}"
        ))
