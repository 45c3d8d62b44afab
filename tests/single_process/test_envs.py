"""GymEnv: gymnasium envs (id, instance, vector) behind TorchRL's TensorDict reset/step."""
from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from tensordict import TensorDict
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv, RandomPolicy

FLAGS = ("done", "terminated", "truncated")


class DictObsEnv(gym.Env):
    """Dict observation {"pos": Box(2), "count": Discrete(10)}; MultiDiscrete([3, 4]) actions.

    ``nested=True`` adds a Dict inside: ``{"inner": {"count": Discrete(10), "half": Box(1)}}``.
    """

    def __init__(self, reuse_arrays: bool = True, nested: bool = False) -> None:
        self.reuse_arrays, self.nested = reuse_arrays, nested
        spaces = {"pos": gym.spaces.Box(-10, 10, (2,), np.float32), "count": gym.spaces.Discrete(10)}
        if nested:
            spaces["inner"] = gym.spaces.Dict(
                {"count": gym.spaces.Discrete(10), "half": gym.spaces.Box(-10, 10, (1,), np.float32)}
            )
        self.observation_space = gym.spaces.Dict(spaces)
        self.action_space = gym.spaces.MultiDiscrete([3, 4])
        self.t = 0
        self.pos = np.zeros(2, np.float32)

    def _obs(self):
        # by default the same array every step: the adapter must copy
        obs = {"pos": self.pos if self.reuse_arrays else self.pos.copy(), "count": self.t}
        if self.nested:
            obs["inner"] = {"count": self.t, "half": np.array([self.t / 2], np.float32)}
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.pos[:] = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        self.pos[:] = action  # in place, on purpose
        return self._obs(), 1.0, self.t >= 4, False, {}


def check_reset(td: TensorDict, batch: tuple, obs_shape: tuple) -> None:
    assert td.batch_size == torch.Size(batch)
    assert td["observation"].shape == (*batch, *obs_shape)
    for key in FLAGS:
        assert td[key].shape == (*batch, 1) and td[key].dtype == torch.bool
        assert not td[key].any()


def check_step(td: TensorDict, batch: tuple, obs_shape: tuple) -> None:
    nxt = td["next"]
    assert nxt.batch_size == torch.Size(batch)
    assert nxt["observation"].shape == (*batch, *obs_shape)
    assert nxt["reward"].shape == (*batch, 1) and nxt["reward"].dtype == torch.float32
    for key in FLAGS:
        assert nxt[key].shape == (*batch, 1) and nxt[key].dtype == torch.bool
    assert torch.equal(nxt["done"], nxt["terminated"] | nxt["truncated"])


@pytest.mark.parametrize("make", [lambda: GymEnv("CartPole-v1"), lambda: GymEnv(gym.make("CartPole-v1"))])
def test_single_env_from_id_and_instance(make):
    env = make()
    assert env.batch_size == torch.Size([])
    td = env.reset()
    check_reset(td, (), (4,))
    assert td["observation"].dtype == torch.float32
    td = env.step(env.rand_action(td))
    check_step(td, (), (4,))
    assert td["action"].shape == () and td["action"].dtype == torch.int64
    assert td["next", "reward"].item() == 1.0
    env.close()


def test_vector_env_from_id_and_instance():
    env = GymEnv("CartPole-v1", num_envs=3)
    assert env.batch_size == torch.Size([3])
    check_reset(env.reset(), (3,), (4,))
    td = env.step(env.rand_action(env.reset()))
    check_step(td, (3,), (4,))
    assert td["action"].shape == (3,)

    vec = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    env = GymEnv(vec)
    assert env.batch_size == torch.Size([2])
    check_step(env.step(env.rand_action(env.reset())), (2,), (4,))


def test_box_actions_and_observations():
    env = GymEnv("Pendulum-v1", num_envs=2)
    td = env.rand_action(env.reset())
    assert td["action"].shape == (2, 1) and td["action"].dtype == torch.float32
    assert env.action_space.contains(td["action"][0].numpy())
    check_step(env.step(td), (2,), (3,))
    # a policy's Box action reaches the env: Pendulum's reward depends on the torque
    single = GymEnv("Pendulum-v1")
    rewards = []
    for torque in (0.0, 2.0):
        single.set_seed(0)
        td = single.reset()
        td["action"] = torch.tensor([torque])
        rewards.append(single.step(td)["next", "reward"].item())
    assert rewards[0] != rewards[1]


