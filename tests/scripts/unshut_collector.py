"""A user script that builds a collector, takes a few batches and ends without ``shutdown()``:
``python unshut_collector.py KIND [RAY_TEMP_DIR]``. What it leaves is the collector's finalizer's to close
at interpreter exit. It prints "done" on stdout once its last batch arrived."""
from __future__ import annotations

import sys

import gymnasium as gym

from rpc_collectors import (
    AsyncBatchedCollector,
    Collector,
    DistributedCollector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RandomPolicy,
    RPCCollector,
)

BATCHES = 3


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


def ray_collector(temp: str, own: bool):
    import ray

    from rpc_collectors.collectors.ray import RayCollector

    local = {"num_cpus": 2, "include_dashboard": False, "_node_ip_address": "127.0.0.1", "_temp_dir": temp}
    if not own:  # the user's Ray, started before the collector, which attaches to it
        ray.init(address="local", **local)
    return RayCollector([cartpole], None, frames_per_batch=20, remote_configs={"num_cpus": 1, "memory": 2**30},
                        ray_init_config={"address": "local", **local} if own else None)


KINDS = {
    "collector": lambda: Collector(cartpole, None, frames_per_batch=20),
    "multi-sync": lambda: MultiSyncCollector([cartpole] * 2, None, frames_per_batch=20),
    "multi-async": lambda: MultiAsyncCollector([cartpole] * 2, None, frames_per_batch=20),
    "rpc-node": lambda: RPCCollector([cartpole], None, frames_per_batch=20, collector_class="sync",
                                     num_workers_per_collector=2),
    "distributed-mp": lambda: DistributedCollector([cartpole] * 2, None, frames_per_batch=20, launcher="mp"),
    "async-batched": lambda: AsyncBatchedCollector([cartpole] * 2, policy=RandomPolicy(gym.spaces.Discrete(2)),
                                                     frames_per_batch=20),
    "ray-own": lambda: ray_collector(sys.argv[2], own=True),
    "ray-user": lambda: ray_collector(sys.argv[2], own=False),
    "ray-gone": lambda: ray_collector(sys.argv[2], own=False),  # the user stops their Ray at the end
}

if __name__ == "__main__":
    collector = KINDS[sys.argv[1]]()
    for i, _batch in enumerate(collector):
        if i + 1 == BATCHES:
            break
    if sys.argv[1] == "ray-gone":
        import ray

        ray.shutdown()
    print("done", flush=True)
