"""An elastic run for tests/cluster/test_elastic.py and tests/cluster/test_slurm.py: the trainer, and its collectors.

Rank 0 (torchrun-style or SLURM variables) trains; any process with ``RPC_COLLECTORS_JOIN`` set,
or on another rank, serves a collector inside the RPCCollector constructor and exits there.

    --slots N            collector slots (num_collectors)
    --async              async batches (default: sync rounds over all slots)
    --frames N           frames to collect (-1: until killed)
    --batch-sleep S      the trainer's "training step": seconds to sleep after each batch
    --obs-size N         collect from ``test_restarts.StampEnv`` with N floats per observation (a collector
                         process started with ELASTIC_OBS_SIZE set uses that size instead)
    --resume-action A    start with a policy that always picks the other action, then, before the first
                         batch, load a state whose policy always picks action A

The trainer pushes new weights after every batch and prints JSON lines: one per batch (its
shape, the trainer's weights version, the versions in each slot's rows, which collector
process -- rank, address, pid -- served each slot, and how each slot's batches travel), one
per WorkerLeftWarning, and a summary. With ``--obs-size`` it checks every frame: each slot's
rows come from the process serving it, in consecutive steps; an "error" line says otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

from multihost_trainer import ArgmaxPolicy
from rpc_collectors import GymEnv, RPCCollector, WorkerLeftWarning
from test_restarts import Policy as StampPolicy
from test_restarts import StampEnv

WORKER_ID, VERSION, TRAJ_IDS = ("collector", "worker_id"), ("collector", "policy_version"), ("collector", "traj_ids")


def stamp_env(size: int):
    """A ``StampEnv`` factory, run in the collector process: ``ELASTIC_OBS_SIZE`` there overrides ``size``."""
    def make() -> GymEnv:
        return GymEnv(StampEnv(0, size=int(os.environ.get("ELASTIC_OBS_SIZE", size))))
    return make


def frame_errors(batch, worker_id: int, pid: int) -> list[str]:
    """What is wrong with the frames of ``worker_id`` in ``batch`` (``StampEnv``), served by ``pid``."""
    rows = batch[WORKER_ID] == worker_id
    obs, nxt = batch["observation"][rows], batch["next", "observation"][rows]
    errors = []
    if not (obs[:, 0] == pid).all():
        errors.append(f"slot {worker_id} holds frames of pids {obs[:, 0].unique().tolist()}, not its collector's {pid}")
    if not ((obs[:, 1].diff() == 1).all() and (nxt[:, 1] == obs[:, 1] + 1).all()):
        errors.append(f"slot {worker_id}'s frames are not consecutive steps")
    return errors


def emit(record: dict) -> None:
    print(json.dumps({"time": time.time(), **record}), flush=True)


def report_warning(message, category, *args, **kwargs) -> None:
    if issubclass(category, WorkerLeftWarning):
        emit({"event": "left", "message": str(message)})
    else:
        print(f"{category.__name__}: {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--async", dest="sync", action="store_false")
    parser.add_argument("--frames", type=int, default=-1)
    parser.add_argument("--frames-per-batch", type=int, default=100)
    parser.add_argument("--batch-sleep", type=float, default=0.0)
    parser.add_argument("--rpc-timeout", type=float, default=5.0)
    parser.add_argument("--join-timeout", type=float, default=60.0)
    parser.add_argument("--obs-size", type=int, default=0)
    parser.add_argument("--resume-action", type=int, default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    warnings.showwarning = report_warning
    env, policy = (stamp_env(args.obs_size), StampPolicy()) if args.obs_size else ("CartPole-v1", ArgmaxPolicy())
    if args.resume_action is not None:  # until the state is loaded, the policy picks the other action
        with torch.no_grad():
            policy.linear.weight.zero_()
            policy.linear.bias.copy_(torch.eye(2)[1 - args.resume_action])
    collector = RPCCollector(
        env, policy, frames_per_batch=args.frames_per_batch, total_frames=args.frames,
        num_collectors=args.slots, sync=args.sync, elastic=True, rpc_timeout=args.rpc_timeout,
        join_timeout=args.join_timeout, track_policy_version=True,
    )
    # Only the trainer gets here.
    state = collector.state_dict()
    if args.resume_action is not None:  # a saved policy that always picks this action (CartPole's ArgmaxPolicy)
        bias = torch.eye(2)[args.resume_action]
        state = {**state, "policy_state_dict": {"linear.weight": torch.zeros(2, 4), "linear.bias": bias}}
    collector.load_state_dict(state)  # before the first batch: no collector has joined yet
    emit({"event": "start", "address": f"{collector.workers.rdv.master_addr}:{collector.workers.rdv.master_port}",
          "state_workers": state["workers"], "traj_id_bounds": state["traj_id_bounds"], "next_seed": collector.set_seed(7)})
    traj_owner: dict[int, int] = {}  # trajectory id -> pid of the collector that produced it
    with collector:
        for index, batch in enumerate(collector):
            slots = [None if info is None else {k: info[k] for k in ("rank", "address", "pid")} for info in collector.infos]
            versions = {}
            for worker_id in batch[WORKER_ID].unique().tolist():
                rows = batch[WORKER_ID] == worker_id
                versions[worker_id] = batch[VERSION][rows].unique().tolist()
                pid = slots[worker_id]["pid"] if slots[worker_id] else -1
                for traj in batch[TRAJ_IDS][rows].unique().tolist():
                    if traj_owner.setdefault(traj, pid) != pid:
                        emit({"event": "error", "message": f"trajectory id {traj} came from pids {traj_owner[traj]} and {pid}"})
                for error in frame_errors(batch, worker_id, pid) if args.obs_size else []:
                    emit({"event": "error", "message": error})
            emit({
                "event": "batch", "index": index, "shape": list(batch.shape), "frames": collector.frames,
                "policy_version": collector.policy_version, "versions": versions, "slots": slots,
                "paths": [collector.slots.plane.path_of(w) for w in range(args.slots)],
                "actions": batch["action"].unique().tolist(),
            })
            collector.update_policy_weights_()
            if index == 0:
                try:
                    collector.load_state_dict(state)
                except RuntimeError as err:
                    emit({"event": "late_load", "message": str(err)})
            time.sleep(args.batch_sleep)
        emit({"event": "summary", "frames": collector.frames, "worker_restarts": collector.worker_restarts})


if __name__ == "__main__":
    main()
