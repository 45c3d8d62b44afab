"""Where a collector's time goes: its phases, timed on the monotonic clock all processes of a host
share.

A :class:`PhaseClock` gives the time since its last mark to the phase the next mark names. A
worker marks ``"idle"`` when a request arrives, ``"weights"`` once new weights are in and
``"write"`` once the batch is built and written; a collector counts its time between rollouts
(``idle`` before a batch, ``write`` after it) with :meth:`PhaseClock.count`, at the times its run
meter read. Each mark's clock read ends one phase and begins the next, so a trace window's spans
are back to back and hold every nanosecond of the totals; a span of the phase of the span before
it extends that one (a worker's ``write`` goes on from its collector's to the slot written).

A rollout's steps are sampled, the cheapest way Python has: the rollout reads the clock around
the env step of the steps :meth:`PhaseClock.steps` picks (one in :data:`SAMPLED` on average), sums
those env steps' time in local variables, and hands the sums to :meth:`PhaseClock.stepped` at its
end, which reads the clock once more: the rollout's whole time is exact, its env steps' share is
the sampled steps' mean times the steps, and the rest went to policy calls. While ``spans`` is a
deque (a trace window is open) every step is timed and each policy call's and env step's span kept;
each mark's too, bounded by the deque. :class:`StoppedClock` reads no time (``metrics=False``).
"""
from __future__ import annotations

import itertools
import random
import time
from collections import deque
from typing import Callable, Iterator

PHASES = ("idle", "weights", "policy", "env", "write")
# (phase, start, end) in time.monotonic_ns()
Span = tuple[str, int, int]
# a rollout times one step in SAMPLED on average (all of them in a trace window)
SAMPLED = 64
# Which steps a rollout times, in turn: a fixed pseudo-random pattern whose length is a prime, so
# that no env's episode length or batch size lines up with it; its first step is timed.
_DRAWS = random.Random(0)
PATTERN = (True, *(_DRAWS.random() < 1 / SAMPLED for _ in range(1008)))


class PhaseClock:
    """Nanoseconds spent in each of :data:`PHASES` since it was made, and the
    spans of a trace window."""

    __slots__ = ("totals_ns", "spans", "last_ns", "pattern", "env_step_ns")

    def __init__(self) -> None:
        self.totals_ns: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.spans: deque[Span] | None = None
        self.last_ns = time.monotonic_ns()
        # goes on across rollouts
        self.pattern = itertools.cycle(PATTERN)
        # the mean env step of the last rollout that timed one
        self.env_step_ns = 0

    def mark(self, phase: str) -> None:
        """The time since the last mark was spent in ``phase``."""
        now = time.monotonic_ns()
        self.totals_ns[phase] += now - self.last_ns
        # read once: a window may close from another thread
        spans = self.spans
        if spans is not None:
            self._keep(spans, phase, now)
        self.last_ns = now

    def count(self, phase: str, now: int) -> None:
        """As :meth:`mark` at ``now``, the caller's read of ``time.monotonic_ns()`` (a collector's
        time between its rollouts)."""
        self.totals_ns[phase] += now - self.last_ns
        spans = self.spans
        if spans is not None:
            self._keep(spans, phase, now)
        self.last_ns = now

    def _keep(self, spans: deque[Span], phase: str, now: int) -> None:
        """Keep the span of ``phase`` from the last mark to ``now``: the last one kept, made longer,
        if it is of ``phase`` and ends there (replaced in one step: a closing window never misses
        it)."""
        last = spans[-1] if spans else None
        if last is not None and last[0] == phase and last[2] == self.last_ns:
            spans[-1] = (phase, last[1], now)
        else:
            spans.append((phase, self.last_ns, now))

    def steps(self, num_steps: int) -> tuple[Iterator[bool], Callable[[], int], list[int] | None]:
        """For a rollout of ``num_steps`` steps: whether to time each step's env step, the clock to
        read before and after it, and the list those reads go to while a trace window is open (then
        every step is timed; else None)."""
        if self.spans is None:
            return itertools.islice(self.pattern, num_steps), time.monotonic_ns, None
        stamps: list[int] = []

        def now() -> int:
            stamp = time.monotonic_ns()
            stamps.append(stamp)
            return stamp

        return itertools.repeat(True, num_steps), now, stamps

    def stepped(self, steps: int, timed: int, env_ns: int, stamps: list[int] | None) -> None:
        """A rollout ran ``steps`` steps since the last mark; the env steps of ``timed`` of them
        took ``env_ns``; ``stamps``: its clock reads of a trace window, before and after each env
        step."""
        # a window's spans end where its last step did
        now = stamps[-1] if stamps else time.monotonic_ns()
        if timed:
            self.env_step_ns = env_ns // timed
        total = now - self.last_ns
        env = env_ns if timed == steps else min(self.env_step_ns * steps, total)
        totals = self.totals_ns
        totals["policy"] += total - env
        totals["env"] += env
        spans = self.spans
        if stamps is not None and spans is not None:
            start = self.last_ns
            for i, stamp in enumerate(stamps):
                spans.append(("env" if i % 2 else "policy", start, stamp))
                start = stamp
        self.last_ns = now


class StoppedClock(PhaseClock):
    """A clock that counts nothing (``metrics=False``): a mark reads no clock."""

    __slots__ = ()

    def mark(self, phase: str) -> None:
        """Nothing: metrics are off."""

    def count(self, phase: str, now: int) -> None:
        """Nothing: metrics are off."""

    def steps(self, num_steps: int) -> tuple[Iterator[bool], Callable[[], int], list[int] | None]:
        """No step timed."""
        return itertools.repeat(False, num_steps), int, None

    def stepped(self, steps: int, timed: int, env_ns: int, stamps: list[int] | None) -> None:
        """Nothing: metrics are off."""
