"""Several multi-worker collectors alive in one process, each with its own workers, weights and data.

``TagEnv`` stamps every observation with its collector's tag, its worker and a per-process step
counter, so a test can tell from a batch alone whose env stepped it, and whether any frame was
lost or repeated; ``BiasPolicy`` picks the action its weights say, so a batch shows whose
weights collected it.
"""
from __future__ import annotations

import gc
import weakref

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from procs import wait_gone
from rpc_collectors import GymEnv, MultiCollector, RPCCollector

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

VERSION, WORKER = ("collector", "policy_version"), ("collector", "worker_id")


class TagEnv(gym.Env):
    """Observation ``[tag, worker, step counter, 0 ...]`` (``size`` floats); episodes of 7 steps."""

    metadata: dict = {"render_modes": []}

    def __init__(self, tag: int, worker: int, size: int) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.tag, self.worker, self.size = tag, worker, size
        self.counter = self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size, np.float32)
        obs[:3] = self.tag, self.worker, self.counter
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.counter += 1
        self.t += 1
        return self._obs(), 1.0, False, self.t == 7, {}


class BiasPolicy(nn.Module):
    """Action = argmax(b): the bias alone decides the action."""

    def __init__(self, size: int, action: int = 0) -> None:
        super().__init__()
        self.linear = nn.Linear(size, 2)
        self.set_action(action)

    def set_action(self, action: int) -> None:
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.copy_(torch.tensor([1.0, 0.0]) if action == 0 else torch.tensor([0.0, 1.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def tag_envs(tag: int, size: int, workers: int = 2) -> list:
    return [lambda i=i: GymEnv(TagEnv(tag, i, size)) for i in range(workers)]


def check(batch, tag: int, size: int, action: int, version: int) -> None:
    """Every row is one of this collector's workers stepping its own env, frames consecutive,
    with the weights this collector pushed last."""
    rows = list(batch.unbind(0)) if batch.batch_dims == 2 else [batch]
    for row in rows:
        obs = row["observation"]
        assert obs.shape[-1] == size, "a batch of another collector's env"
        assert (obs[:, 0] == tag).all(), "a frame of another collector's env"
        assert (obs[:, 1] == row[WORKER]).all(), "a frame of another worker"
        assert (obs[:, 2].diff() == 1).all(), "frames missing or repeated"
        assert (row["action"] == action).all(), "collected with another collector's weights"
        assert (row[VERSION] == version).all()


def test_sync_and_async_collectors_side_by_side_each_with_its_own_workers_and_weights():
    train_policy, eval_policy = BiasPolicy(4), BiasPolicy(200)  # the eval env's batches go through shared memory
    train = MultiCollector(tag_envs(1, 4), train_policy, frames_per_batch=40, sync=True, rpc_timeout=30)
    evaluate = MultiCollector(tag_envs(2, 200), eval_policy, frames_per_batch=100, sync=False, rpc_timeout=30)
    try:
        assert not {i["pid"] for i in train.infos} & {i["pid"] for i in evaluate.infos}
        train_it, eval_it = iter(train), iter(evaluate)
        versions = {"train": 0, "eval": 0}
        for step in range(6):
            check(next(train_it), 1, 4, action=versions["train"] % 2, version=versions["train"])
            for _ in range(2):  # async: a batch collected before the last push may still arrive
                batch = next(eval_it)
                assert int(batch[VERSION][0]) <= versions["eval"]
                check(batch, 2, 200, action=int(batch[VERSION][0]) % 2, version=int(batch[VERSION][0]))
            if step % 2 == 0:
                versions["train"] += 1
                train_policy.set_action(versions["train"] % 2)
                train.update_policy_weights_()
            else:
                versions["eval"] += 1
                eval_policy.set_action(versions["eval"] % 2)
                evaluate.update_policy_weights_()
        assert train.policy_version == versions["train"] and evaluate.policy_version == versions["eval"]
        assert evaluate._batches.path_of(0) == "shm" and train._batches.path_of(0) == "rpc"  # both data paths
    finally:
        train.shutdown()
        evaluate.shutdown()


def test_one_collector_shut_down_while_another_runs():
    first = MultiCollector(tag_envs(1, 4), BiasPolicy(4), frames_per_batch=40, rpc_timeout=30)
    second = MultiCollector(tag_envs(2, 4), BiasPolicy(4, 1), frames_per_batch=40, sync=False, rpc_timeout=30)
    try:
        first_it, second_it = iter(first), iter(second)
        check(next(first_it), 1, 4, action=0, version=0)
        check(next(second_it), 2, 4, action=1, version=0)
        gone = {info["pid"] for info in first.infos}
        first.shutdown()
        assert not wait_gone(gone, 10), "the first collector's workers outlived its shutdown"
        for _ in range(5):
            check(next(second_it), 2, 4, action=1, version=0)
        third = RPCCollector(tag_envs(3, 4), BiasPolicy(4), frames_per_batch=40, launcher="debug", cat_results="stack")
        with third:  # a debug collector beside local workers
            check(next(iter(third)), 3, 4, action=0, version=0)
            check(next(second_it), 2, 4, action=1, version=0)
    finally:
        first.shutdown()
        second.shutdown()


def test_a_collector_dropped_while_a_second_is_built():
    old = MultiCollector(tag_envs(1, 4), BiasPolicy(4), frames_per_batch=40, rpc_timeout=30)
    old_it = iter(old)
    check(next(old_it), 1, 4, action=0, version=0)
    pids, ref = {info["pid"] for info in old.infos}, weakref.ref(old)
    new = MultiCollector(tag_envs(2, 4), BiasPolicy(4, 1), frames_per_batch=40, rpc_timeout=30)
    try:
        del old, old_it  # still referenced while the new one was built; now dropped without shutdown()
        gc.collect()
        assert ref() is None, "the dropped collector is still alive"
        assert not wait_gone(pids, 10), "a dropped collector's workers kept running"
        check(next(iter(new)), 2, 4, action=1, version=0)
    finally:
        new.shutdown()
