"""Where a collector's time goes: its phases, timed on the monotonic clock all processes of a host share.

A :class:`PhaseClock` gives the time since its last mark to the phase the next mark names. A
worker marks ``"idle"`` when a request arrives, ``"weights"`` once new weights are in and
``"write"`` once the batch is built and written; a collector counts its time between rollouts
(``idle`` before a batch, ``write`` after it) with :meth:`PhaseClock.count`, in the totals only.

A rollout's steps are timed in its own loop, the cheapest way Python has: it reads the clock
with :meth:`PhaseClock.steps`'s ``now`` after each policy call and each env step, sums its env
steps' time in a local variable, and hands the sum and its first and last reads to
:meth:`PhaseClock.stepped` at its end (the rest of that time went to policy calls). Totals are
kept always; each mark's and each step's span only while ``spans`` is a deque (a trace window
is open), which bounds them. :class:`StoppedClock` reads no time (``metrics=False``).
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

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

    def steps(self) -> tuple[Callable[[], int], int, list[int] | None]:
        """For a rollout: the clock to read after each policy call and env step, the last mark's
        time (where its first policy call starts), and the list those reads go to while a trace
        window is open (else None)."""
        if self.spans is None:
            return time.monotonic_ns, self.last_ns, None
        stamps: list[int] = []

        def now() -> int:
            stamp = time.monotonic_ns()
            stamps.append(stamp)
            return stamp

        return now, self.last_ns, stamps

    def stepped(self, first_ns: int, last_ns: int, env_ns: int, stamps: list[int] | None) -> None:
        """A rollout's steps ran from ``first_ns`` (the last mark) to ``last_ns``, ``env_ns`` of it in
        env steps and the rest in policy calls; ``stamps``: its clock reads, alternately after a
        policy call and an env step."""
        totals = self.totals_ns
        totals["policy"] += last_ns - first_ns - env_ns
        totals["env"] += env_ns
        spans = self.spans
        if stamps is not None and spans is not None:
            start = first_ns
            for i, stamp in enumerate(stamps):
                spans.append(("env" if i % 2 else "policy", start, stamp))
                start = stamp
        self.last_ns = last_ns


class StoppedClock(PhaseClock):
    """A clock that counts nothing (``metrics=False``): a mark reads no clock."""

    __slots__ = ()

    def mark(self, phase: str) -> None:
        """Nothing: metrics are off."""

    def count(self, phase: str) -> None:
        """Nothing: metrics are off."""

    def steps(self) -> tuple[Callable[[], int], int, list[int] | None]:
        """A clock that reads 0 (``int()``): the rollout's sums stay 0."""
        return int, 0, None

    def stepped(self, first_ns: int, last_ns: int, env_ns: int, stamps: list[int] | None) -> None:
        """Nothing: metrics are off."""
