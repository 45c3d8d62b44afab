"""``AsyncBatchedCollector`` with several envs per env worker (``envs_per_worker``), stepped in two
alternating halves, and its inference thread's torch threads (``num_threads``)."""
from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import AsyncBatchedCollector, GymEnv, WorkerRestartWarning
from test_batched_faults import CrashOnceEnv, assert_same_frames, assert_segments_continuous, count_env, per_env, reference
from test_batched_inference import second_episode
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(180)]


@pytest.mark.parametrize("envs_per_worker, num_envs", [(2, 4), (3, 5)])  # 5 envs by 3: workers of 3 and 2
def test_each_env_of_a_worker_steps_as_in_a_single_process_collector(envs_per_worker, num_envs):
    with AsyncBatchedCollector([count_env] * num_envs, policy=BiasPolicy(1, size=3), frames_per_batch=10,
                               total_frames=120, envs_per_worker=envs_per_worker) as c:
        assert len(c.pool.worker_pids) == len(set(c.pool.worker_pids)) == 2
        batches = [batch.clone() for batch in c]
        record = c.last_batch
    assert [b.shape for b in batches] == [torch.Size([10])] * 12
    assert record.frames == 10 and sum(record.worker_frames.values()) == 10
    whole = torch.cat(batches)
    theirs = reference(max(len(per_env(whole, env)) for env in range(num_envs)))
    for env in range(num_envs):  # frame for frame, each env from its first reset
        mine = per_env(whole, env)
        assert_same_frames(mine, theirs[:len(mine)])


class LoggedEnv(CountEnv):
    """``CountEnv`` that appends its name to ``path`` at each step (in the order its worker steps)."""

    def __init__(self, path: str, name: str) -> None:
        super().__init__()
        self.path, self.name = path, name

    def step(self, action):
        with open(self.path, "a") as log:
            log.write(self.name)
        return super().step(action)


