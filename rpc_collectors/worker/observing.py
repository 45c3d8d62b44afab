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

import dataclasses
import time
from collections import deque

from rpc_collectors.core.protocol import ProcessSpans
from rpc_collectors.worker.served_collector import ServedCollector

# the row of a worker's trace that holds its weight receiver's apply spans
WEIGHTS_THREAD = "weights"


class ObservingCalls:
    """``phases``, ``clock`` and ``trace`` (:class:`~rpc_collectors.core.protocol.WorkerCalls`) on a
    server's ``collector``."""

    collector: ServedCollector

    def phases(self) -> tuple:
        """This worker's ``WorkerPhases`` (:mod:`~rpc_collectors.core.metrics`; a node's: its local
        workers'; an ``AsyncBatchedCollector``'s env worker's: its env steps)."""
        steps = getattr(self, "steps", None)
        if steps is not None:
            return steps.phases(self.collector.worker_idx)
        return self.collector.phases()

    def clock(self) -> int:
        """This process's ``time.monotonic_ns()``."""
        return time.monotonic_ns()

    def trace(self, keep: int | None) -> list[ProcessSpans] | None:
        """Open a window keeping at most ``keep`` spans per thread, or close
        it (None): its spans; the server's own process's row ``"weights"`` holds its weight
        receiver's ``apply`` spans (:class:`~rpc_collectors.transport.weight_sync.WeightReceiver`),
        each of a copy of pushed weights into its policy."""
        receiver = getattr(self, "receiver", None)
        applied = None
        if receiver is not None:
            applied, receiver.spans = receiver.spans, None if keep is None else deque(maxlen=keep)
        answer = self.collector.trace(keep)
        if keep is None and answer and applied:
            answer = list(answer)
            own = [i for i, process in enumerate(answer) if not process.path]
            if own:
                process = answer[own[0]]
                threads = {**process.threads, WEIGHTS_THREAD: list(applied)}
                answer[own[0]] = dataclasses.replace(process, threads=threads)
        return answer
