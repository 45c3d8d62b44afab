"""``metrics()`` of a collector front: the trainer's counters with each worker's phases.

The front's :class:`~rpc_collectors.single_process.run_meter.RunMeter` owns the rounds, lag, pushes
and data-plane counters; the roster owns restarts, joins and leaves; continuity owns the drops;
each worker process owns its phase clock, which it answers the trainer's ``phases`` call with
(:class:`~rpc_collectors.core.metrics.WorkerPhases`: a node answers its local workers'). This
module puts them together; it costs nothing between calls.
"""
from __future__ import annotations

from rpc_collectors.core.metrics import Metrics, RosterMetrics, WorkerMetrics, WorkerPhases
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import Waits


def phases_of(roster: Roster, waits: Waits) -> tuple[WorkerPhases, ...]:
    """Each serving worker process's phases, by worker id (one call to each serving worker)."""
    serving = roster.serving()
    answers = waits.gather({i: waits.deferred.phases(i) for i in serving}) if serving else []
    return tuple(phases for answer in answers for phases in answer)


def of(meter: RunMeter, frames: int, roster: Roster, waits: Waits, continuity: Continuity,
       closing: bool) -> Metrics:
    """The :class:`Metrics` of a front that counted ``frames`` with ``meter``, over ``roster``'s
    workers (none alive once it is ``closing``)."""
    alive = 0 if closing else sum(record.serving and record.dead is None for record in roster)
    restarts = sum(roster.worker_restarts) - roster.leaves
    who = RosterMetrics(len(roster), alive, restarts, roster.joins, roster.leaves)
    workers = tuple(WorkerMetrics.of(phases) for phases in phases_of(roster, waits))
    dropped = (int(continuity.dropped_frames), int(continuity.dropped_batches))
    return meter.snapshot(frames, dropped, who, workers, data_plane=True)
