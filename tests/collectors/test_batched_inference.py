"""``AsyncBatchedCollector``: envs in worker processes, one batched policy in the trainer's process."""
from __future__ import annotations

import os
import signal
import time
import traceback
import warnings

import gymnasium as gym
import pytest
import torch
from torch import nn

from conftest import CountEnv
from continuity import assert_env_steps_continue
from rpc_collectors import AsyncBatchedCollector, GymEnv, WorkerError, WorkerRestartWarning
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

KEYS = {"observation", "action", "done", "terminated", "truncated", "env_index", "policy_version",
        ("next", "observation"), ("next", "reward"), ("next", "done"), ("next", "terminated"), ("next", "truncated")}


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


class FailingEnv(CountEnv):
    """Raises at its ``fail_at``-th step."""

    def __init__(self, fail_at: int = 7) -> None:
        super().__init__()
        self.fail_at, self.steps = fail_at, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise ValueError("the simulator broke")
        return super().step(action)


class FailingPolicy(nn.Module):
    """A policy whose ``fail_at``-th forward pass raises."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.linear, self.calls, self.fail_at = nn.Linear(3, 2), 0, fail_at

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ZeroDivisionError("the policy divided by zero")
        return self.linear(observation).argmax(-1)


def per_env(batch, env: int):
    return batch[batch["env_index"] == env]


def test_batches_hold_each_envs_transitions_in_order():
    with AsyncBatchedCollector([count_env] * 3, policy=BiasPolicy(1, size=3), frames_per_batch=12,
                               total_frames=60, max_batch_size=2) as c:
        held, batches = [], []
        for batch in c:
            held.append(batch)
            batches.append(batch.clone())
        record = c.last_batch
    assert [b.shape for b in batches] == [torch.Size([12])] * 5
    assert all((a == b).all() for a, b in zip(held, batches))  # none was written over while it was held
    assert set(batches[0].keys(include_nested=True, leaves_only=True)) == KEYS
    whole = torch.cat(batches)
    assert (whole["action"] == 1).all() and (whole["policy_version"] == 0).all()
    assert not whole["done"].any() and not whole["terminated"].any()
    # first ready, first served: on a loaded machine an env may not step at all in 60 frames
    assert whole["env_index"].dtype == torch.int64 and set(whole["env_index"].tolist()) <= {0, 1, 2}
    for env in set(whole["env_index"].tolist()):
        steps = per_env(whole, env)
        # the env's own sequence: t counts up within an episode, the next observation is the
        # following step's observation unless the episode ended (then t restarts at 0)
        assert (steps["next", "observation"][:, 0] == steps["observation"][:, 0] + 1).all()
        assert (steps["next", "observation"][:, 2] == 1).all()  # the action the env received
        assert_env_steps_continue(steps)
        assert torch.equal(steps["next", "reward"][:, 0], steps["next", "observation"][:, 0])
        assert torch.equal(steps["next", "done"], steps["next", "terminated"] | steps["next", "truncated"])
    assert record.iteration == 5 and record.frames == 12 and record.lag == 0
    assert sum(record.worker_frames.values()) == 12


def test_an_update_is_used_from_the_next_forward_pass_on():
    with AsyncBatchedCollector([count_env] * 4, policy=BiasPolicy(0, size=3), frames_per_batch=16,
                               total_frames=-1) as c:
        first = c.next().clone()
        c.update_policy_weights_(BiasPolicy(1, size=3))  # copied in between two forward passes
        after = [c.next().clone() for _ in range(3)]
        assert c.policy_version == 1 and c.last_batch.trainer_version == 1
    assert (first["action"] == 0).all()
    for batch in after:  # each frame's action is the one its stamped version chooses
        assert torch.equal(batch["action"], batch["policy_version"])
    # old actions are those of the batch waiting when the update came (prefetch=1), the one being
    # filled and one step in flight per env: the third batch holds new ones; within each env, once
    # the new weights acted, the old ones never act again
    assert (after[-1]["policy_version"] == 1).any() and c.last_batch.newest_version == 1
    whole = torch.cat(after)
    for env in range(4):
        versions = per_env(whole, env)["policy_version"]
        assert (versions.diff() >= 0).all()


def test_policy_version_key_none_leaves_the_key_out_but_keeps_the_record():
    with AsyncBatchedCollector(count_env, num_envs=2, policy=BiasPolicy(1, size=3), frames_per_batch=8,
                               total_frames=20, policy_version_key=None, policy_version=5) as c:
        batches = list(c)
    assert [b.numel() for b in batches] == [8, 8, 4]  # the last batch is cut at total_frames, as TorchRL's
    assert "policy_version" not in batches[0].keys() and "_policy_version" not in batches[0].keys()
    assert c.last_batch.oldest_version == c.last_batch.newest_version == 5


def test_a_killed_env_worker_is_a_worker_error_naming_it():
    c = AsyncBatchedCollector([count_env] * 3, policy=BiasPolicy(1, size=3), frames_per_batch=9)
    try:
        c.next()
        os.kill(c.pool.worker_pids[1], signal.SIGKILL)
        with pytest.raises(WorkerError, match="collector worker 1 .*SIGKILL") as info:
            for _ in range(100):
                c.next()
        assert info.value.worker_id == 1
        with pytest.raises(StopIteration):  # the run ended with the error
            c.next()
        with pytest.raises(RuntimeError, match="was shut down"):
            next(iter(c))
    finally:
        c.shutdown()
        c.shutdown()


def test_a_killed_env_worker_is_replaced_within_max_worker_restarts():
    with AsyncBatchedCollector([count_env] * 3, policy=BiasPolicy(1, size=3), frames_per_batch=9,
                               max_worker_restarts=1) as c:
        c.next()
        old = c.pool.worker_pids[2]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            os.kill(old, signal.SIGKILL)
            deadline, back, after = time.monotonic() + 60, False, 0
            while not back and time.monotonic() < deadline:  # the replacement's steps come
                batch = c.next()
                after += c.pool.worker_pids.get(2, old) != old  # past the old one's steps (no pid while its successor starts)
                back = after > 2 and 2 in batch["env_index"].tolist()
        assert back and c.roster.counts == [0, 0, 1]
    assert any(issubclass(w.category, WorkerRestartWarning) and "env worker 2" in str(w.message) for w in caught)


def test_an_env_that_raises_is_a_worker_error_with_its_traceback():
    with AsyncBatchedCollector([count_env, lambda: GymEnv(FailingEnv())], policy=BiasPolicy(1, size=3),
                               frames_per_batch=4) as c:
        with pytest.raises(WorkerError, match="collector worker 1 .*raised in its env") as info:
            for _ in range(50):
                c.next()
    assert "ValueError: the simulator broke" in info.value.remote_traceback


def test_a_policy_exception_surfaces_once_with_its_traceback():
    c = AsyncBatchedCollector([count_env] * 2, policy=FailingPolicy(fail_at=20), frames_per_batch=4)
    try:
        with pytest.raises(ZeroDivisionError, match="divided by zero") as info:
            for _ in range(50):
                c.next()
        frames = traceback.extract_tb(info.value.__traceback__)
        assert any(frame.name == "forward" and frame.filename == __file__ for frame in frames)
        with pytest.raises(StopIteration):  # not the same error again: the run ended with it
            c.next()
    finally:
        c.shutdown()


def test_seeded_envs_repeat_their_episodes_from_the_next_reset_on():
    def run() -> list:
        batches, deadline = [], time.monotonic() + 60
        with AsyncBatchedCollector(lambda: GymEnv("CartPole-v1"), num_envs=2, policy=BiasPolicy(1), frames_per_batch=20,
                                   total_frames=-1) as c:
            c.set_seed(7)
            while time.monotonic() < deadline:  # until each env ran 5 steps into its second episode
                batches.append(c.next().clone())
                whole = torch.cat(batches)
                starts = [second_episode(per_env(whole, env)) for env in (0, 1)]
                if all(start is not None and len(per_env(whole, env)) >= start + 5 for env, start in enumerate(starts)):
                    break
        return [per_env(whole, env)["observation"][start:start + 5] for env, start in enumerate(starts)]

    first, second = run(), run()
    assert all(len(a) == 5 for a in first)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first[0], first[1])  # env i is seeded with seed + i


def second_episode(steps) -> int | None:
    """Where the episode after an env's first reset since start-up begins (None: not yet)."""
    ends = steps["next", "done"][:, 0].nonzero()
    return int(ends[0]) + 1 if len(ends) else None


