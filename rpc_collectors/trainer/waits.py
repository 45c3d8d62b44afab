"""How a collector front waits on its workers' calls: every wait through its one
:class:`~rpc_collectors.trainer.events.Events`, bounded by ``rpc_timeout``, raising
:class:`~rpc_collectors.core.errors.Failure` for a worker that died, raised or did not answer."""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

from rpc_collectors.core.errors import Failure
from rpc_collectors.core.futures import outcome
from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.trainer.events import Answer, Events
from rpc_collectors.trainer.roster import WorkerRecord

TIMEOUT_MARGIN = 1.0  # seconds past rpc_timeout before a wait gives up (a pool's own timeout comes first)
Call = Callable[[], torch.futures.Future]  # a request to one worker, that can be sent again


class Waits:
    """The waits of one front: on ``roster``'s workers in ``pool``, through ``events``.

    ``require_running()`` raises once the front shuts down; ``recover(failure)`` replaces a failed
    worker (True), lets an elastic one leave (False) or raises its WorkerError. ``deferred``: the
    workers' calls (:mod:`~rpc_collectors.core.protocol`), each a :data:`Call` that :meth:`gather` sends.
    """

    def __init__(
        self, events: Events, roster: list[WorkerRecord], pool: Any, rpc_timeout: float,
        require_running: Callable[[], None], recover: Callable[[Failure], bool],
    ) -> None:
        self.events, self.roster, self.pool, self.rpc_timeout = events, roster, pool, rpc_timeout
        self.require_running, self.recover = require_running, recover
        self.deferred: WorkerCalls[Call] = WorkerCalls(functools.partial(functools.partial, pool.call))

    def deadline(self) -> float:
        return time.monotonic() + self.rpc_timeout + TIMEOUT_MARGIN

    def batch_deadline(self) -> tuple[float, int] | None:
        """Until when the worker that has waited longest on a batch request may take, and which
        worker that is; None when no request is outstanding."""
        serving = [(r.serving_since, i) for i, r in enumerate(self.roster) if r.outstanding and r.serving_since is not None]
        if not serving:
            return None
        since, worker_id = min(serving)
        return since + self.rpc_timeout + TIMEOUT_MARGIN, worker_id

    def check(self, worker_ids: set[int] | None = None) -> None:
        """Raise shutdown, or the failure of a dead worker among ``worker_ids`` (None: any)."""
        self.require_running()
        dead = [i for i, r in enumerate(self.roster) if r.dead is not None and (worker_ids is None or i in worker_ids)]
        if dead:
            raise Failure(dead[0], self.roster[dead[0]].dead)

    def result(self, worker_id: int, fut: torch.futures.Future) -> Any:
        """The answer in ``fut``; a failed call raises :class:`Failure` with what went wrong."""
        try:
            return outcome(fut)
        except Exception as err:
            reason, remote = self.pool.failure(worker_id, err)
            raise Failure(worker_id, reason, remote) from err

    def late(self, worker_id: int) -> Failure:
        return Failure(worker_id, f"did not answer within rpc_timeout={self.rpc_timeout} s")

    def gather(
        self, calls: dict[int, Call], futures: dict[int, torch.futures.Future] | None = None, recover: bool = True,
    ) -> list:
        """Results of ``{worker_id: call}`` in worker order (``futures``: the calls already sent).

        Only these workers' failures interrupt it. A failed worker is replaced and asked again
        while the restart budget lasts (with ``recover=False`` its failure propagates as
        :class:`Failure`); then it raises WorkerError.
        """
        tag = object()
        calls = dict(calls)
        futures = dict(futures) if futures is not None else {i: call() for i, call in calls.items()}
        for worker_id, fut in futures.items():
            self.events.watch(worker_id, self.roster[worker_id].generation, tag, fut)
        results: dict[int, Any] = {}
        deadline = self.deadline()
        try:
            while len(results) < len(calls):
                waiting = set(calls) - set(results)
                try:
                    item = self.events.take(lambda e: isinstance(e, Answer) and e.tag is tag, deadline,
                                            functools.partial(self.check, waiting))
                    if item is None:
                        raise self.late(min(waiting))
                    if item.fut is futures.get(item.worker_id):  # not an answer of a replaced worker
                        results[item.worker_id] = self.result(item.worker_id, item.fut)
                except Failure as failed:
                    if not recover:
                        raise
                    if not self.recover(failed):  # an elastic collector left: its slot has no answer
                        calls.pop(failed.worker_id, None)
                    elif failed.worker_id in calls and failed.worker_id not in results:
                        futures[failed.worker_id] = fut = calls[failed.worker_id]()
                        self.events.watch(failed.worker_id, self.roster[failed.worker_id].generation, tag, fut)
                    deadline = self.deadline()
            return [results[i] for i in sorted(results)]
        finally:
            self.events.drop(lambda e: isinstance(e, Answer) and e.tag is tag)
