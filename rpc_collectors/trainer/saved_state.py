"""A multi-worker collector's ``state_dict()`` and ``load_state_dict()``.

The state holds the trainer's frames, iteration and weights version, the frames and batches it
dropped, the frames the workers collected that no batch delivered yet (``undelivered_frames``),
the trainer's policy
weights, the restarts spent, each worker's seed and the weight-update cadence, and every worker's
collector state (elastic collectors, whose collectors come and go:
where each slot's trajectory ids continue from), with TorchRL's ``"traj_pool"`` (the highest of
the workers' next ids). Loading it gives the trainer's policy the saved
weights, as TorchRL's collectors do, and the workers (or, elastic, the collectors that join)
theirs; trajectory ids keep increasing, and workers that were seeded get new seeds from their
seed sequences (a resumed run does not replay the envs' first episodes).
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from rpc_collectors.single_process.trajectories import pool_state
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.plan import Plan
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.waits import Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher

POLICY = "policy_state_dict"


class SavedState:
    """The state of one collector front: ``policy`` (the trainer's), the records of ``roster``'s
    workers and their collectors (called through ``waits``), the weights version of ``pusher``,
    the drops of ``continuity``; ``delivered_frames(worker_id)``: the frames the front counts of a
    worker."""

    def __init__(self, plan: Plan, policy: Any, roster: Roster, waits: Waits, pusher: WeightPusher,
                 continuity: Continuity, delivered_frames: Callable[[int], int]) -> None:
        self.plan, self.policy, self.roster = plan, policy, roster
        self.waits, self.pusher = waits, pusher
        self.continuity, self.delivered_frames = continuity, delivered_frames

    def state(self, base: dict, run_start: int) -> dict:
        """The front's state, over its ``base`` state (the frames and iteration it counts);
        ``run_start``: which start of its run this is. The last weight push finishes first."""
        self.waits.require_running()
        roster, pusher = self.roster, self.pusher
        gather, deferred = self.waits.gather, self.waits.deferred
        with pusher.lock:
            pusher.finish()
        state = dict(base)
        state["policy_version"] = pusher.version
        state["dropped"] = {"frames": self.continuity.dropped_frames,
                            "batches": self.continuity.dropped_batches}
        state["restarts"] = {"counts": list(roster.counts), "seeds": list(roster.seeds),
                             "resumes": roster.resumes}
        if pusher.plane is not None:
            # the weight-update cadence: batches each worker delivered since its last push
            state["since_update"] = [record.batches_since_push for record in roster]
        if isinstance(self.policy, nn.Module):
            state[POLICY] = {name: value.clone()
                             for name, value in self.policy.state_dict().items()}
        if self.plan.elastic:
            # collectors come and go: keep where their trajectory ids continue from
            state["workers"], state["traj_id_bounds"] = None, roster.bounds()
            return state
        workers = state["workers"] = gather(
            {i: deferred.state_dict(i) for i in range(self.plan.num_workers)})
        # TorchRL's keys
        state.update({f"worker{i}": worker for i, worker in enumerate(workers)})
        pools = [w.get("traj_pool") or w["local"]["traj_pool"] for w in workers]
        state["traj_pool"] = pool_state(max(int(pool["traj_id"]) for pool in pools), run_start)
        state["undelivered_frames"] = sum(
            _collected(w) - self.delivered_frames(i) + roster[i].uncounted
            for i, w in enumerate(workers))
        return state

    def check(self, state: dict) -> None:
        """Raise if ``state`` cannot be loaded into this front (see the module docstring)."""
        self.waits.require_running()
        num_workers = self.plan.num_workers
        if self.plan.elastic:
            if state.get("traj_id_bounds") is None or len(state["traj_id_bounds"]) != num_workers:
                raise ValueError("the state is not that of an elastic collector with "
                                 f"{num_workers} slots")
            if self.roster.serving():
                raise RuntimeError("load_state_dict on an elastic collector must come before its "
                                   "first batch")
        elif state["workers"] is None:
            raise ValueError("the state is an elastic collector's; load it into a collector with "
                             "elastic=True")
        elif len(state["workers"]) != num_workers:
            raise ValueError(f"the state holds {len(state['workers'])} workers; this collector has "
                             f"{num_workers}")

    def load(self, state: dict) -> None:
        """Resume from ``state`` (checked by :meth:`check`, the front's base state loaded)."""
        roster, pusher = self.roster, self.pusher
        gather, deferred = self.waits.gather, self.waits.deferred
        pusher.version = int(state["policy_version"])
        self._load_run_state(state)
        if state.get(POLICY) is not None and isinstance(self.policy, nn.Module):
            self.policy.load_state_dict(state[POLICY])
        if self.plan.elastic:
            roster.restore(state["traj_id_bounds"])
            if state.get(POLICY) is not None and pusher.plane is not None:
                # collectors that join get these weights
                pusher.push([], version=pusher.version)
            return
        gather({i: deferred.load_state_dict(i, s) for i, s in enumerate(state["workers"])})
        self.continuity.resumed()
        if pusher.plane is not None:
            # each worker holds the weights it saved, under their version
            for record, worker in zip(roster, state["workers"]):
                version = worker["version"] if "local" in worker else worker["policy_version"]
                record.loaded_weights(int(version))
        for i, worker in enumerate(state["workers"]):
            roster.loaded(i, int(worker["traj_count"]))
            # it counts on from there
            roster[i].uncounted = self.delivered_frames(i) - _collected(worker)
        if any(seed is not None for seed in roster.seeds):
            # resumed workers draw new seeds from their sequences
            gather({i: deferred.set_seed(i, roster.seed(i))
                    for i in range(self.plan.num_workers) if roster.seeds[i] is not None})

    def _load_run_state(self, state: dict) -> None:
        """The restarts spent, the seed sequences, the frames and batches dropped and the
        weight-update cadence (states saved since they were kept)."""
        roster, num_workers = self.roster, self.plan.num_workers
        saved = state.get("restarts")
        if saved is not None and len(saved["counts"]) == num_workers:
            roster.counts = [int(c) for c in saved["counts"]]
            roster.seeds = [None if s is None else int(s) for s in saved["seeds"]]
            roster.resumes = int(saved["resumes"]) + 1
        dropped = state.get("dropped")
        if dropped is not None:
            self.continuity.dropped_frames = int(dropped["frames"])
            self.continuity.dropped_batches = int(dropped["batches"])
        cadence = state.get("since_update")
        if cadence is not None and self.pusher.plane is not None and len(cadence) == num_workers:
            for record, batches in zip(roster, cadence):
                record.batches_since_push = int(batches)


def _collected(worker_state: dict) -> int:
    """The frames a worker's collector counts (a node's: its local collector's)."""
    if "local" in worker_state:
        return int(worker_state["local"]["frames"])
    return int(worker_state["frames"])
