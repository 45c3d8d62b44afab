"""A collector front's trace window: the timeline of a few rounds across its processes.

``collector.trace(path, rounds=N)`` opens a window on the trainer (its clock's spans,
:class:`~rpc_collectors.single_process.run_meter.RunMeter`) and on
every serving worker (``trace``, one of :class:`~rpc_collectors.core.protocol.WorkerCalls`: a
worker keeps its phase clock's spans, a node its own front's and its local workers'), each
bounded by ``max_spans`` per thread. Once the front handed out N batches, it takes the workers'
spans, measures their clocks' offsets (:mod:`.clock_offsets`), moves every span onto the
trainer's clock and writes the file (:mod:`.timeline`). A window that fails (a worker lost, a
full disk) is given up with a warning: collection goes on. One window at a time: ``trace()`` claims
it before asking the workers, and a ``trace()`` while it is claimed (from any thread) is refused.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import warnings
from collections import deque
from typing import Any, Callable

from rpc_collectors.core import checks
from rpc_collectors.core.errors import Failure
from rpc_collectors.core.protocol import ProcessSpans
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer import clock_offsets, timeline
from rpc_collectors.trainer.roster import Roster

# per thread of each process: about 10 MB
MAX_SPANS = 100_000


@dataclasses.dataclass(frozen=True)
class TraceParts:
    """What a collector front's :class:`TraceWindow` uses: the serving workers (``roster``),
    their calls and answers (``deferred``, ``gather``) and the pool (``workers``)."""

    roster: Roster
    deferred: Any
    gather: Callable[..., list]
    workers: Any


class TraceWindow:
    """The trace window of ``front``: ``meter``'s spans (the trainer's clock), the workers it was
    opened on, the rounds left. ``front`` gives the window what it uses: ``roster.serving()``,
    ``deferred`` calls, ``gather`` and the pool (``workers``): a collector front's own, or a pool's
    (:class:`~rpc_collectors.trainer.batched_observing.PoolParts`).

    ``claim`` is held while ``trace()`` checks and claims the window; ``path`` is the claimed
    window's file, until written or given up; ``rounds_left`` 0: no window of the user's is open;
    ``opened``: the workers whose window is open, since ``opened_at`` (on this process's
    ``time.monotonic_ns()``)."""

    def __init__(self, front: Any, meter: RunMeter) -> None:
        self.front, self.meter = front, meter
        self.claim = threading.Lock()
        self.path: str | None = None
        self.rounds_left = 0
        self.opened: list[int] = []
        self.opened_at = 0

    def start(self, path: Any, rounds: Any, max_spans: Any) -> None:
        """Open a window for the next ``rounds`` batches handed out, written to ``path`` then."""
        path = checks.writable_file("path", path)
        rounds = checks.positive_int("rounds", rounds)
        max_spans = checks.positive_int("max_spans", max_spans)
        with self.claim:
            if self.path is not None:
                raise RuntimeError(f"a trace is already open: {self.path!r} is written once its "
                                   "batches are handed out; call trace() again after that")
            self.path = path
        try:
            self.open(max_spans)
        except Exception as err:  # noqa: BLE001 - a trace never stops collection
            self._give_up(path, err)
            return
        self.rounds_left = rounds

    def open(self, keep: int) -> None:
        """Keep at most ``keep`` spans per thread, here and in every serving worker."""
        front = self.front
        self.opened_at, self.meter.spans = time.monotonic_ns(), deque(maxlen=keep)
        serving = front.roster.serving()
        self.opened = list(self._gather(lambda i: front.deferred.trace(i, keep), serving))

    def take(self) -> list[ProcessSpans]:
        """Close the window: the spans of this process and of every worker it was opened on, on
        this process's clock."""
        front = self.front
        own = ProcessSpans((), socket.gethostname(), os.getpid(), self.meter.take_spans())
        opened, self.opened = self.opened, []
        answers = self._gather(lambda i: front.deferred.trace(i, None), opened)
        offsets = clock_offsets.measure(front.workers, front.gather, front.deferred, list(answers))
        # each offset's error: half the round trip, rounded up
        return [own] + [entry.moved(i, offsets[i][0], -(-offsets[i][1] // 2))
                        for i, entries in answers.items() for entry in entries]

    def handed_out(self) -> None:
        """The front handed out a batch: after the window's last one, its file is written."""
        if not self.rounds_left:
            return
        self.rounds_left -= 1
        if not self.rounds_left:
            try:
                timeline.write(self.path, self.take(), self.opened_at)
            except Exception as err:  # noqa: BLE001 - a trace never stops collection
                self._give_up(self.path, err)
            else:
                # closed: trace() may open the next window
                self.path = None

    def _gather(self, call: Callable[[int], Any], worker_ids: list[int]) -> dict[int, Any]:
        """``{worker_id: answer}`` of ``call(worker_id)`` sent to ``worker_ids``, without those that
        failed meanwhile (their failure shows where the front waits for their batches)."""
        left = list(worker_ids)
        while True:
            try:
                return dict(zip(left, self.front.gather({i: call(i) for i in left}, recover=False)))
            except Failure as failed:
                left.remove(failed.worker_id)

    def _give_up(self, path: str, err: BaseException) -> None:
        self.opened, self.rounds_left, self.meter.spans, self.path = [], 0, None, None
        warnings.warn(f"the trace window for {path!r} was given up ({type(err).__name__}: {err}); "
                      "collection goes on", RuntimeWarning, stacklevel=3)
