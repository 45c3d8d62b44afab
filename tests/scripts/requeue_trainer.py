"""A run longer than its SLURM allocation, for tests/cluster/test_requeue_slurm.py and the requeue benchmark.

Submitted with ``slurm/submit.py --requeue --checkpoint-dir DIR``; task 0 trains, the other
tasks serve one collector each. The env is CartPole slowed by ``--step-sleep`` seconds a step.
After each batch the trainer changes its policy (a stand-in for a training step), pushes the
weights and hands ``RunCheckpoint.after_batch`` a record of the batch: the SLURM restart count,
its frames, its trajectory ids and the weight versions that collected it. The record of every
batch trained on lives in the checkpoint's user dict, so the test reads the whole run from it.

    --frames N          total_frames
    --batch N           frames_per_batch
    --step-sleep S      seconds added to every env step
    --slots N           an elastic trainer of N slots (submitted with elastic=True; collector jobs join it)
    --lag K             async collection with max_policy_lag=K (admitted); each batch's lag is recorded
    --hold-after N ...  after batch N of the run, wait for SLURM's stop signal (a training step that
                        lasts until the test stopped the job: its stop lands before the run is done)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

import torch

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: SLURM puts only scripts/ first
from conftest import slow_cartpole
from rpc_collectors import RPCCollector, RunCheckpoint
from rpc_collectors.apps.ppo import make_agent, make_policy
from rpc_collectors.cluster import requeue

VERSION, TRAJ_IDS = ("collector", "policy_version"), ("collector", "traj_ids")
HOLD_S = 300  # the longest a held batch waits for the stop signal


def hold() -> None:
    """Wait until the job got its stop signal, ``HOLD_S`` at most."""
    deadline = time.monotonic() + HOLD_S
    while requeue.stop_requested() is None and time.monotonic() < deadline:
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--slots", type=int)
    parser.add_argument("--lag", type=int)
    parser.add_argument("--hold-after", type=int, nargs="*", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    actor, _ = make_agent("CartPole-v1", hidden=16)
    policy = make_policy(actor)
    # every task runs this line; tasks > 0 serve a collector inside it and leave the script there
    where = dict(launcher="slurm") if args.slots is None else dict(num_collectors=args.slots, elastic=True)
    if args.lag is not None:
        where.update(sync=False, max_policy_lag=args.lag)
    collector = RPCCollector(partial(slow_cartpole, args.step_sleep), policy, frames_per_batch=args.batch,
                             total_frames=args.frames, track_policy_version=True, rpc_timeout=120, **where)
    with collector:
        ckpt = RunCheckpoint(collector=collector, modules={"actor": actor})
        extra = ckpt.resume() or {"batches": []}
        if not extra["batches"]:
            collector.set_seed(0)
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        for batch in collector:
            with torch.no_grad():  # a "training step": the next batches come from other weights
                for param in actor.parameters():
                    param.add_(0.01)
            collector.update_policy_weights_(policy)
            versions = batch.get(VERSION)
            extra["batches"].append({
                "restart": restart, "frames": batch.numel(), "traj_ids": batch.get(TRAJ_IDS).unique().tolist(),
                "versions": [int(versions.min()), int(versions.max())],
                "lag": collector.last_batch.lag, "dropped": collector.dropped_frames,
            })
            print(f"batch {len(extra['batches'])} frames {collector.frames}", flush=True)
            if len(extra["batches"]) in args.hold_after:
                hold()
            ckpt.after_batch(extra)
        ckpt.finish(extra)


if __name__ == "__main__":
    main()
