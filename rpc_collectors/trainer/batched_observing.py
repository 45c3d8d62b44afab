"""``metrics()`` and ``trace()`` of a batched-inference collector (``AsyncBatchedCollector``).

Its env workers answer ``phases``, ``clock`` and ``trace`` as every worker does
(:mod:`~rpc_collectors.worker.observing`; their step loop marks their phase clocks,
:mod:`~rpc_collectors.worker.env_steps`), asked through the pool only when ``metrics()`` runs or a
trace window opens and closes. Its inference loop (:mod:`.inference_loop`) owns the forward
passes' counters and phase clock. :class:`PoolParts` gives a :class:`~.trace_window.TraceWindow`
what it uses of a front, made of the pool's calls, so the window is the front's own.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from rpc_collectors.core.errors import Failure
from rpc_collectors.core.futures import outcome
from rpc_collectors.core.metrics import (
    InferenceMetrics,
    Metrics,
    RosterMetrics,
    WorkerMetrics,
    WorkerPhases,
)
from rpc_collectors.core.protocol import WorkerCalls


class PoolParts:
    """A trace window's view of a pool's workers: ``roster.serving()`` (the workers with a
    process), ``deferred`` calls, ``gather`` of their answers and the pool (``workers``)."""

    def __init__(self, pool: Any) -> None:
        self.workers, self.roster = pool, self
        self.deferred = WorkerCalls(
            lambda i, method, *args: functools.partial(pool.call, i, method, *args))

    def serving(self) -> list[int]:
        return sorted(self.workers.worker_pids)

    def gather(self, calls: dict[int, Any], futures: dict[int, Any] | None = None,
               recover: bool = False) -> list:
        """The answers of ``{worker_id: call}`` in worker order (``futures``: the calls already
        sent); a failed worker raises :class:`Failure` (it is replaced by the inference loop, if
        at all)."""
        futures = dict(futures) if futures is not None else {i: call() for i, call in calls.items()}
        answers = []
        for i in sorted(calls):
            try:
                answers.append(outcome(futures[i]))
            except Exception as err:  # noqa: BLE001 - the pool says why
                raise Failure(i, *self.workers.failure(i, err)) from None
        return answers


def worker_phases(pool: Any) -> list[WorkerPhases]:
    """Each env worker process's phases, asked of all at once; a worker that fails meanwhile (its
    replacement answers the next call) is left out."""
    sent = {}
    for i in sorted(pool.worker_pids):
        try:
            sent[i] = pool.calls.phases(i)
        except Exception:  # noqa: BLE001
            # being replaced by the inference loop: no channel to it now
            continue
    answers: list[WorkerPhases] = []
    for fut in sent.values():
        try:
            answers.extend(outcome(fut))
        except Exception:  # noqa: BLE001 - it died meanwhile: the inference loop handles that
            continue
    return answers


def inference_of(loop: Any) -> InferenceMetrics:
    """The :class:`InferenceMetrics` of inference loop ``loop`` (its counters and phase clock)."""
    totals = loop.clock.totals_ns
    passes, envs = loop.passes, loop.acted
    return InferenceMetrics(passes, envs, envs / passes if passes else 0.0, totals["idle"] / 1e9,
                            totals["policy"] / 1e9, totals["write"] / 1e9)


def of(collector: Any, metrics: Metrics) -> Metrics:
    """``metrics`` (the trainer's rounds and lag) with ``collector``'s env workers, their roster
    and its inference loop (once shut down: no workers, the loop's last counters)."""
    pool, loop = collector.pool, collector._loop
    if loop is None:
        workers, alive, inference = (), 0, collector._inference or InferenceMetrics()
    else:
        workers = tuple(WorkerMetrics.of(phases) for phases in worker_phases(pool))
        alive, inference = len(pool.worker_pids), inference_of(loop)
    roster = RosterMetrics(collector.num_workers, alive, sum(collector.roster.counts))
    return dataclasses.replace(metrics, workers=workers, roster=roster, inference=inference)
