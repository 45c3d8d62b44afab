"""``metrics()`` of a collector front: the trainer's counters with each worker's phases.

The front's :class:`~rpc_collectors.single_process.run_meter.RunMeter` owns the rounds, lag, pushes
and data-plane counters; the roster owns restarts, joins and leaves; continuity owns the drops;
each worker process owns its phase clock, which it answers the trainer's ``phases`` call with
(:class:`~rpc_collectors.core.metrics.WorkerPhases`: a node answers its local workers'). This
module puts them together; it costs nothing between calls.
"""
from __future__ import annotations

from typing import Any

from rpc_collectors.core.metrics import Metrics, RosterMetrics, WorkerMetrics, WorkerPhases


def phases_of(front: Any) -> tuple[WorkerPhases, ...]:
    """Each serving worker process's phases, by worker id (one call to each serving worker)."""
    serving = front.roster.serving()
    answers = front.gather({i: front.deferred.phases(i) for i in serving}) if serving else []
    return tuple(phases for answer in answers for phases in answer)


def of(front: Any) -> Metrics:
    """The :class:`Metrics` of collector front ``front``."""
    roster = front.roster
    alive = 0 if front._closing else sum(record.serving and record.dead is None for record in roster)
    restarts = sum(front.worker_restarts) - roster.leaves
    who = RosterMetrics(front.num_workers, alive, restarts, roster.joins, roster.leaves)
    workers = tuple(WorkerMetrics.of(phases) for phases in phases_of(front))
    dropped = (int(front.dropped_frames), int(front.dropped_batches))
    return front._meter.snapshot(front.frames, dropped, who, workers, data_plane=True)
