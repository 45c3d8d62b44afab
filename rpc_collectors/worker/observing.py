"""The calls that observe a collector server: its phases' totals, its clock, and a trace window on
its phase clock.

A worker's window keeps the spans its collector's phase clock marks
(:mod:`~rpc_collectors.single_process.phase_clock`: whatever phases are marked; with
``metrics=False``, a clock of the window's own); a node's is its
own front's window (:mod:`~rpc_collectors.trainer.trace_window`), which holds the node's waits
and its local workers' spans, already on the node's clock. Each collector opens its own
(:meth:`~rpc_collectors.worker.served_collector.ServedCollector.trace`).
"""
from __future__ import annotations

import time

from rpc_collectors.core.protocol import ProcessSpans
from rpc_collectors.worker.served_collector import ServedCollector


class ObservingCalls:
    """``phases``, ``clock`` and ``trace`` (:class:`~rpc_collectors.core.protocol.WorkerCalls`) on a server's
    ``collector``."""

    collector: ServedCollector

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
        return self.collector.trace(keep)
