"""Node collectors against flat workers: N=2 nodes x W=2 local workers vs 4 flat workers.

Three network-namespace hosts (``slurm/devcluster.py``'s ``HostNetwork``, 10.87.0.1-3): the
trainer (rank 0) in host 1; hosts 2 and 3 each run either two flat collector ranks (world of
5) or one node collector rank with 2 local workers (``collector_class="sync"``,
``num_workers_per_collector=2``, world of 3). Same env (CartPole-v1), same policy (an MLP of
67k parameters), same sync batches of 4 x ``--steps`` frames, same trainer loop. The two set-ups
take turns, ``--repeat`` times each; medians are printed, with the ratios node / flat.

Measured in the trainer process: frames/s; trainer CPU per frame (its user + system time,
all threads, over the steady state); requests per second at the trainer (batch requests it
sends: 4 per round flat, 2 with nodes) and its CPU per request; a weight push's time
(``update_policy_weights_()`` until every worker acknowledged: one gloo broadcast to the
collector ranks, each under a host name of its own; a node passes the weights on to its local
workers through shared memory before its next batch, which the push's time does not include).

Needs root; run under the cluster lock, as the namespace tests do:

    flock /tmp/rpc-cluster.lock nice -n 10 python benchmarks/node_collectors.py [--seconds 6] [--repeat 3] [--warmup 15]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import _common

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
PREFIX, SUBNET, PORT = "rpcc-nb", "10.87.0", 29687
NODES, PER_NODE = 2, 2
SETUPS = {"flat": (NODES * PER_NODE, "single", 1), "nodes": (NODES, "sync", PER_NODE)}  # ranks, class, W
PUSHES = 10


class MLPPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


def make_env():
    from rpc_collectors import GymEnv

    return GymEnv("CartPole-v1")


def trainer(setup: str, seconds: float, steps: int, warmup: float) -> dict:
    """Rank 0 of one set-up (other ranks serve collectors inside the constructor and exit there)."""
    from rpc_collectors import RPCCollector

    torch.set_num_threads(1)
    _, collector_class, per_node = SETUPS[setup]
    policy = MLPPolicy()
    collector = RPCCollector(
        make_env, policy, frames_per_batch=NODES * PER_NODE * steps, launcher="torchrun", rpc_timeout=60,
        collector_class=collector_class, num_workers_per_collector=per_node,
    )
    with collector:
        it = iter(collector)
        start = time.perf_counter()
        while time.perf_counter() - start < warmup:  # the first batches of fresh workers are slow
            next(it)
        frames, batches, t0, c0 = 0, 0, time.perf_counter(), _common.own_cpu_seconds()
        while time.perf_counter() - t0 < seconds:
            frames += next(it).numel()
            batches += 1
        wall, cpu = time.perf_counter() - t0, _common.own_cpu_seconds() - c0
        requests = batches * collector.num_workers
        pushes = _common.push_seconds(collector, it, PUSHES)
    return {
        "frames_per_s": frames / wall, "cpu_us_per_frame": 1e6 * cpu / frames, "requests_per_s": requests / wall,
        "cpu_us_per_request": 1e6 * cpu / requests, "push_ms": 1e3 * statistics.median(pushes),
        "transport": collector.weights.spec.kind, "workers": collector.num_workers,
    }


def run_setup(net, setup: str, seconds: float, steps: int, warmup: float) -> dict:
    ranks = SETUPS[setup][0]
    # OMP_NUM_THREADS=1: without it, local worker processes spin in libgomp between the policy's
    # calls (10x the CPU per step), which would hide what the node set-up costs the trainer
    env = {**os.environ, "WORLD_SIZE": str(ranks + 1), "MASTER_ADDR": f"{SUBNET}.1", "MASTER_PORT": str(PORT),
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{REPO}:{REPO / 'benchmarks'}:{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, __file__, "--trainer", setup, "--seconds", str(seconds), "--steps", str(steps),
            "--warmup", str(warmup)]
    hosts = [1] + [2 + (rank - 1) * 2 // ranks for rank in range(1, ranks + 1)]  # collector ranks split over hosts 2 and 3
    return _common.run_on_hosts(net, argv, env, hosts, "nb-host", timeout=warmup + seconds + 120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--steps", type=int, default=100, help="steps per local worker per batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of collection before measuring")
    parser.add_argument("--trainer", choices=SETUPS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer:
        result = trainer(args.trainer, args.seconds, args.steps, args.warmup)
        print(json.dumps(result), flush=True)
        return

    import devcluster_module

    results: dict[str, list[dict]] = {name: [] for name in SETUPS}
    with devcluster_module.load().HostNetwork(3, prefix=PREFIX, subnet=SUBNET) as net:
        for _ in range(args.repeat):
            for name in SETUPS:
                results[name].append(run_setup(net, name, args.seconds, args.steps, args.warmup))
    keys = ("frames_per_s", "cpu_us_per_frame", "requests_per_s", "cpu_us_per_request", "push_ms")
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in keys} for name, runs in results.items()}
    print(f"{NODES} nodes x {PER_NODE} local workers vs {NODES * PER_NODE} flat workers, CartPole-v1, "
          f"sync batches of {NODES * PER_NODE} x {args.steps} frames, medians of {args.repeat} turns each")
    print(f"{'':24}{'flat':>12}{'nodes':>12}{'nodes/flat':>12}")
    for key in keys:
        flat, node = medians["flat"][key], medians["nodes"][key]
        print(f"{key:24}{flat:12.1f}{node:12.1f}{node / flat:12.2f}")
    print(json.dumps({"medians": medians, "runs": results}))


if __name__ == "__main__":
    main()
