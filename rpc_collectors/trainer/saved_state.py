"""A multi-worker collector's ``state_dict()`` and ``load_state_dict()``.

The state holds the trainer's frames, iteration and weights version, the frames the workers
collected that no batch delivered yet (``undelivered_frames``), the trainer's policy
weights, the restarts spent, each worker's seed and the weight-update cadence, and every worker's
collector state (elastic collectors, whose collectors come and go:
where each slot's trajectory ids continue from), with TorchRL's ``"traj_pool"`` (the highest of
the workers' next ids). Loading it gives the trainer's policy the saved
weights, as TorchRL's collectors do, and the workers (or, elastic, the collectors that join)
theirs; trajectory ids keep increasing, and workers that were seeded get new seeds from their
seed sequences (a resumed run does not replay the envs' first episodes).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

from torch import nn

from rpc_collectors.core.protocol import WorkerCalls
from rpc_collectors.single_process.trajectories import pool_state
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.weight_pushes import WeightPusher

POLICY = "policy_state_dict"


class Saved(Protocol):
    """What the state of a collector front is read from and loaded into."""

    num_workers: int
    elastic: bool
    run_start: int
    policy: Any
    roster: Roster
    continuity: Continuity
    gather: Callable[..., list]
    deferred: WorkerCalls[Callable[[], Any]]
    pusher: WeightPusher

    def require_running(self) -> None: ...

    def _delivered_frames(self, worker: int) -> int: ...

    def _base_state(self) -> dict: ...

    def _load_base_state(self, state: dict) -> None: ...


def state_of(front: Saved) -> dict:
    """``front``'s state (the last weight push finished first)."""
    front.require_running()
    with front.pusher.lock:
        front.pusher.finish()
    state = front._base_state()
    state["policy_version"] = front.pusher.version
    state["restarts"] = {"counts": list(front.roster.counts), "seeds": list(front.roster.seeds),
                         "resumes": front.roster.resumes}
    if front.pusher.plane is not None:  # the weight-update cadence: batches each worker delivered since its last push
        state["since_update"] = [record.batches_since_push for record in front.roster]
    if isinstance(front.policy, nn.Module):
        state[POLICY] = {name: value.clone() for name, value in front.policy.state_dict().items()}
    if front.elastic:  # collectors come and go: keep where their trajectory ids continue from
        state["workers"], state["traj_id_bounds"] = None, front.roster.bounds()
        return state
    state["workers"] = front.gather({i: front.deferred.state_dict(i) for i in range(front.num_workers)})
    state.update({f"worker{i}": worker for i, worker in enumerate(state["workers"])})  # TorchRL's keys
    pools = [w.get("traj_pool") or w["local"]["traj_pool"] for w in state["workers"]]
    state["traj_pool"] = pool_state(max(int(pool["traj_id"]) for pool in pools), front.run_start)
    state["undelivered_frames"] = sum(_collected(w) - front._delivered_frames(i) + front.roster[i].uncounted
                                      for i, w in enumerate(state["workers"]))
    return state


def _collected(worker_state: dict) -> int:
    """The frames a worker's collector counts (a node's: its local collector's)."""
    return int(worker_state["local"]["frames"] if "local" in worker_state else worker_state["frames"])


def load(front: Saved, state: dict) -> None:
    """Resume ``front`` from ``state`` (see the module docstring)."""
    front.require_running()
    if front.elastic:
        if state.get("traj_id_bounds") is None or len(state["traj_id_bounds"]) != front.num_workers:
            raise ValueError(f"the state is not that of an elastic collector with {front.num_workers} slots")
        if front.roster.serving():
            raise RuntimeError("load_state_dict on an elastic collector must come before its first batch")
    elif state["workers"] is None:
        raise ValueError("the state is an elastic collector's; load it into a collector with elastic=True")
    elif len(state["workers"]) != front.num_workers:
        raise ValueError(f"the state holds {len(state['workers'])} workers; this collector has {front.num_workers}")
    front._load_base_state(state)
    front.pusher.version = int(state["policy_version"])
    _load_run_state(front, state)
    if state.get(POLICY) is not None and isinstance(front.policy, nn.Module):
        front.policy.load_state_dict(state[POLICY])
    if front.elastic:
        front.roster.restore(state["traj_id_bounds"])
        if state.get(POLICY) is not None and front.pusher.plane is not None:  # collectors that join get these weights
            front.pusher.push([], version=front.pusher.version)
        return
    front.gather({i: front.deferred.load_state_dict(i, s) for i, s in enumerate(state["workers"])})
    front.continuity.resumed()
    if front.pusher.plane is not None:  # each worker holds the weights it saved, under their version
        for record, worker_state in zip(front.roster, state["workers"]):
            record.loaded_weights(int(worker_state["version"] if "local" in worker_state else worker_state["policy_version"]))
    for i, worker_state in enumerate(state["workers"]):
        front.roster.loaded(i, int(worker_state["traj_count"]))
        front.roster[i].uncounted = front._delivered_frames(i) - _collected(worker_state)  # it counts on from there
    if any(seed is not None for seed in front.roster.seeds):  # resumed workers draw new seeds from their sequences
        front.gather({i: front.deferred.set_seed(i, front.roster.seed(i))
                      for i in range(front.num_workers) if front.roster.seeds[i] is not None})


def _load_run_state(front: Saved, state: dict) -> None:
    """The restarts spent, the seed sequences and the weight-update cadence (states saved since they were kept)."""
    saved = state.get("restarts")
    if saved is not None and len(saved["counts"]) == front.num_workers:
        front.roster.counts = [int(c) for c in saved["counts"]]
        front.roster.seeds = [None if s is None else int(s) for s in saved["seeds"]]
        front.roster.resumes = int(saved["resumes"]) + 1
    cadence = state.get("since_update")
    if cadence is not None and front.pusher.plane is not None and len(cadence) == front.num_workers:
        for record, batches in zip(front.roster, cadence):
            record.batches_since_push = int(batches)