def test_dict_observations_nested_and_multidiscrete_actions():
    env = GymEnv(DictObsEnv())
    td = env.reset()
    assert set(td["observation"].keys()) == {"pos", "count"}
    assert td["observation", "pos"].shape == (2,) and td["observation", "count"].shape == ()
    td = env.rand_action(td)
    assert td["action"].shape == (2,) and td["action"].dtype == torch.int64
    assert env.action_space.contains(td["action"].numpy())
    td["action"] = torch.tensor([2, 3])
    td = env.step(td)
    assert td["next", "observation", "pos"].tolist() == [2.0, 3.0]
    assert td["next", "observation", "count"].item() == 1
    assert td["observation", "pos"].tolist() == [0.0, 0.0]  # not overwritten by the env's in-place update


def test_dict_observations_in_collector():
    """Each recorded step keeps its own observation even though the env reuses one array."""
    collector = Collector(lambda: GymEnv(DictObsEnv()), None, frames_per_batch=8)
    batch = collector.next()
    pos, next_pos, action = batch["observation", "pos"], batch["next", "observation", "pos"], batch["action"]
    assert torch.equal(next_pos, action.float())
    count = batch["next", "observation", "count"]
    assert count.tolist() == [1, 2, 3, 4, 1, 2, 3, 4]
    assert torch.equal(pos[1:4], next_pos[:3]) and not pos[4].any()
    collector.shutdown()


@pytest.mark.parametrize("mode", [AutoresetMode.DISABLED, AutoresetMode.SAME_STEP])
def test_vector_dict_observations_final(mode):
    # (gymnasium's own SAME_STEP final_obs would alias an array the env reuses: no reuse here)
    make = partial(DictObsEnv, reuse_arrays=False)
    env = GymEnv(SyncVectorEnv([make, make], autoreset_mode=mode))
    batch = Collector(env, None, frames_per_batch=2 * 10).next()
    assert batch["observation", "pos"].shape == (2, 10, 2)
    for i in range(2):
        assert batch[i]["next", "observation", "count"].tolist() == [1, 2, 3, 4] * 2 + [1, 2]
        assert batch[i]["observation", "count"].tolist() == [0, 1, 2, 3] * 2 + [0, 1]
        assert torch.equal(batch[i]["next", "observation", "pos"], batch[i]["action"].float())


def check_nested_counts(batch: TensorDict) -> None:
    """A batch of ``DictObsEnv(nested=True)`` steps: the nested Dict's leaves follow the step count."""
    for prefix in ((), ("next",)):
        count = batch[(*prefix, "observation", "count")]
        assert torch.equal(batch[(*prefix, "observation", "inner", "count")], count)
        assert torch.equal(batch[(*prefix, "observation", "inner", "half")], count.unsqueeze(-1).float() / 2)
    assert torch.equal(batch["next", "observation", "count"], batch["observation", "count"] + 1)
    assert set(batch["next", "observation", "count"].unique().tolist()) == {1, 2, 3, 4}


def test_nested_dict_observations_single_and_vector():
    make = partial(DictObsEnv, reuse_arrays=False, nested=True)
    check_nested_counts(Collector(lambda: GymEnv(make()), None, frames_per_batch=8).next())
    env = GymEnv(SyncVectorEnv([make, make], autoreset_mode=AutoresetMode.SAME_STEP))
    batch = Collector(env, None, frames_per_batch=2 * 8).next()
    assert batch["observation", "inner", "half"].shape == (2, 8, 1)
    check_nested_counts(batch)


def nested_dict_env() -> GymEnv:
    return GymEnv(DictObsEnv(reuse_arrays=False, nested=True))


