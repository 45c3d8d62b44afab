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
    EvaluationMetrics,
    FrameAccount,
    LagMetrics,
    Metrics,
    PushMetrics,
    RosterMetrics,
    RoundMetrics,
    WorkerMetrics,
)
from rpc_collectors.single_process.batch_record import BatchRecord
from rpc_collectors.single_process.phase_clock import PhaseClock, StoppedClock

# (thread name, span name, start, end, args) in time.monotonic_ns()
Span = tuple[str, str, int, int, Any]
# the phases of a weight push (PushMetrics); the trace's row of the first three
PUSH_PHASES = ("pause", "transfer", "acknowledge", "apply")
PUSH_THREAD = "weight pushes"
# the versions whose apply a meter remembers (a version's reports may come with two pushes)
APPLIED_KEPT = 64
OFF = (
    "metrics=False turned this collector's metrics off; accepted to have "
    "them: metrics=None (the default) or True"
)


def size_of(tensors: TensorDictBase | None) -> int:
    """The bytes of the tensors in ``tensors`` (None: 0), lazy stacks of
    different shapes included."""
    if tensors is None:
        return 0
    # its rows one by one: stacking them may fail
    if isinstance(tensors, LazyStackedTensorDict):
        return sum(size_of(row) for row in tensors.tensordicts)
    return sum(size_of(value)
               if isinstance(value, TensorDictBase) else value.numel() * value.element_size()
               for value in tensors.values() if isinstance(value, (TensorDictBase, torch.Tensor)))


