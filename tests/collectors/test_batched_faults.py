"""``AsyncBatchedCollector`` when an env or the policy misbehaves: a replaced env worker's cut is
marked on the frames, and entries that change their shape mid-run are clear errors."""
from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import AsyncBatchedCollector, Collector, GymEnv, WorkerError, WorkerRestartWarning
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(180)]

FRAME_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
              ("next", "terminated"), ("next", "truncated")]


class CrashOnceEnv(CountEnv):
    """``CountEnv`` whose ``fail_at``-th step ends its worker (``how="exits"``) or raises
    (``"raises"``), once per ``marker`` file: its replacement steps on."""

    def __init__(self, marker: str, how: str, fail_at: int) -> None:
        super().__init__()
        self.marker, self.how, self.fail_at, self.steps = marker, how, fail_at, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            if self.how == "exits":
                os._exit(3)
            raise RuntimeError("the simulator lost its licence")
        return super().step(action)


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def per_env(batch, env: int):
    return batch[batch["env_index"] == env]


def reference(frames: int):
    """``frames`` frames of one ``CountEnv`` from its start, from a single-process ``Collector``."""
    collector = Collector(count_env, BiasPolicy(1, size=3), frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def assert_same_frames(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for key in FRAME_KEYS:
        assert torch.equal(ours[key], theirs[key].to(ours[key].dtype)), key


def assert_segments_continuous(steps) -> None:
    """Between two frames marked done, an env's frames are one episode's consecutive steps."""
    ends = steps["next", "done"][:, 0].nonzero()[:, 0].tolist()
    for start, stop in zip([0] + [e + 1 for e in ends], ends + [len(steps)]):
        part = steps[start:stop]
        if not len(part):
            continue
        obs = part["observation"]
        assert (obs[:, 1] == obs[0, 1]).all(), f"frames {start}..{stop - 1} mix episodes {obs[:, 1].tolist()}"
        assert torch.equal(obs[:, 0], obs[0, 0] + torch.arange(len(part))), f"t jumps in frames {start}..{stop - 1}"
        assert torch.equal(part["next", "observation"][:-1], obs[1:])


@pytest.mark.parametrize("how, frames_per_batch", [("exits", 1), ("exits", 5), ("raises", 4)])
def test_a_replaced_env_ends_its_episode_truncated_where_it_was_cut(tmp_path, how, frames_per_batch):
    # env 1 fails at its 7th step, in its second episode (t=3 of 5): its 6 steps before, then a new env from t=0
    fail_at, after = 7, 12
    marker = str(tmp_path / "crashed")
    factories = [count_env, lambda: GymEnv(CrashOnceEnv(marker, how, fail_at)), count_env]
    batches, deadline = [], time.monotonic() + 120
    with pytest.warns(WorkerRestartWarning, match="env worker 1"):
        with AsyncBatchedCollector(factories, policy=BiasPolicy(1, size=3), frames_per_batch=frames_per_batch,
                                   max_worker_restarts=1) as c:
            while time.monotonic() < deadline:  # until env 1 made `after` steps after the cut
                batches.append(c.next().clone())
                if sum(int((b["env_index"] == 1).sum()) for b in batches) >= fail_at - 1 + after:
                    break
            assert c.roster.counts == [0, 1, 0]
    whole = torch.cat(batches)
    theirs = reference(max(len(per_env(whole, env)) for env in range(3)))  # the other envs may step on
    steps = per_env(whole, 1)
    before, cut = steps[:fail_at - 1], steps[fail_at - 1:]
    assert len(cut) >= after
    expected = theirs[:fail_at - 1].clone()  # the same steps, the last one marked: the episode ends there
    assert not expected["next", "done"][-1].any()
    expected["next", "done"][-1] = True
    expected["next", "truncated"][-1] = True
    assert_same_frames(before, expected)
    assert_same_frames(cut, theirs[:len(cut)])  # the replacement's env, from its first reset
    for env in range(3):
        assert_segments_continuous(per_env(whole, env))
    for env in (0, 2):
        mine = per_env(whole, env)
        assert_same_frames(mine, theirs[:len(mine)])


class ShrinkingEnv(CountEnv):
    """``CountEnv`` whose observations keep only their first entry from its ``at``-th step on."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.steps = at, 0

    def step(self, action):
        self.steps += 1
        obs, *rest = super().step(action)
        return (obs[:1] if self.steps >= self.at else obs), *rest


def test_an_observation_that_changes_its_shape_is_an_error_naming_the_key_and_shapes():
    factories = [count_env, lambda: GymEnv(ShrinkingEnv(at=5))]
    batches = []
    with AsyncBatchedCollector(factories, policy=BiasPolicy(1, size=3), frames_per_batch=10) as c:
        with pytest.raises(WorkerError, match="collector worker 1 .*raised in its env") as info:
            deadline = time.monotonic() + 60  # env 1's 5th step comes however the envs are scheduled
            while time.monotonic() < deadline:
                batches.append(c.next().clone())
    assert "env 1 gave ('next', 'observation') of shape [1]; accepted: shape [3]" in info.value.remote_traceback
    if batches:  # nothing was broadcast before: env 1's frames are its first four steps
        mine = per_env(torch.cat(batches), 1)
        assert len(mine) <= 4
        assert_same_frames(mine, reference(4)[:len(mine)])


class ReshapingPolicy(nn.Module):
    """Picks action 1; from its ``at``-th forward pass on, returns it one-hot (shape ``[n, 2]``)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        action = torch.ones(observation.shape[0], dtype=torch.int64)
        return nn.functional.one_hot(action, 2) if self.calls >= self.at else action


def test_an_action_that_changes_its_shape_is_an_error_naming_the_key_and_shapes():
    with AsyncBatchedCollector([count_env] * 2, policy=ReshapingPolicy(at=6), frames_per_batch=4) as c:
        with pytest.raises(ValueError, match=r"the policy returned 'action' of shape \[(\d), 2\] for \1 envs; "
                                             r"accepted: shape \[\1\], as at start-up \(\[\] per env\)"):
            for _ in range(20):
                c.next()
