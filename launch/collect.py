"""Collect with an RPCCollector: trainer on rank 0, collector servers on every other rank.

The same script runs unchanged under plain python (workers spawned on this host), torchrun
and SLURM (``slurm/submit.py``)::

    python launch/collect.py --workers 2
    torchrun --nproc-per-node=3 launch/collect.py
    python slurm/submit.py launch/collect.py --nodes 2 --tasks-per-node 2

It collects ``--frames`` frames of CartPole-v1 with a small policy, pushes new weights once
half-way, and prints a JSON summary on the trainer: frames, trajectory ids, policy versions
and the host of every worker.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn

from rpc_collectors import RPCCollector


class ArgmaxPolicy(nn.Module):
    """A linear score per action; the best one is taken."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="local workers (default: WORLD_SIZE - 1, or 2)")
    parser.add_argument("--frames", type=int, default=4000)
    parser.add_argument("--frames-per-batch", type=int, default=400)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--launcher", default="auto")
    parser.add_argument("--rpc-timeout", type=float, default=60.0)
    args = parser.parse_args()

    policy = ArgmaxPolicy()
    start = time.perf_counter()
    collector = RPCCollector(
        args.env, policy, num_collectors=args.workers or (None if "WORLD_SIZE" in os.environ else 2),
        frames_per_batch=args.frames_per_batch, total_frames=args.frames, launcher=args.launcher,
        rpc_timeout=args.rpc_timeout, track_policy_version=True,
    )
    traj_ids, versions, batches = set(), set(), len(collector)
    with collector:
        hosts = [info["host"] for info in collector.infos]
        for i, batch in enumerate(collector):
            traj_ids.update(batch["collector", "traj_ids"].unique().tolist())
            versions.update(batch["collector", "policy_version"].unique().tolist())
            if i == batches // 2 - 1:
                with torch.no_grad():
                    policy.linear.bias.add_(1.0)
                collector.update_policy_weights_()
        summary = {
            "frames": collector.frames,
            "workers": collector.num_workers,
            "worker_hosts": hosts,
            "trajectories": len(traj_ids),
            "policy_versions": sorted(versions),
            "launcher": collector.launcher,
            "seconds": round(time.perf_counter() - start, 2),
        }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