class RunMeter:
    """A collector's round, lag, push and data-plane counters (``on=False``: none, and no clock
    reads), and its trainer's spans while ``spans`` is a deque (a trace window is open)."""

    def __init__(self, on: bool = True, exports: Any = None) -> None:
        self.on, self.exports = on, exports
        self.start = time.monotonic()
        self.rounds = 0
        # what counts the front's waits (``waited_ns``); None: a collector that never waits
        self.waits: Any = None
        # ns: the round's start, the waits counted then, its batch's arrival
        self._began = self._waited = self._arrived = 0
        self.wait_ns = self.busy_ns = self.handout_ns = 0
        # the last round's wait, busy, hand-out ns
        self.last: tuple[int, int, int] = (0, 0, 0)
        self.lag_min: int | None = None
        self.lag_max = self.lag_sum = self.lag_last = self.lagged = 0
        # bytes per frame of the batches received
        self.frame_bytes: float | None = None
        self.pushes = self.push_bytes = 0
        self.ack_ns = self.last_ack_ns = self.max_ack_ns = 0
        self._acks = threading.Lock()
        # the starts of the pushes not acknowledged yet
        self._unacked: list[int] = []
        # each push phase's ns: all pushes', the last push's; the apply counted of each version
        self.phase_ns = dict.fromkeys(PUSH_PHASES, 0)
        self.last_phase_ns = dict.fromkeys(PUSH_PHASES, 0)
        self._applied: dict[int, int] = {}
        # by log_prefix; replaced whole (an evaluator's thread reports, the trainer's reads)
        self.evaluations: dict[str, EvaluationMetrics] = {}
        self._evaluated = threading.Lock()
        # a Collector's: "idle" until a batch begins, then "write" (totals only)
        self.clock: PhaseClock | None = None
        self.spans: deque[Span] | None = None

    def watch(self, clock: PhaseClock) -> PhaseClock:
        """The phase clock of this collector's rollout: marked between batches
        (a :class:`StoppedClock` when off)."""
        self.clock = clock if self.on else StoppedClock()
        return self.clock

    # ---------------------------------------------------------------- rounds
    def begin(self) -> None:
        """A round begins: the trainer asks for its next batch."""
        if self.on:
            self._began = time.monotonic_ns()
            self._waited = self.waits.waited_ns if self.waits is not None else 0
            if self.clock is not None:
                self.clock.count("idle", self._began)

    def arrived(self, batch: Any) -> None:
        """The round's batch arrived (before ``postproc``, hooks, the storing device)."""
        if not self.on:
            return
        self._arrived = time.monotonic_ns()
        if self.clock is not None:
            # the rollout's batch built
            self.clock.count("write", self._arrived)
        waited = self.waits.waited_ns - self._waited if self.waits is not None else 0
        self.last = (waited, self._arrived - self._began - waited, 0)
        if self.frame_bytes is None and isinstance(batch, TensorDictBase) and batch.numel():
            self.frame_bytes = size_of(batch) / batch.numel()

    def handed_out(self, collector: Any, record: BatchRecord | None) -> None:
        """The round's batch is handed out (``record``: its versions, if it has
        them); exports that are due are written."""
        if not self.on:
            return
        handout = time.monotonic_ns() - self._arrived
        self.last = (self.last[0], self.last[1] + handout, handout)
        self.wait_ns, self.busy_ns, self.handout_ns = (
            self.wait_ns + self.last[0], self.busy_ns + self.last[1], self.handout_ns + handout)
        self.rounds += 1
        if record is not None:
            self.lag_min = (record.min_lag if self.lag_min is None
                            else min(self.lag_min, record.min_lag))
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

    def push_clock(self) -> int:
        """Now, for a push's phases (0, reading no clock: neither metrics nor a trace window)."""
        return time.monotonic_ns() if self.on or self.spans is not None else 0

    def acknowledged(self, started: int | None = None, times: tuple[int, int, int] | None = None,
                     receipts: Any = ()) -> None:
        """Every worker the push begun at ``started`` went to acknowledged it (None: every push
        not acknowledged yet); from any thread. ``times``: the push's :meth:`push_clock` reads
        as it began, once packed and once sent; ``receipts``: its workers' answers
        (:data:`~rpc_collectors.transport.weight_sync.Receipt`), for its phases."""
        now = time.monotonic_ns()
        with self._acks:
            done = [started] if started is not None else self._unacked
            for begun in done:
                took = now - begun
                self.ack_ns = self.ack_ns + took
                self.last_ack_ns = took
                self.max_ack_ns = max(self.max_ack_ns, took)
            self._unacked = [begun for begun in self._unacked if begun not in done]
            if times is not None and times[0]:
                self._phases(times, [r for r in receipts if isinstance(r, tuple) and len(r) == 3],
                             now)

    def _phases(self, times: tuple[int, int, int], receipts: list[tuple], now: int) -> None:
        """Split a push acknowledged ``now`` into its phases (holding ``_acks``): pause from its
        start until packed, transfer until sent and the slowest worker's receipt of the bytes
        (its own clock's, within the wait for the answers), acknowledge the rest; apply: the
        slowest worker's copy into its policy of each version the answers report (once each)."""
        began, packed, sent = times
        received = min(max((r[0] for r in receipts), default=0), max(now - sent, 0))
        last = {"pause": packed - began, "transfer": sent - packed + received,
                "acknowledge": now - sent - received}
        applies: dict[int, int] = {}
        for _, version, took in receipts:
            if version is not None:
                applies[version] = max(applies.get(version, 0), took)
        apply_ns = 0
        for version, took in applies.items():
            counted = self._applied.get(version, 0)
            apply_ns += max(took - counted, 0)
            self._applied[version] = max(took, counted)
        for version in sorted(self._applied)[:-APPLIED_KEPT]:
            del self._applied[version]
        last["apply"] = applies[max(applies)] if applies else self.last_phase_ns["apply"]
        if self.on:
            self.last_phase_ns = last
            self.phase_ns["apply"] += apply_ns
            for phase in ("pause", "transfer", "acknowledge"):
                self.phase_ns[phase] += last[phase]
        spans = self.spans
        if spans is not None:
            ends = (packed, sent + received, now)
            for phase, start, end in zip(PUSH_PHASES, (began, *ends[:2]), ends):
                spans.append((PUSH_THREAD, phase, start, end, None))

    # ---------------------------------------------------------------- spans of a trace window
    def span_start(self) -> int:
        """The start of a span (0: no window is open, nothing to record)."""
        return time.monotonic_ns() if self.spans is not None else 0

    def span_end(self, name: str, start: int, **args: Any) -> None:
        """The span ``name`` from ``start`` to now, with ``args`` (shown with
        it), if a window is open."""
        spans = self.spans
        if start and spans is not None:
            spans.append(
                (threading.current_thread().name, name, start, time.monotonic_ns(), args or None)
            )

    def take_spans(self) -> dict[str, list[tuple]]:
        """Close the window: its spans by thread, ``(name, start, end[, args])``
        each, oldest first."""
        spans, self.spans = self.spans, None
        threads: dict[str, list[tuple]] = {}
        # one copy: another thread may still append
        for thread, name, start, end, args in list(spans or ()):
            threads.setdefault(thread, []).append(
                (name, start, end, args) if args else (name, start, end)
            )
        return threads

    # ---------------------------------------------------------------- evaluations
    def evaluated(self, prefix: str, values: dict[str, float]) -> None:
        """An evaluator of ``log_prefix`` ``prefix`` ended an evaluation with these numbers."""
        if not self.on:
            raise RuntimeError(OFF)
        with self._evaluated:
            before = self.evaluations.get(prefix)
            results = 1 if before is None else before.results + 1
            self.evaluations[prefix] = EvaluationMetrics(prefix, results, dict(values))

    # ---------------------------------------------------------------- the snapshot
    def snapshot(self, frames: int, dropped: tuple[int, int], roster: RosterMetrics,
                 workers: tuple[WorkerMetrics, ...], accounts: FrameAccount,
                 data_plane: bool) -> Metrics:
        """The run's :class:`Metrics`: ``frames`` handed out, ``dropped`` (frames, batches), the
        ``roster``, the ``workers``, the frame ``accounts``; ``data_plane``: whether batches travel
        from other processes."""
        if not self.on:
            raise RuntimeError(OFF)
        elapsed = time.monotonic() - self.start
        last_wait, last_busy, last_handout = self.last
        rounds = RoundMetrics(self.rounds, self.wait_ns / 1e9, self.busy_ns / 1e9,
                              self.handout_ns / 1e9, last_wait / 1e9, last_busy / 1e9,
                              last_handout / 1e9)
        lag = LagMetrics(self.lag_min or 0, self.lag_sum / self.lagged if self.lagged else 0.0,
                         self.lag_max, self.lag_last, *dropped)
        with self._acks:
            phases = [self.phase_ns[p] / 1e9 for p in PUSH_PHASES]
            last_phases = [self.last_phase_ns[p] / 1e9 for p in PUSH_PHASES]
        pushes = PushMetrics(self.pushes, self.push_bytes, self.ack_ns / 1e9,
                             self.last_ack_ns / 1e9, self.max_ack_ns / 1e9, *phases, *last_phases)
        moved = int((self.frame_bytes or 0) * (frames + dropped[0])) if data_plane else 0
        with self._evaluated:
            evaluations = tuple(self.evaluations.values())
        return Metrics(elapsed, frames, frames / elapsed if elapsed > 0 else 0.0, rounds, lag,
                       roster, pushes,
                       DataPlaneMetrics(moved, moved / elapsed if elapsed > 0 else 0.0), workers,
                       accounts=accounts, evaluations=evaluations)

    def close(self) -> None:
        """Close the exports (their files, their endpoint)."""
        if self.exports is not None:
            self.exports.close()