class CountInputs(nn.Module):
    """A policy reading the nested Dict observation: action ``[count % 3, inner count % 4]``."""

    def forward(self, count: torch.Tensor, inner_count: torch.Tensor) -> torch.Tensor:
        return torch.stack([count % 3, inner_count % 4], -1)


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["MultiSyncCollector", "AsyncBatchedCollector"])
def test_nested_dict_observations_in_worker_processes(kind):
    from tensordict.nn import TensorDictModule

    import rpc_collectors

    policy = TensorDictModule(CountInputs(), in_keys=[("observation", "count"), ("observation", "inner", "count")],
                              out_keys=["action"])
    with getattr(rpc_collectors, kind)([nested_dict_env] * 2, policy=policy, frames_per_batch=16,
                                       total_frames=32) as collector:
        for batch in collector:
            check_nested_counts(batch)
            count = batch["observation", "count"]
            assert torch.equal(batch["action"], torch.stack([count % 3, count % 4], -1))


def test_random_policy():
    policy = RandomPolicy(gym.spaces.Box(-1, 1, (3,), np.float32))
    td = policy(TensorDict(batch_size=[4, 5]))
    assert td["action"].shape == (4, 5, 3) and td["action"].abs().max() <= 1
    td = RandomPolicy(gym.spaces.Discrete(3))(TensorDict())
    assert td["action"].shape == () and td["action"].item() in (0, 1, 2)
    with pytest.raises(TypeError, match="action_space"):
        RandomPolicy("Discrete(3)")


def test_discrete_one_hot_encoding():
    env = GymEnv("CartPole-v1", categorical_action_encoding=False)
    td = env.rand_action(env.reset())
    assert td["action"].shape == (2,) and td["action"].sum() == 1
    td["action"] = torch.tensor([0, 1])
    check_step(env.step(td), (), (4,))


@pytest.mark.parametrize("num_envs", [None, 4])
def test_rand_action_samples_the_action_space(num_envs):
    env = GymEnv("CartPole-v1", num_envs=num_envs)
    actions = torch.stack([env.rand_action()["action"] for _ in range(50)])
    assert actions.shape == (50, *env.batch_size)
    assert set(actions.unique().tolist()) == {0, 1}


@pytest.mark.parametrize("num_envs", [None, 3])
def test_set_seed_reproducible(num_envs):
    def run(seed):
        env = GymEnv("CartPole-v1", num_envs=num_envs)
        next_seed = env.set_seed(seed)
        tds = [env.reset()]
        for _ in range(5):
            tds.append(env.step(env.rand_action(tds[-1].exclude("next")))["next"])
        return next_seed, torch.stack([td["observation"] for td in tds])

    a, b, c = run(3), run(3), run(4)
    assert a[0] == b[0] == 3 + (num_envs or 1)
    assert torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_set_seed_seeds_actions():
    env = GymEnv("CartPole-v1", num_envs=4)
    env.set_seed(7)
    first = torch.stack([env.rand_action()["action"] for _ in range(10)])
    env.set_seed(7)
    assert torch.equal(first, torch.stack([env.rand_action()["action"] for _ in range(10)]))


def _argmax_policy():
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 2)
    return lambda obs: linear(obs).argmax(-1)


@pytest.mark.parametrize("mode", ["num_envs", AutoresetMode.DISABLED, AutoresetMode.SAME_STEP])
def test_vector_final_observation_matches_single_env(mode):
    """Env 0 of a vector env follows exactly the single env with the same seed and policy,
    including ("next", "observation") at done steps (the true final observation)."""
    policy = _argmax_policy()
    if mode == "num_envs":
        vec = GymEnv("CartPole-v1", num_envs=2)
    else:
        vec = GymEnv(gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                                  vector_kwargs={"autoreset_mode": mode}))
    frames = 400
    vec.set_seed(0)
    batch = Collector(vec, lambda td: td.set("action", policy(td["observation"])),
                      frames_per_batch=2 * frames).next()
    single = GymEnv("CartPole-v1")
    single.set_seed(0)
    ref = Collector(single, lambda td: td.set("action", policy(td["observation"])),
                    frames_per_batch=frames).next()
    assert ref["next", "done"].sum() >= 5  # several episodes ended inside the batch
    for key in ["observation", ("next", "observation"), "action", ("next", "done"), ("next", "terminated")]:
        assert torch.equal(batch[0][key], ref[key]), key