@pytest.mark.parametrize("kwargs, error, match", [
    ({"env_backend": "threading"}, ValueError, "env_backend='threading' is not supported.*accepted: None or 'multiprocessing'"),
    ({"policy_backend": "ray"}, ValueError, "policy_backend='ray' is not supported"),
    ({"transport": object()}, ValueError, "transport=<object.*accepted: None, 'auto' or 'driver'"),
    ({"envs_per_worker": 0}, ValueError, "envs_per_worker=0 is invalid; accepted: an int > 0"),
    ({"envs_per_worker": True}, ValueError, "envs_per_worker=True is invalid; accepted: an int > 0"),
    ({"num_threads": 0}, ValueError, "num_threads=0 is invalid; accepted: an int > 0"),
    ({"num_threads": 1.5}, ValueError, "num_threads=1.5 is invalid; accepted: an int > 0"),
    ({"transition_chunk_size": 64}, ValueError, "transition_chunk_size=64 is not supported"),
    ({"yield_completed_trajectories": True}, ValueError, "yield_completed_trajectories=True is not supported"),
    ({"max_batch_size": 2, "min_batch_size": 3}, ValueError, "min_batch_size=3 exceeds max_batch_size=2"),
    ({"max_batch_size": 4, "min_batch_size": 3}, ValueError,
     r"min_batch_size=3 exceeds the 2 envs.*accepted: at most num_envs \(2\)"),
    ({"server_timeout": -1}, ValueError, "server_timeout=-1 is invalid"),
    ({"policy_factory": lambda: BiasPolicy(1, size=3)}, TypeError, "mutually exclusive"),
    ({"policy": None}, TypeError, "one of policy or policy_factory"),
    ({"create_env_kwargs": [{}]}, ValueError, "create_env_kwargs=\\[\\{\\}\\] is invalid.*list of 2 dicts"),
    ({"num_envs": 3}, ValueError, "num_envs=3 does not match the 2 env factories"),
    ({"max_policy_lag": 0}, ValueError, "max_policy_lag=0 is not supported.*accepted: None .no bound. or an int >= 1"),
    ({"max_policy_lag": 1.0}, ValueError, "max_policy_lag=1.0 is not supported"),
    ({"max_policy_lag": 2, "policy_lag_mode": "drop"}, ValueError,
     "policy_lag_mode='drop' is not supported: a dropped batch would leave a gap.*accepted: 'admit'"),
    ({"max_policy_lag": 1, "frames_per_batch": 1}, ValueError,
     "max_policy_lag=1 is not supported: each of the 2 envs holds its latest transition.*"
     "accepted: None, or an int >= num_envs / frames_per_batch = 2 / 1"),
])
def test_arguments_that_cannot_map_are_refused_before_any_process_starts(kwargs, error, match):
    from procs import descendants

    before = descendants()
    args = {"policy": BiasPolicy(1, size=3), "frames_per_batch": 8, **kwargs}
    with pytest.raises(error, match=match):
        AsyncBatchedCollector([count_env] * 2, **args)
    assert not descendants() - before - _spawner()


