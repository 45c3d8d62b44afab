"""Trainer (and, on ranks != 0, node collector server) for tests/worker/test_node_collectors.py.

Run on every rank with torchrun-style variables; ranks != 0 serve a node of 2 local workers
inside the RPCCollector constructor and exit there. Rank 0 prints JSON lines.

    --batches K --out DIR   collect K sync batches (stacked) from the nodes, pushing new weights
                            after each; then the same with 4 flat local workers and the same
                            seed; save both runs to DIR/node.pt and DIR/flat.pt
    --endless               collect until a worker fails; print the nodes' infos first and the
                            WorkerError at the end
    --inference node        the nodes run one policy each for their local workers (default: worker)
    --trace FILE            trace the node run's K batches into FILE (collector.trace); no flat run
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

from multihost_trainer import ArgmaxPolicy
from rpc_collectors import GymEnv, RPCCollector, WorkerError

NODES, PER_NODE, STEPS, SEED = 2, 2, 25, 11


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1")


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def weights_for(policy: nn.Module, batch_index: int) -> None:
    """The weights pushed after batch ``batch_index``: the same in both runs, different each time."""
    generator = torch.Generator().manual_seed(batch_index)
    with torch.no_grad():
        for param in policy.parameters():
            param.copy_(torch.randn(param.shape, generator=generator))


def collect(collector: RPCCollector, policy: nn.Module, batches: int) -> list:
    out = []
    collector.set_seed(SEED)
    for i, batch in enumerate(collector):
        out.append(batch.clone())
        if len(out) == batches:
            break
        weights_for(policy, i)
        collector.update_policy_weights_()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--endless", action="store_true")
    parser.add_argument("--inference", default="worker")
    parser.add_argument("--trace", default=None)
    args = parser.parse_args()

    torch.set_num_threads(1)
    policy = ArgmaxPolicy()
    weights_for(policy, -1)
    collector = RPCCollector(
        make_env, policy, collector_class="sync", num_workers_per_collector=PER_NODE,
        frames_per_batch=NODES * PER_NODE * STEPS, cat_results="stack", launcher="torchrun", rpc_timeout=60,
        track_policy_version=True, inference=args.inference,
    )
    # Only rank 0 gets here.
    try:
        with collector:
            emit({"event": "start", "nodes": collector.infos})
            if args.endless:
                for i, _ in enumerate(collector):
                    emit({"event": "batch", "index": i})
                return
            if args.trace:
                collector.trace(args.trace, rounds=args.batches)
            nodes = collect(collector, policy, args.batches)
    except WorkerError as err:
        emit({"event": "error", "worker_id": err.worker_id, "rank": err.rank, "host": err.host, "reason": err.reason})
        return
    if args.trace:
        emit({"event": "end", "batches": len(nodes)})
        return
    weights_for(policy, -1)
    flat = RPCCollector(make_env, policy, num_collectors=NODES * PER_NODE, frames_per_batch=NODES * PER_NODE * STEPS,
                        cat_results="stack", launcher="local", track_policy_version=True)
    with flat:
        flat_batches = collect(flat, policy, args.batches)
    torch.save(nodes, f"{args.out}/node.pt")
    torch.save(flat_batches, f"{args.out}/flat.pt")
    emit({"event": "end", "batches": len(nodes)})


if __name__ == "__main__":
    main()
    sys.stdout.flush()
