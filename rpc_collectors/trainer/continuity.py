"""Trajectory continuity: which batches of a worker's stream are handed out, and where a stream
is cut, its trajectories end.

Within one trajectory id the steps a collector hands out are consecutive. Whatever drops frames
of a worker's stream goes through :class:`Continuity`, which owns the rule:

* ``max_policy_lag`` (async, where set): a batch whose oldest step was chosen with weights more than
  ``max_policy_lag`` versions behind the trainer's ``policy_version`` is not handed out
  (:meth:`~Continuity.too_old`); it is asked again, with the newest weights pushed to it: its own,
  or, if it was left out of the pushes since they were within the bound
  (:meth:`~Continuity.left_behind`), the trainer's. The lag of each batch handed out is in
  ``last_batch`` (``lag``, ``min_lag``);
* a batch dropped (``max_policy_lag``, or a node's stale local batch) is counted in
  ``dropped_frames``/``dropped_batches`` (a node's own drops as it tells them, with its next
  answer) and cuts its workers' streams: each is told to go on under new trajectory ids from its
  next step (:meth:`~rpc_collectors.single_process.collector.Collector.cut`; a node cuts those of
  the local workers in the batch), its env not reset;
* a worker's batches asked before its cut reached it continue the dropped one: they are dropped too
  (its record counts them, :attr:`~rpc_collectors.trainer.roster.WorkerRecord.stale`, until they
  came);
* a worker replaced (``max_worker_restarts``) or a collector that joins starts afresh: a new env
  under ids above any its slot used (:meth:`~rpc_collectors.trainer.roster.Roster.traj_id_start`),
  and what its predecessor was asked is asked of it again (nothing stale);
* a resume (``load_state_dict``) restarts every env under ids above the saved ones: batches
  asked before it are dropped.

The frames before such a cut were handed out already (the last batch kept) or are dropped, so
none is left to mark truncated here; a resume starts ids in a range of its own
(:func:`~rpc_collectors.single_process.trajectories.shift_ids`).
"""
from __future__ import annotations

from tensordict import TensorDictBase

from rpc_collectors.single_process.batch_record import oldest_version, workers_in
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import Waits


class Continuity:
    """The stream cuts of one collector front, and the frames and batches it dropped.

    It cuts the streams of ``roster``'s workers through ``waits``' calls; ``max_policy_lag``: the
    run's bound.
    """

    def __init__(self, roster: Roster, waits: Waits, max_policy_lag: int | None) -> None:
        self.roster, self.waits, self.max_policy_lag = roster, waits, max_policy_lag
        # counted here, or by a node, which tells its own
        self.dropped_frames = self.dropped_batches = 0

    def drop(self, batch: TensorDictBase, worker_ids: list[int] | None = None) -> None:
        """Drop ``batch`` (of ``worker_ids``; default: the workers its steps name): count it, cut
        their streams."""
        self._count(batch)
        self.cut(workers_in(batch) if worker_ids is None else worker_ids)

    def cut(self, worker_ids: list[int] | None = None) -> None:
        """Cut the streams of ``worker_ids`` (default: every worker) where their last batch
        ended."""
        roster = self.roster
        chosen = range(len(roster)) if worker_ids is None else worker_ids
        worker_ids = [i for i in chosen if roster[i].serving]
        for worker_id in worker_ids:
            roster[worker_id].cut()
        # which answer of the worker's process the cut follows (a node cuts the local workers in it)
        self.waits.gather({i: self.waits.deferred.cut(i, roster[i].requests - roster[i].outstanding)
                           for i in worker_ids})

    def stale(self, batch: TensorDictBase) -> None:
        """``batch`` was asked before its worker's stream was cut (its record's answer was stale):
        dropped."""
        self._count(batch)

    def too_old(self, batch: TensorDictBase, trainer_version: int) -> bool:
        """Whether the oldest step of ``batch`` is more than ``max_policy_lag`` (set) versions
        behind ``trainer_version``."""
        oldest = oldest_version(batch)
        return oldest is not None and trainer_version - oldest > self.max_policy_lag

    def left_behind(self, worker_id: int, trainer_version: int) -> bool:
        """Whether the newest weights pushed to ``worker_id`` are themselves more than
        ``max_policy_lag`` (set) versions behind (it was left out of the pushes since): only then
        does it need the trainer's."""
        return trainer_version - self.roster[worker_id].weights_version > self.max_policy_lag

    def _count(self, batch: TensorDictBase) -> None:
        self.count(batch.numel(), 1)

    def count(self, frames: int, batches: int) -> None:
        """Count ``frames`` in ``batches`` dropped: here, or by a node, which tells them with its
        answers."""
        self.dropped_frames, self.dropped_batches = (self.dropped_frames + frames,
                                                     self.dropped_batches + batches)

    def resumed(self) -> None:
        """Every worker loaded a saved state (its envs restart): what they were asked before is
        stale."""
        for record in self.roster:
            record.cut()
