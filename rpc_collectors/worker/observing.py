"""The calls that observe a collector server: its phases' totals, its clock, and a trace window on
its phase clock.

A worker's window keeps the spans its collector's phase clock marks
(:mod:`~rpc_collectors.single_process.phase_clock`: whatever phases are marked; with
``metrics=False``, a clock of the window's own); a node's is its
own front's window (:mod:`~rpc_collectors.trainer.trace_window`), which holds the node's waits
and its local workers' spans, already on the node's clock.
"""
from __future__ import annotations

import os
import socket
import time
from collections import deque
from typing import Any

from rpc_collectors.core.protocol import ProcessSpans
from rpc_collectors.single_process.phase_clock import PhaseClock, StoppedClock
from rpc_collectors.worker.node import NodeCollector

THREAD = "rollout"  # the row of a worker's phases in the timeline


class ObservingCalls:
    """``phases``, ``clock`` and ``trace`` (:class:`~rpc_collectors.core.protocol.WorkerCalls`) on a server's
    ``collector``."""

    collector: Any

    def phases(self) -> tuple:
        """This worker's ``WorkerPhases`` (:mod:`~rpc_collectors.core.metrics`; a node's: its local workers';
        an ``AsyncBatchedCollector``'s env worker's: its env steps)."""
        steps = getattr(self, "steps", None)
        if steps is not None:
            return steps.phases(self.collector.worker_idx)
        return self.collector.phases()

    def clock(self) -> int:
        """This process's ``time.monotonic_ns()``."""
        return time.monotonic_ns()

    def trace(self, keep: int | None) -> list[ProcessSpans] | None:
        """Open a window keeping at most ``keep`` spans per thread, or close it (None): its spans."""
        if isinstance(self.collector, NodeCollector):
            window = self.collector.local.tracing
            return window.open(keep) if keep is not None else window.take()
        rollout = self.collector.rollout
        if keep is not None:
            if isinstance(rollout.clock, StoppedClock):  # metrics=False: a clock of the window's own
                rollout.clock = PhaseClock()
            rollout.clock.spans = deque(maxlen=keep)
            return None
        clock = rollout.clock
        spans, clock.spans = clock.spans, None
        if not self.collector._meter.on:
            rollout.clock = StoppedClock()
        return [ProcessSpans((), socket.gethostname(), os.getpid(), {THREAD: list(spans or ())})]
