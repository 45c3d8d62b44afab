"""The one place a multi-worker collector waits: answers, joins, deaths and shutdown.

Producers (the callbacks of workers' futures, a pool reporting a death or a newcomer,
``shutdown()`` from another thread) add an event to the front's :class:`Events` or change the
collector's state, and wake every waiter. A waiter takes the first event it waits for and
leaves the others, in order, for the next one: a weight push may wait while a worker's batch
arrives, and the batch stays for the collecting thread. Waiting costs no CPU. :class:`Waits`
bounds every wait by ``rpc_timeout`` and raises :class:`~rpc_collectors.core.errors.Failure`
for a worker that died, raised or did not answer.
"""
from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rpc_collectors.core.errors import Failure
from rpc_collectors.core.futures import detached
from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.trainer.roster import Roster

# the tag of a batch request's answer
BATCH = "batch"
# seconds past rpc_timeout before a wait gives up (a pool's own timeout comes first)
TIMEOUT_MARGIN = 1.0
# a request to one worker, that can be sent again
Call = Callable[[], torch.futures.Future]


@dataclass(frozen=True)
class Answer:
    """Worker ``worker_id``'s process ``generation`` answered the request ``tag`` (:data:`BATCH`,
    or the gather that sent the call) in ``fut``."""

    worker_id: int
    generation: int
    tag: object
    fut: torch.futures.Future


@dataclass(frozen=True)
class Joined:
    """A collector process (``rank``) joined an elastic trainer."""

    rank: int


class Events:
    """The events of one front, in the order they came, and its waiters' condition.

    ``waited_ns``: how long waiters waited here, in all (the trainer's wait in ``metrics()``).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Any] = []
        self.waited_ns = 0

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def watch(self, worker_id: int, generation: int, tag: object,
              fut: torch.futures.Future) -> None:
        """Add an :class:`Answer` once ``fut`` completes (at once if it has)."""
        fut.add_done_callback(lambda f: self.put(Answer(worker_id, generation, tag, f)))

    def wake(self) -> None:
        """Wake every waiter to look at the collector's state again (a death, shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def take(self, match: Callable[[Any], bool], deadline: float,
             check: Callable[[], None]) -> Any:
        """The first event ``match`` accepts, or None at ``deadline``; ``check()`` runs before each
        look (it raises on a death or shutdown the waiter must hear of)."""
        with self._cond:
            while True:
                check()
                for k, item in enumerate(self._items):
                    if match(item):
                        return self._items.pop(k)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                begun = time.perf_counter_ns()
                self._cond.wait(remaining)
                self.waited_ns += time.perf_counter_ns() - begun

    def drop(self, match: Callable[[Any], bool]) -> None:
        """Forget the events ``match`` accepts (answers nobody waits for any more)."""
        with self._cond:
            self._items = [item for item in self._items if not match(item)]


class Waits:
    """The waits of one front: on ``roster``'s workers in ``pool``, through ``events``.

    ``require_running()`` raises once the front shuts down; ``recover(failure)`` replaces a failed
    worker (True), lets an elastic one leave (False) or raises its WorkerError. ``deferred``: the
    workers' calls (:mod:`~rpc_collectors.core.protocol`), each a :data:`Call` that :meth:`gather`
    sends.
    """

    def __init__(
        self, events: Events, roster: Roster, pool: Any, rpc_timeout: float,
        require_running: Callable[[], None], recover: Callable[[Failure], bool],
    ) -> None:
        self.events, self.roster, self.pool = events, roster, pool
        self.rpc_timeout = rpc_timeout
        self.require_running, self.recover = require_running, recover
        self.deferred: WorkerCalls[Call] = WorkerCalls(
            functools.partial(functools.partial, pool.call))

    def deadline(self) -> float:
        return time.monotonic() + self.rpc_timeout + TIMEOUT_MARGIN

    def batch_deadline(self) -> tuple[float, int] | None:
        """Until when the worker that has waited longest on a batch request may take, and which
        worker that is; None when no request is outstanding."""
        serving = [(r.serving_since, i) for i, r in enumerate(self.roster)
                   if r.outstanding and r.serving_since is not None]
        if not serving:
            return None
        since, worker_id = min(serving)
        return since + self.rpc_timeout + TIMEOUT_MARGIN, worker_id

    def check(self, worker_ids: set[int] | None = None) -> None:
        """Raise shutdown, or the failure of a dead worker among ``worker_ids`` (None: any)."""
        self.require_running()
        dead = [i for i, r in enumerate(self.roster)
                if r.dead is not None and (worker_ids is None or i in worker_ids)]
        if dead:
            raise Failure(dead[0], self.roster[dead[0]].dead)

    def result(self, worker_id: int, fut: torch.futures.Future) -> Any:
        """The answer in ``fut``; a failed call raises :class:`Failure` with what went wrong (from
        a copy of the future's exception: :func:`~rpc_collectors.core.futures.detached`)."""
        try:
            return fut.wait()
        except Exception as err:
            held = err
        failed = detached(held)
        reason, remote = self.pool.failure(worker_id, failed)
        raise Failure(worker_id, reason, remote) from failed

    def late(self, worker_id: int) -> Failure:
        return Failure(worker_id, f"did not answer within rpc_timeout={self.rpc_timeout} s")

    def gather(
        self, calls: dict[int, Call], futures: dict[int, torch.futures.Future] | None = None,
        recover: bool = True,
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
                    item = self.events.take(lambda e: isinstance(e, Answer) and e.tag is tag,
                                            deadline, functools.partial(self.check, waiting))
                    if item is None:
                        raise self.late(min(waiting))
                    # not an answer of a replaced worker
                    if item.fut is futures.get(item.worker_id):
                        results[item.worker_id] = self.result(item.worker_id, item.fut)
                except Failure as failed:
                    if not recover:
                        raise
                    if not self.recover(failed):
                        # an elastic collector left: its slot has no answer
                        calls.pop(failed.worker_id, None)
                    elif failed.worker_id in calls and failed.worker_id not in results:
                        futures[failed.worker_id] = fut = calls[failed.worker_id]()
                        generation = self.roster[failed.worker_id].generation
                        self.events.watch(failed.worker_id, generation, tag, fut)
                    deadline = self.deadline()
            return [results[i] for i in sorted(results)]
        finally:
            self.events.drop(lambda e: isinstance(e, Answer) and e.tag is tag)
