"""The trainer's spans of a trace window: its waits for batches, hand-outs and weight pushes.

The request/wait loop (:mod:`.schedule`) and the weight pushes (:mod:`.weight_pushes`) mark each
span's start with :meth:`TraceRecorder.start` and its end with :meth:`TraceRecorder.end`. While no
window is open, ``start`` answers 0 after one attribute check and ``end`` keeps nothing.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

Span = tuple[str, str, int, int, Any]  # (thread name, span name, start, end, args) in time.monotonic_ns()


class TraceRecorder:
    """The spans of the trainer's threads while ``spans`` is a deque (a window is open)."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: deque[Span] | None = None

    def start(self) -> int:
        """The start of a span (0: no window is open, nothing to record)."""
        return time.monotonic_ns() if self.spans is not None else 0

    def end(self, name: str, start: int, **args: Any) -> None:
        """The span ``name`` from ``start`` to now, with ``args`` (shown with it), if a window is open."""
        spans = self.spans
        if start and spans is not None:
            spans.append((threading.current_thread().name, name, start, time.monotonic_ns(), args or None))

    def take(self) -> dict[str, list[tuple]]:
        """Close the window: its spans by thread, ``(name, start, end[, args])`` each, oldest first."""
        spans, self.spans = self.spans, None
        threads: dict[str, list[tuple]] = {}
        for thread, name, start, end, args in list(spans or ()):  # one copy: another thread may still append
            threads.setdefault(thread, []).append((name, start, end, args) if args else (name, start, end))
        return threads
