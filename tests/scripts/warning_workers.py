"""A user script whose env warns (a FutureWarning at construction and at every step):
``python warning_workers.py KIND FILTER [RAY_TEMP_DIR]``. FILTER is the trainer's ``warnings`` filter
for it, set once this process already ran a collector (so its workers' spawner runs): ``none``,
``always`` (show each) or ``error`` (raise). Prints "frames N", or "raised: MESSAGE" where a
worker raised."""
from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np

from rpc_collectors import AsyncBatchedCollector, MultiSyncCollector, RandomPolicy, RPCCollector, WorkerError

MESSAGE = "the env warns"


class WarningEnv(gym.Env):
    """Counts up; warns when made and at every step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        warnings.warn(f"{MESSAGE} at construction", FutureWarning, stacklevel=2)
        self.count = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        warnings.warn(f"{MESSAGE} at step", FutureWarning, stacklevel=2)
        self.count += 1
        return np.full(1, self.count, np.float32), 0.0, False, self.count % 5 == 0, {}


def make_env():
    from rpc_collectors import GymEnv

    return GymEnv(WarningEnv())


def ray_collector(temp: str):
    from rpc_collectors.collectors.ray import RayCollector

    return RayCollector([make_env] * 2, None, frames_per_batch=20, remote_configs={"num_cpus": 1, "memory": 2**30},
                        ray_init_config={"address": "local", "num_cpus": 2, "include_dashboard": False,
                                         "_node_ip_address": "127.0.0.1", "_temp_dir": temp})


KINDS = {
    "multi-sync": lambda: MultiSyncCollector([make_env] * 2, None, frames_per_batch=20, total_frames=40),
    "rpc-node": lambda: RPCCollector([make_env], None, frames_per_batch=20, total_frames=40, collector_class="sync",
                                     num_workers_per_collector=2),
    "async-batched": lambda: AsyncBatchedCollector([make_env] * 2, policy=RandomPolicy(WarningEnv.action_space),
                                                   frames_per_batch=20, total_frames=40),
    "ray": lambda: ray_collector(sys.argv[3]),
}

if __name__ == "__main__":
    kind, user_filter = sys.argv[1], sys.argv[2]
    if kind != "ray":  # the shared spawner starts with this process's filters of then
        with MultiSyncCollector([lambda: gym.make("CartPole-v1")] * 2, None, frames_per_batch=10, total_frames=10) as c:
            next(iter(c))
    if user_filter != "none":
        warnings.filterwarnings(user_filter, message=MESSAGE, category=FutureWarning)
    try:
        collector = KINDS[kind]()
        frames = 0
        for batch in collector:
            frames += batch.numel()
            if frames >= 40:
                break
        collector.shutdown()
    except WorkerError as err:
        print("raised:", next(line for line in str(err).splitlines() if MESSAGE in line), flush=True)
    else:
        print("frames", frames, flush=True)
