"""What every collector's ``metrics()`` answers, built from its
:class:`~rpc_collectors.single_process.run_meter.RunMeter` and the parts that own the rest (its
frames, drops, frame ledger, workers), and the evaluators' results the meter keeps for it;
``BaseCollector``'s methods (a multi-worker collector's ``metrics()`` adds its workers' phases and
roster).
"""
from __future__ import annotations

from typing import Any

from rpc_collectors.core.metrics import Metrics, RosterMetrics


def metrics(collector: Any) -> Metrics:
    """The run's :class:`~rpc_collectors.core.metrics.Metrics`: rounds, lag, restarts, pushes,
    the data plane, each worker's phases (:mod:`~rpc_collectors.single_process.run_meter`), the
    evaluations reported; a RuntimeError with ``metrics=False``."""
    drops = (int(collector.dropped_frames), int(getattr(collector, "dropped_batches", 0)))
    return collector._meter.snapshot(collector._frames, drops, RosterMetrics(),
                                     collector._worker_metrics(), collector._account(),
                                     data_plane=False)


def metrics_on(collector: Any) -> bool:
    """Whether this collector keeps metrics (``metrics=`` not False)."""
    return collector._meter.on


def report_evaluation(collector: Any, prefix: str, values: dict[str, float]) -> None:
    """Keep an evaluation's numbers (named ``"<prefix>/<metric>"``) as the group ``prefix`` of
    ``metrics().evaluations``, which the exports write at their next interval: what an
    ``Evaluator`` given this collector as ``metrics=`` calls with each result; a RuntimeError
    with ``metrics=False``."""
    collector._meter.evaluated(prefix, values)
