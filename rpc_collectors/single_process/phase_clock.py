"""Where a collector's time goes: its phases, timed on the monotonic clock all processes of a host share.

A :class:`PhaseClock` gives the time since its last mark to the phase the next mark names. The
rollout marks ``"policy"`` after each policy call and ``"env"`` after each env step; a worker
marks ``"idle"`` when a request arrives, ``"weights"`` once new weights are in and ``"write"``
once the batch is built and written. Totals are kept always (one clock read per mark); each
mark's span only while ``spans`` is a deque (a trace window is open), which bounds them. A
collector counts its time between rollouts (``idle`` before a batch, ``write`` after it) with
:meth:`PhaseClock.count`, in the totals only; :class:`StoppedClock` reads no time (``metrics=False``).
"""
from __future__ import annotations

import time
from collections import deque

PHASES = ("idle", "weights", "policy", "env", "write")
Span = tuple[str, int, int]  # (phase, start, end) in time.monotonic_ns()


class PhaseClock:
    """Nanoseconds spent in each of :data:`PHASES` since it was made, and the spans of a trace window."""

    __slots__ = ("totals_ns", "spans", "last_ns")

    def __init__(self) -> None:
        self.totals_ns: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.spans: deque[Span] | None = None
        self.last_ns = time.monotonic_ns()

    def mark(self, phase: str) -> None:
        """The time since the last mark was spent in ``phase``."""
        now = time.monotonic_ns()
        self.totals_ns[phase] += now - self.last_ns
        spans = self.spans  # read once: a window may close from another thread
        if spans is not None:
            spans.append((phase, self.last_ns, now))
        self.last_ns = now

    def count(self, phase: str) -> None:
        """As :meth:`mark`, in the totals only: no span (a collector's time between its rollouts)."""
        now = time.monotonic_ns()
        self.totals_ns[phase] += now - self.last_ns
        self.last_ns = now


class StoppedClock(PhaseClock):
    """A clock that counts nothing (``metrics=False``): a mark reads no clock."""

    __slots__ = ()

    def mark(self, phase: str) -> None:
        """Nothing: metrics are off."""

    def count(self, phase: str) -> None:
        """Nothing: metrics are off."""
