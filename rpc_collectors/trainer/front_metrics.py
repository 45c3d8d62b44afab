"""``metrics()`` of a collector front: the trainer's counters with each worker's phases.

The front's :class:`~rpc_collectors.single_process.run_meter.RunMeter` owns the rounds, lag, pushes
and data-plane counters; the roster owns restarts, joins and leaves; continuity owns the drops;
each worker process owns its phase clock, which it answers the trainer's ``phases`` call with
(:class:`~rpc_collectors.core.metrics.WorkerPhases`: a node answers its local workers'), and its
step count (which a local pool reads without a call); the front's ledger owns the frame accounts
(:mod:`~rpc_collectors.single_process.frame_ledger`). This module puts them together; it costs
nothing between calls.
"""
from __future__ import annotations

from typing import Any

from rpc_collectors.core.metrics import Metrics, RosterMetrics, WorkerMetrics, WorkerPhases
from rpc_collectors.single_process.frame_ledger import Ledger
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import Waits


def phases_by_worker(roster: Roster, waits: Waits) -> dict[int, tuple[WorkerPhases, ...]]:
    """Each serving worker id's phases: its process's (a node's: its local workers'), one call to
    each serving worker."""
    serving = roster.serving()
    answers = waits.gather({i: waits.deferred.phases(i) for i in serving}) if serving else []
    return dict(zip(serving, answers))


def phases_of(roster: Roster, waits: Waits) -> tuple[WorkerPhases, ...]:
    """Each serving worker process's phases, by worker id."""
    return tuple(p for answer in phases_by_worker(roster, waits).values() for p in answer)


def serving_steps(pool: Any, roster: Roster, ledger: Ledger,
                  phases: dict[int, tuple[WorkerPhases, ...]] | None) -> int:
    """Frames the processes serving now stepped: read by the pool where it can, else as their
    ``phases`` answered (None: none asked, after shutdown: what their answers brought in)."""
    total = 0
    for worker_id in roster.serving():
        stepped = pool.stepped(worker_id)
        if stepped is None:
            stepped = (ledger.in_answers(worker_id) if phases is None
                       else sum(p.stepped for p in phases[worker_id]))
        total += stepped
    return total


def of(meter: RunMeter, frames: int, roster: Roster, waits: Waits, continuity: Continuity,
       pool: Any, ledger: Ledger, closing: bool) -> Metrics:
    """The :class:`Metrics` of a front that counted ``frames`` with ``meter`` and ``ledger``, over
    ``roster``'s workers in ``pool`` (none alive once it is ``closing``)."""
    alive = 0 if closing else sum(record.serving and record.dead is None for record in roster)
    restarts = sum(roster.worker_restarts) - roster.leaves
    who = RosterMetrics(len(roster), alive, restarts, roster.joins, roster.leaves)
    phases = None if closing else phases_by_worker(roster, waits)
    workers = tuple(WorkerMetrics.of(p) for answer in (phases or {}).values() for p in answer)
    dropped = (int(continuity.dropped_frames), int(continuity.dropped_batches))
    accounts = ledger.account(serving_steps(pool, roster, ledger, phases), frames, dropped[0])
    return meter.snapshot(frames, dropped, who, workers, accounts, data_plane=True)