@pytest.mark.parametrize("mode", ["num_envs", AutoresetMode.DISABLED, AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP,
                                  "async_next_step", "wrapped_next_step"])
def test_vector_final_observation_counts_steps(mode):
    """With CountEnv the final observation of an episode says how long it was; in NEXT_STEP mode
    no reset step is recorded as a transition."""
    fns = [partial(CountEnv, offset=i) for i in range(3)]
    if mode == "num_envs":
        env = GymEnv("CountEnv-v0", num_envs=3)
    elif mode == "async_next_step":
        env = GymEnv(AsyncVectorEnv(fns, context="fork"))
    elif mode == "wrapped_next_step":
        env = GymEnv(gym.wrappers.vector.RecordEpisodeStatistics(SyncVectorEnv(fns)))
    else:
        env = GymEnv(SyncVectorEnv(fns, autoreset_mode=mode))
    with Collector(env, None, frames_per_batch=3 * 12) as collector:  # closes the env (async: its processes)
        batch = collector.next()
    lengths = [3, 5, 2]
    for i in range(3):
        env_batch = batch[i]
        done = env_batch["next", "done"].squeeze(-1)
        assert done.sum() >= 2
        final = env_batch["next", "observation"][done]
        # final observation: t == the episode's length, and the episode number it belongs to
        expected = [lengths[(int(ep) + (0 if mode == "num_envs" else i)) % 3] for ep in final[:, 1]]
        assert final[:, 0].tolist() == expected
        # the step after a done starts a new episode at t == 0
        after = env_batch["observation"][1:][done[:-1]]
        assert (after[:, 0] == 0).all() and (after[:, 1] == final[: len(after), 1] + 1).all()
        # inside an episode the next observation is the following root observation
        cont = ~done[:-1]
        assert torch.equal(env_batch["observation"][1:][cont], env_batch["next", "observation"][:-1][cont])


class NextStepVectorEnv(gym.vector.VectorEnv):
    """A vector env that autoresets on the next step and cannot reset some of its envs."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self) -> None:
        self.num_envs = 2
        self.single_observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
        self.single_action_space = gym.spaces.Discrete(2)


def test_vector_next_step_autoreset_without_partial_resets_rejected():
    with pytest.raises(ValueError, match="NEXT_STEP mode and offers no partial reset") as info:
        GymEnv(NextStepVectorEnv())
    assert all(word in str(info.value) for word in ("SyncVectorEnv", "AsyncVectorEnv", "EnvPool", "DISABLED", "SAME_STEP"))


def test_partial_reset_through_tensordict_interface():
    env = GymEnv(SyncVectorEnv([partial(CountEnv, lengths=(50,)) for _ in range(3)],
                               autoreset_mode=AutoresetMode.DISABLED))
    td = env.reset()
    for _ in range(2):
        td = env.step(env.rand_action(td))["next"].exclude("reward")
    assert td["observation"][:, 0].tolist() == [2, 2, 2]
    out = env.reset(TensorDict({"_reset": torch.tensor([[False], [True], [False]])}, batch_size=[3]))
    assert out["observation"][1].tolist()[:2] == [0, 1]  # env 1 restarted, second episode
    td["action"] = torch.zeros(3, dtype=torch.int64)
    after = env.step(td)["next", "observation"]
    assert after[:, 0].tolist() == [3, 1, 3] and after[:, 1].tolist() == [0, 1, 0]  # envs 0 and 2 went on


def test_unsupported_spaces_rejected():
    class TextEnv(gym.Env):
        observation_space = gym.spaces.Text(5)
        action_space = gym.spaces.Discrete(2)

    with pytest.raises(TypeError, match="observation space"):
        GymEnv(TextEnv())


def test_num_envs_validation():
    with pytest.raises(ValueError, match="num_envs=0"):
        GymEnv("CartPole-v1", num_envs=0)
    with pytest.raises(ValueError, match="num_envs"):
        GymEnv(gym.make("CartPole-v1"), num_envs=2)
    with pytest.raises(TypeError, match="env=3"):
        GymEnv(3)