def test_a_worker_steps_its_two_halves_in_turn(tmp_path):
    # one worker of 3 envs: halves [0, 1] and [2]; each half steps once per turn, the halves alternate
    path = str(tmp_path / "steps")
    factories = [lambda name=name: GymEnv(LoggedEnv(path, name)) for name in "abc"]
    with AsyncBatchedCollector(factories, policy=BiasPolicy(1, size=3), frames_per_batch=6, total_frames=60,
                               envs_per_worker=3, max_batch_size=1) as c:
        assert len(c.pool.worker_pids) == 1
        batches = [batch.clone() for batch in c]
    with open(path) as log:
        order = log.read()
    assert len(order) >= 60 and order[:len(order) // 3 * 3] == "abc" * (len(order) // 3)
    whole = torch.cat(batches)
    for env in range(3):
        assert_segments_continuous(per_env(whole, env))


def test_each_frames_version_names_the_weights_that_chose_its_action():
    with AsyncBatchedCollector([count_env] * 4, policy=BiasPolicy(0, size=3), frames_per_batch=16,
                               envs_per_worker=2) as c:
        before = [c.next().clone() for _ in range(2)]
        c.update_policy_weights_(BiasPolicy(1, size=3))
        after = [c.next().clone() for _ in range(4)]
    whole = torch.cat(before + after)
    assert (torch.cat(before)["action"] == 0).all() and (after[-1]["policy_version"] == 1).any()
    assert torch.equal(whole["action"], whole["policy_version"])
    for env in range(4):
        mine = per_env(whole, env)
        assert (mine["policy_version"].diff() >= 0).all()
        assert_segments_continuous(mine)


def _cut_at(steps) -> int:
    """Where a replaced env's stream starts again from its first reset (episode 0, t 0)."""
    obs = steps["observation"]
    starts = [i for i in range(1, len(steps)) if obs[i, 0] == 0 and obs[i, 1] == 0]
    assert starts, "the stream has no cut"
    return starts[0]


def _marked(frames):
    """``frames`` with their last one ending its episode where the stream was cut."""
    frames = frames.clone()
    if not frames["next", "done"][-1].any():
        frames["next", "truncated"][-1] = True
    frames["next", "done"][-1] = True
    return frames


@pytest.mark.parametrize("how", ["exits", "raises"])
def test_a_replaced_worker_cuts_every_env_it_stepped_and_marks_each_cut(tmp_path, how):
    # worker 0 steps envs 0 and 1; env 1 fails at its 7th step: both envs start again from a reset
    fail_at, after = 7, 8
    marker = str(tmp_path / "crashed")
    factories = [count_env, lambda: GymEnv(CrashOnceEnv(marker, how, fail_at)), count_env, count_env]
    batches, deadline = [], time.monotonic() + 120
    with pytest.warns(WorkerRestartWarning, match="env worker 0"):
        with AsyncBatchedCollector(factories, policy=BiasPolicy(1, size=3), frames_per_batch=4,
                                   envs_per_worker=2, max_worker_restarts=1) as c:
            while time.monotonic() < deadline:  # until envs 0 and 1 made `after` steps after the cut
                batches.append(c.next().clone())
                whole = torch.cat(batches)
                if os.path.exists(marker) and all(len(per_env(whole, env)) >= fail_at + after for env in (0, 1)):
                    break  # each of the two had at most fail_at steps before the cut
            assert c.roster.counts == [1, 0]
    whole = torch.cat(batches)
    theirs = reference(max(len(per_env(whole, env)) for env in range(4)))
    steps = per_env(whole, 1)
    assert _cut_at(steps) == fail_at - 1  # its 6 steps before, then the replacement's env
    for env in (0, 1):
        mine = per_env(whole, env)
        cut = _cut_at(mine)
        assert cut >= fail_at - 1 and len(mine) - cut >= after
        assert_same_frames(mine[:cut], _marked(theirs[:cut]))
        assert_same_frames(mine[cut:], theirs[:len(mine) - cut])
    for env in (2, 3):  # the other worker's envs step on
        mine = per_env(whole, env)
        assert_same_frames(mine, theirs[:len(mine)])


def test_set_seed_seeds_each_env_of_a_worker_with_seed_plus_its_index():
    def second_episodes() -> list:
        batches, deadline = [], time.monotonic() + 60
        with AsyncBatchedCollector(lambda: GymEnv("CartPole-v1"), num_envs=3, policy=BiasPolicy(1),
                                   frames_per_batch=20, envs_per_worker=3) as c:
            assert c.set_seed(7) == 10
            while time.monotonic() < deadline:  # until each env ran 5 steps into its second episode
                batches.append(c.next().clone())
                whole = torch.cat(batches)
                starts = [second_episode(per_env(whole, env)) for env in range(3)]
                if all(s is not None and len(per_env(whole, env)) >= s + 5 for env, s in enumerate(starts)):
                    break
        return [per_env(whole, env)["observation"][s:s + 5] for env, s in enumerate(starts)]

    first, second = second_episodes(), second_episodes()
    assert all(len(a) == 5 for a in first) and all(torch.equal(a, b) for a, b in zip(first, second))
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])


class ThreadsPolicy(nn.Module):
    """Action 1; records the torch threads of each inference-thread forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.seen = nn.Linear(3, 2), []

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "rpc-collectors-inference":
            self.seen.append(torch.get_num_threads())
        return torch.ones(observation.shape[0], dtype=torch.int64)


@pytest.mark.parametrize("num_threads", [1, None])
def test_the_inference_thread_runs_with_its_threads_and_yours_keep_theirs(num_threads):
    from rpc_collectors.trainer.threads import inference_threads

    own = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy = ThreadsPolicy()
        with AsyncBatchedCollector([count_env] * 2, policy=policy, frames_per_batch=8, total_frames=40,
                                   num_threads=num_threads) as c:
            batches = [batch.clone() for batch in c]
            mine = torch.get_num_threads()
            later: list[int] = []
            thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
            thread.start()
            thread.join(30)
        expected = 1 if num_threads == 1 else inference_threads(None, 2, 2)
        assert c.num_threads == expected and len(batches) == 5
        assert policy.seen and set(policy.seen) == {expected}
        assert mine == 2 and later == [2]  # this thread's count, and the one new threads begin with
    finally:
        torch.set_num_threads(own)
