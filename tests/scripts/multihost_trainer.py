"""Trainer (and, on ranks != 0, collector server) for tests/cluster/test_multihost.py.

Run on every rank with torchrun-style variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TP_SOCKET_IFNAME/GLOO_SOCKET_IFNAME); ranks != 0 serve collectors inside the RPCCollector
constructor and exit there.

    --frames N   collect N frames, push new weights half-way, print one JSON summary line
    --endless    collect forever, printing one JSON line per batch (flushed)

The summary says where the trainer and each worker ran (address, network namespace, pid),
as the workers report it over RPC (tests/scripts/multihost_probe.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.distributed.rpc as rpc
from torch import nn

import multihost_probe
from rpc_collectors import RPCCollector
from rpc_collectors.worker.rpc_rank import worker_name


class ArgmaxPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=800)
    parser.add_argument("--endless", action="store_true")
    parser.add_argument("--frames-per-batch", type=int, default=100)
    parser.add_argument("--rpc-timeout", type=float, default=30.0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    policy = ArgmaxPolicy()
    with torch.no_grad():  # always push left: episodes end within a few dozen steps, so a run holds many
        policy.linear.weight.zero_()
    collector = RPCCollector(
        "CartPole-v1", policy, frames_per_batch=args.frames_per_batch,
        total_frames=-1 if args.endless else args.frames, launcher="torchrun", rpc_timeout=args.rpc_timeout,
        track_policy_version=True,
    )
    # Only rank 0 gets here.
    with collector:
        workers = []
        for info in collector.infos:
            probe = rpc.rpc_sync(worker_name(info["rank"]), multihost_probe.where, timeout=args.rpc_timeout)
            workers.append({**info, **probe})
        start = {
            "event": "start", "trainer": multihost_probe.where(), "workers": workers,
            "weight_transport": collector.weights.spec.kind if collector.weights is not None else None,
        }
        emit(start)
        if args.endless:
            for i, _ in enumerate(collector):
                emit({"event": "batch", "index": i, "frames": collector.frames, "time": time.time()})
            return
        traj_ids, versions, batches = set(), set(), len(collector)
        for i, batch in enumerate(collector):
            traj_ids.update(batch["collector", "traj_ids"].unique().tolist())
            versions.update(batch["collector", "policy_version"].unique().tolist())
            if i == batches // 2 - 1:
                with torch.no_grad():
                    policy.linear.bias.add_(1.0)
                collector.update_policy_weights_()
        emit({
            "event": "summary", "frames": collector.frames, "batches": batches, "workers": collector.num_workers,
            "trajectories": len(traj_ids), "policy_versions": sorted(versions),
            "policy_version": collector.policy_version,
        })


if __name__ == "__main__":
    main()
    sys.stdout.flush()
