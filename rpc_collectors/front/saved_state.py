"""A multi-worker collector's ``state_dict()`` and ``load_state_dict()``.

The state holds the trainer's frames, iteration and weights version, the trainer's policy
weights, and every worker's collector state (elastic collectors, whose collectors come and go:
where each slot's trajectory ids continue from). Loading it gives the trainer's policy the saved
weights, as TorchRL's collectors do, and the workers (or, elastic, the collectors that join)
theirs; trajectory ids keep increasing.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from rpc_collectors.front.collector_front import CollectorFront

POLICY = "policy_state_dict"


def state_of(front: "CollectorFront") -> dict:
    """``front``'s state (the last weight push finished first)."""
    front.require_running()
    with front._lock:
        front._finish_push()
    state = front._base_state()
    state["policy_version"] = front.policy_version
    if isinstance(front.policy, nn.Module):
        state[POLICY] = {name: value.clone() for name, value in front.policy.state_dict().items()}
    if front.elastic:  # collectors come and go: keep where their trajectory ids continue from
        state["workers"], state["traj_id_bounds"] = None, front.restarts.bounds()
        return state
    state["workers"] = front.gather({i: front._call(i, "state_dict") for i in range(front.num_workers)})
    state.update({f"worker{i}": worker for i, worker in enumerate(state["workers"])})  # TorchRL's keys
    return state


def load(front: "CollectorFront", state: dict) -> None:
    """Resume ``front`` from ``state`` (see the module docstring)."""
    front.require_running()
    if front.elastic:
        if state.get("traj_id_bounds") is None or len(state["traj_id_bounds"]) != front.num_workers:
            raise ValueError(f"the state is not that of an elastic collector with {front.num_workers} slots")
        if front._serving():
            raise RuntimeError("load_state_dict on an elastic collector must come before its first batch")
    elif state["workers"] is None:
        raise ValueError("the state is an elastic collector's; load it into a collector with elastic=True")
    elif len(state["workers"]) != front.num_workers:
        raise ValueError(f"the state holds {len(state['workers'])} workers; this collector has {front.num_workers}")
    front._load_base_state(state)
    front.policy_version = int(state["policy_version"])
    if state.get(POLICY) is not None and isinstance(front.policy, nn.Module):
        front.policy.load_state_dict(state[POLICY])
    if front.elastic:
        front.restarts.restore(state["traj_id_bounds"])
        if state.get(POLICY) is not None and front.weights is not None:  # collectors that join get these weights
            front._push_weights([], version=front.policy_version)
        return
    front.gather({i: front._call(i, "load_state_dict", s) for i, s in enumerate(state["workers"])})
    for i, worker_state in enumerate(state["workers"]):
        front.restarts.loaded(i, int(worker_state["traj_count"]))