def _spawner() -> set:
    from rpc_collectors.worker.spawner import shared_pid

    return {shared_pid()} - {None}


def test_one_factory_needs_num_envs_and_a_vector_env_is_refused():
    with pytest.raises(TypeError, match="one factory and num_envs is None"):
        AsyncBatchedCollector(count_env, policy=BiasPolicy(1, size=3), frames_per_batch=8)
    with pytest.raises(TypeError, match="not a vector env"):
        AsyncBatchedCollector(lambda: GymEnv("CartPole-v1", num_envs=2), num_envs=1, policy=BiasPolicy(1),
                              frames_per_batch=8)


def test_a_policy_returning_logits_is_refused_with_the_shapes():
    with pytest.raises(ValueError, match=r"action of shape \[2\].*needs shape \[\]"):
        AsyncBatchedCollector([lambda: gym.make("CartPole-v1")], policy=nn.Linear(4, 2), frames_per_batch=8)


def broken_factory() -> GymEnv:
    raise OSError("the simulator license server is down")


def test_an_env_factory_that_raises_is_a_worker_error_at_start_up():
    with pytest.raises(WorkerError, match="collector worker 1 .*raised an error during start-up") as info:
        AsyncBatchedCollector([count_env, broken_factory], policy=BiasPolicy(1, size=3), frames_per_batch=8)
    assert "license server is down" in info.value.remote_traceback


class ListBuffer:
    """A replay buffer that keeps what it is given."""

    def __init__(self) -> None:
        self.batches = []

    def extend(self, batch) -> None:
        self.batches.append(batch.clone())


def test_background_collection_into_a_replay_buffer():
    buffer = ListBuffer()
    c = AsyncBatchedCollector([count_env] * 2, policy=BiasPolicy(1, size=3), frames_per_batch=8, replay_buffer=buffer)
    c.start()
    deadline = time.monotonic() + 60
    while len(buffer.batches) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    c.async_shutdown(timeout=30)
    assert len(buffer.batches) >= 3 and all(b.shape == (8,) and (b["action"] == 1).all() for b in buffer.batches)


class SlowEnv(CountEnv):
    """Each step sleeps 10 ms."""

    def step(self, action):
        time.sleep(0.01)
        return super().step(action)


def test_shutdown_from_another_thread_ends_a_wait_for_a_batch():
    import threading

    c = AsyncBatchedCollector([lambda: GymEnv(SlowEnv())] * 2, policy=BiasPolicy(1, size=3), frames_per_batch=100_000)
    stopper = threading.Timer(0.5, c.shutdown)
    stopper.start()
    try:
        with pytest.raises(RuntimeError, match="was shut down"):
            c.next()
    finally:
        stopper.join(30)
        c.shutdown()
