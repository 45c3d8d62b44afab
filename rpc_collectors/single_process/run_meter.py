"""The trainer's clock: the totals of ``collector.metrics()`` always, and spans in a trace window.

A :class:`RunMeter` is the one owner of the trainer's timing. Its totals: each round's time waiting
for workers (as the front's one wait counts it), busy otherwise, and handing out; the policy lag of
each batch; the weight pushes and how long each took until every worker acknowledged it; the bytes
per frame of the batches received. It reads the monotonic clock three times per batch for them (no
CPU-time clock: those are system calls), and hands the first two reads to a single-process
collector's phase clock (``clock``: its time between rollouts); nothing with ``metrics=False``. The
:class:`~rpc_collectors.core.metrics.Metrics` of a collector are built from it
(:meth:`RunMeter.snapshot`) with what the collector's other parts own (frames, drops, the roster,
the workers' phase clocks). With exports (:mod:`.metric_exports`), each batch end may write them.

Its spans, while a trace window is open (``spans`` is a deque, ``collector.trace()``): the trainer's
threads mark where a span starts (:meth:`RunMeter.span_start`) and ends (:meth:`RunMeter.span_end`),
waits, hand-outs and weight pushes among them; with no window open, ``span_start`` answers 0 after
one attribute check, reading no clock, and ``span_end`` keeps nothing.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from rpc_collectors.core.metrics import (
    DataPlaneMetrics,
    LagMetrics,
    Metrics,
    PushMetrics,
    RosterMetrics,
    RoundMetrics,
    WorkerMetrics,
)
from rpc_collectors.single_process.batch_record import BatchRecord
from rpc_collectors.single_process.phase_clock import PhaseClock, StoppedClock

Span = tuple[str, str, int, int, Any]  # (thread name, span name, start, end, args) in time.monotonic_ns()
OFF = "metrics=False turned this collector's metrics off; accepted to have them: metrics=None (the default) or True"


def size_of(tensors: TensorDictBase | None) -> int:
    """The bytes of the tensors in ``tensors`` (None: 0), lazy stacks of different shapes included."""
    if tensors is None:
        return 0
    if isinstance(tensors, LazyStackedTensorDict):  # its rows one by one: stacking them may fail
        return sum(size_of(row) for row in tensors.tensordicts)
    return sum(size_of(value) if isinstance(value, TensorDictBase) else value.numel() * value.element_size()
               for value in tensors.values() if isinstance(value, (TensorDictBase, torch.Tensor)))


class RunMeter:
    """A collector's round, lag, push and data-plane counters (``on=False``: none, and no clock reads),
    and its trainer's spans while ``spans`` is a deque (a trace window is open)."""

    def __init__(self, on: bool = True, exports: Any = None) -> None:
        self.on, self.exports = on, exports
        self.start = time.monotonic()
        self.rounds = 0
        self.waits: Any = None  # what counts the front's waits (``waited_ns``); None: a collector that never waits
        self._began = self._waited = self._arrived = 0  # ns: the round's start, the waits counted then, its batch's arrival
        self.wait_ns = self.busy_ns = self.handout_ns = 0
        self.last: tuple[int, int, int] = (0, 0, 0)  # the last round's wait, busy, hand-out ns
        self.lag_min: int | None = None
        self.lag_max = self.lag_sum = self.lag_last = self.lagged = 0
        self.frame_bytes: float | None = None  # bytes per frame of the batches received
        self.pushes = self.push_bytes = 0
        self.ack_ns = self.last_ack_ns = self.max_ack_ns = 0
        self._acks = threading.Lock()
        self._unacked: list[int] = []  # the starts of the pushes not acknowledged yet
        self.clock: PhaseClock | None = None  # a Collector's: "idle" until a batch begins, then "write" (totals only)
        self.spans: deque[Span] | None = None

    def watch(self, clock: PhaseClock) -> PhaseClock:
        """The phase clock of this collector's rollout: marked between batches (a :class:`StoppedClock` when off)."""
        self.clock = clock if self.on else StoppedClock()
        return self.clock

    # ---------------------------------------------------------------- rounds
    def begin(self) -> None:
        """A round begins: the trainer asks for its next batch."""
        if self.on:
            self._began, self._waited = time.monotonic_ns(), self.waits.waited_ns if self.waits is not None else 0
            if self.clock is not None:
                self.clock.count("idle", self._began)

    def arrived(self, batch: Any) -> None:
        """The round's batch arrived (before ``postproc``, hooks, the storing device)."""
        if not self.on:
            return
        self._arrived = time.monotonic_ns()
        if self.clock is not None:
            self.clock.count("write", self._arrived)  # the rollout's batch built
        waited = self.waits.waited_ns - self._waited if self.waits is not None else 0
        self.last = (waited, self._arrived - self._began - waited, 0)
        if self.frame_bytes is None and isinstance(batch, TensorDictBase) and batch.numel():
            self.frame_bytes = size_of(batch) / batch.numel()

    def handed_out(self, collector: Any, record: BatchRecord | None) -> None:
        """The round's batch is handed out (``record``: its versions, if it has them); exports that are due are written."""
        if not self.on:
            return
        handout = time.monotonic_ns() - self._arrived
        self.last = (self.last[0], self.last[1] + handout, handout)
        self.wait_ns, self.busy_ns, self.handout_ns = (
            self.wait_ns + self.last[0], self.busy_ns + self.last[1], self.handout_ns + handout)
        self.rounds += 1
        if record is not None:
            self.lag_min = record.min_lag if self.lag_min is None else min(self.lag_min, record.min_lag)
            self.lag_max, self.lag_last = max(self.lag_max, record.lag), record.lag
            self.lag_sum, self.lagged = self.lag_sum + record.lag, self.lagged + 1
        if self.exports is not None and self.exports.due(self.rounds):
            self.exports.write(collector)

    # ---------------------------------------------------------------- pushes
    def pushed(self, nbytes: int) -> int:
        """A weight push of ``nbytes`` went out; returns its start, for :meth:`acknowledged`."""
        started = time.monotonic_ns()
        with self._acks:
            self.pushes, self.push_bytes = self.pushes + 1, self.push_bytes + nbytes
            self._unacked.append(started)
        return started

    def acknowledged(self, started: int | None = None) -> None:
        """Every worker the push begun at ``started`` went to acknowledged it (None: every push
        not acknowledged yet); from any thread."""
        now = time.monotonic_ns()
        with self._acks:
            done = [started] if started is not None else self._unacked
            for begun in done:
                took = now - begun
                self.ack_ns, self.last_ack_ns, self.max_ack_ns = self.ack_ns + took, took, max(self.max_ack_ns, took)
            self._unacked = [begun for begun in self._unacked if begun not in done]

    # ---------------------------------------------------------------- spans of a trace window
    def span_start(self) -> int:
        """The start of a span (0: no window is open, nothing to record)."""
        return time.monotonic_ns() if self.spans is not None else 0

    def span_end(self, name: str, start: int, **args: Any) -> None:
        """The span ``name`` from ``start`` to now, with ``args`` (shown with it), if a window is open."""
        spans = self.spans
        if start and spans is not None:
            spans.append((threading.current_thread().name, name, start, time.monotonic_ns(), args or None))

    def take_spans(self) -> dict[str, list[tuple]]:
        """Close the window: its spans by thread, ``(name, start, end[, args])`` each, oldest first."""
        spans, self.spans = self.spans, None
        threads: dict[str, list[tuple]] = {}
        for thread, name, start, end, args in list(spans or ()):  # one copy: another thread may still append
            threads.setdefault(thread, []).append((name, start, end, args) if args else (name, start, end))
        return threads

    # ---------------------------------------------------------------- the snapshot
    def snapshot(
        self, frames: int, dropped: tuple[int, int], roster: RosterMetrics, workers: tuple[WorkerMetrics, ...],
        data_plane: bool,
    ) -> Metrics:
        """The run's :class:`Metrics`: ``frames`` handed out, ``dropped`` (frames, batches), the
        ``roster``, the ``workers``; ``data_plane``: whether batches travel from other processes."""
        if not self.on:
            raise RuntimeError(OFF)
        elapsed = time.monotonic() - self.start
        last_wait, last_busy, last_handout = self.last
        rounds = RoundMetrics(self.rounds, self.wait_ns / 1e9, self.busy_ns / 1e9, self.handout_ns / 1e9,
                              last_wait / 1e9, last_busy / 1e9, last_handout / 1e9)
        lag = LagMetrics(self.lag_min or 0, self.lag_sum / self.lagged if self.lagged else 0.0, self.lag_max,
                         self.lag_last, *dropped)
        pushes = PushMetrics(self.pushes, self.push_bytes, self.ack_ns / 1e9, self.last_ack_ns / 1e9,
                             self.max_ack_ns / 1e9)
        moved = int((self.frame_bytes or 0) * (frames + dropped[0])) if data_plane else 0
        return Metrics(elapsed, frames, frames / elapsed if elapsed > 0 else 0.0, rounds, lag, roster, pushes,
                       DataPlaneMetrics(moved, moved / elapsed if elapsed > 0 else 0.0), workers)

    def close(self) -> None:
        """Close the exports (their files, their endpoint)."""
        if self.exports is not None:
            self.exports.close()
