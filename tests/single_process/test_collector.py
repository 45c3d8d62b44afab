"""Collector: TorchRL's data layout and every constructor argument and method of DESIGN.md.

Most tests run on five envs with the same episodes (see conftest): a gymnasium env through
GymEnv (the array fast path), single and vector (autoreset DISABLED and SAME_STEP), and a hand-written TorchRL-``EnvBase``-style
env (the TensorDict path), single and batched. Their observations are ``[t, episode, last
action]``, so the checks below read the truth from the batch itself.
"""
from __future__ import annotations

import itertools
import threading
import time
from contextlib import nullcontext
from functools import partial

import gymnasium as gym
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from conftest import CountEnv, TDCountEnv
from rpc_collectors import Collector, GymEnv, RandomPolicy, SyncDataCollector, split_trajectories

B = 3  # envs in a vector env
KINDS = ["gym", "gym-vector", "gym-vector-same-step", "td", "td-batched"]


def make_env(kind: str, lengths=(3, 5, 2)):
    if kind == "gym":
        return GymEnv(CountEnv(lengths))
    if kind.startswith("gym-vector"):
        fns = [partial(CountEnv, lengths, offset=i) for i in range(B)]
        mode = AutoresetMode.SAME_STEP if kind.endswith("same-step") else AutoresetMode.DISABLED
        return GymEnv(SyncVectorEnv(fns, autoreset_mode=mode))
    return TDCountEnv(None if kind == "td" else B, lengths)


def n_envs(kind: str) -> int:
    return 1 if kind in ("gym", "td") else B


class ArgmaxLinear(nn.Module):
    def __init__(self, n_obs: int = 3, favour: int | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(n_obs, 2)
        if favour is not None:  # always picks action `favour`
            with torch.no_grad():
                self.linear.weight.zero_()
                self.linear.bias.copy_(torch.tensor([1.0, -1.0] if favour == 0 else [-1.0, 1.0]))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs).argmax(-1)


def rows(batch: TensorDict) -> list:
    """The per-env ``[T]`` views of a ``[T]`` or ``[B, T]`` batch."""
    return [batch] if batch.batch_dims == 1 else list(batch.unbind(0))


def check_count_env_batches(batches: list, capped: bool = False) -> None:
    """Consecutive batches of a CountEnv run are one consistent stream of transitions."""
    stream = torch.cat(batches, dim=-1)
    seen: set = set()
    for env_i, env_row in enumerate(rows(stream)):
        obs, nxt = env_row["observation"], env_row["next", "observation"]
        done = env_row["next", "done"].squeeze(-1)
        ids = env_row["collector", "traj_ids"]
        assert torch.equal(nxt[:, 0], obs[:, 0] + 1)  # one step
        assert torch.equal(nxt[:, 1], obs[:, 1])  # same episode
        assert torch.equal(nxt[:, 2], env_row["action"].float())  # the recorded action is the one taken
        assert torch.equal(env_row["next", "reward"].squeeze(-1), nxt[:, 0])
        assert torch.equal(env_row["next", "done"], env_row["next", "terminated"] | env_row["next", "truncated"])
        assert not env_row["done"].any() and not env_row["terminated"].any() and not env_row["truncated"].any()
        if not capped:  # CountEnv: even episodes terminate, odd ones are truncated
            even = nxt[:, 1] % 2 == 0
            assert torch.equal(env_row["next", "terminated"].squeeze(-1), done & even)
        cont = ~done[:-1]
        assert torch.equal(obs[1:][cont], nxt[:-1][cont])  # no reset inside an episode
        assert torch.equal(ids[1:][cont], ids[:-1][cont])  # one id per trajectory
        assert (obs[1:][done[:-1]][:, 0] == 0).all()  # after done, a fresh episode
        assert (ids[1:][done[:-1]] > ids[:-1][done[:-1]]).all()  # with a new, larger id
        env_ids = set(ids.tolist())
        assert not env_ids & seen, f"env {env_i} reuses another env's trajectory id"
        seen |= env_ids


# ---------------------------------------------------------------------- layout
@pytest.mark.parametrize("kind", KINDS)
def test_layout(kind):
    n = n_envs(kind)
    collector = Collector(make_env(kind), None, frames_per_batch=10 * n)
    batch = collector.next()
    shape = (10,) if n == 1 else (n, 10)
    assert batch.batch_size == torch.Size(shape)
    assert batch.names == ([None] * (len(shape) - 1) + ["time"])
    assert set(batch.keys(True, True)) == {  # TorchRL's key set: no policy version unless asked for
        "observation", "action", "done", "terminated", "truncated",
        ("collector", "traj_ids"),
        ("next", "observation"), ("next", "reward"), ("next", "done"), ("next", "terminated"),
        ("next", "truncated"),
    }
    assert batch["observation"].shape == (*shape, 3)
    assert batch["next", "observation"].shape == (*shape, 3)
    for key in ["done", "terminated", "truncated", ("next", "done"), ("next", "terminated"), ("next", "truncated")]:
        assert batch[key].shape == (*shape, 1) and batch[key].dtype == torch.bool, key
    assert batch["next", "reward"].shape == (*shape, 1) and batch["next", "reward"].dtype == torch.float32
    assert batch["collector", "traj_ids"].shape == shape and batch["collector", "traj_ids"].dtype == torch.int64
    assert collector.last_batch.oldest_version == collector.last_batch.newest_version == 0
    assert batch["next", "done"].any()  # episodes of 2 to 5 steps end inside 10 steps
    check_count_env_batches([batch, collector.next()])
    collector.shutdown()


@pytest.mark.parametrize("num_envs", [None, 4])
def test_layout_cartpole(num_envs):
    env = GymEnv("CartPole-v1", num_envs=num_envs)
    n = num_envs or 1
    collector = SyncDataCollector(env, ArgmaxLinear(4), frames_per_batch=50 * n)
    batch = collector.next()
    assert batch.batch_size == ((50,) if n == 1 else (n, 50))
    assert batch.names[-1] == "time"
    assert batch["observation"].dtype == torch.float32 and batch["action"].dtype == torch.int64
    assert batch["observation"].shape[-1] == 4
    for env_row in rows(batch):
        done = env_row["next", "done"].squeeze(-1)[:-1]
        assert torch.equal(env_row["observation"][1:][~done], env_row["next", "observation"][:-1][~done])


def test_tensordict_env_partial_reset():
    """A batched EnvBase-style env is reset only where an episode ended, through td["_reset"]."""
    env = TDCountEnv(B)
    collector = Collector(env, None, frames_per_batch=B * 12)
    batch = collector.next()
    done = batch["next", "done"].squeeze(-1)
    assert env.reset_masks[0].all()  # the first reset: every env
    partial_masks = torch.stack(env.reset_masks[1:])
    assert (~partial_masks.all(-1)).any()  # envs of different lengths: some resets are partial
    assert partial_masks.sum() == done.sum()  # one reset per done (the last step's done included)
    check_count_env_batches([batch])


@pytest.mark.parametrize("vector", [False, True])
def test_tensordict_path_matches_fast_path(vector):
    """A GymEnv hidden behind a plain EnvBase-style object (TensorDict path) gives the same batches."""

    class Wrapped:
        def __init__(self, env):
            self.env, self.batch_size = env, env.batch_size

        def reset(self, td=None):
            return self.env.reset(td)

        def step(self, td):
            return self.env.step(td)

        def rand_action(self, td=None):
            return self.env.rand_action(td)

        def set_seed(self, seed):
            return self.env.set_seed(seed)

    def batches(wrap, policy):
        env = GymEnv("CartPole-v1", num_envs=4 if vector else None)
        torch.manual_seed(0)
        collector = Collector(Wrapped(env) if wrap else env, policy and ArgmaxLinear(4), frames_per_batch=200,
                              max_frames_per_traj=30)
        collector.set_seed(1)
        return [collector.next() for _ in range(2)]

    fast, slow = batches(False, None) + batches(False, "argmax"), batches(True, None) + batches(True, "argmax")
    if vector:  # random actions end episodes at different times: partial resets happen
        done = fast[0]["next", "done"].squeeze(-1)
        assert (done.any(0) & ~done.all(0)).any()
    for a, b in zip(fast, slow):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("batched", [False, True])
def test_torchrl_env(batched):
    """A TorchRL env (optional dependency) works in place of GymEnv, with partial resets when batched."""
    torchrl_envs = pytest.importorskip("torchrl.envs")
    make = partial(torchrl_envs.GymEnv, "CartPole-v1", categorical_action_encoding=True)
    env = torchrl_envs.SerialEnv(2, make) if batched else make()
    env.set_seed(0)
    policy = TensorDictModule(ArgmaxLinear(4), in_keys=["observation"], out_keys=["action"])
    collector = Collector(env, policy, frames_per_batch=100 * (2 if batched else 1), max_frames_per_traj=20)
    batches = [collector.next(), collector.next()]
    for batch in batches:
        assert batch.batch_size == ((2, 100) if batched else (100,))
        assert batch["next", "step_count"].max() <= 20
        assert batch["next", "done"].any()
    for env_row in rows(torch.cat(batches, -1)):
        done = env_row["next", "done"].squeeze(-1)[:-1]
        ids = env_row["collector", "traj_ids"]
        assert torch.equal(env_row["observation"][1:][~done], env_row["next", "observation"][:-1][~done])
        assert torch.equal(ids[1:][~done], ids[:-1][~done]) and (ids[1:][done] > ids[:-1][done]).all()
        assert (env_row["step_count"][1:][done] == 0).all()
    collector.shutdown()


# ------------------------------------------------------------- trajectory ids
@pytest.mark.parametrize("kind", KINDS)
def test_traj_ids_span_batches_and_are_never_reused(kind):
    n = n_envs(kind)
    collector = Collector(make_env(kind, lengths=(15, 4)), None, frames_per_batch=10 * n)
    first, second, third = collector.next(), collector.next(), collector.next()
    spanning = 0
    for a, b in zip(rows(first), rows(second)):
        # unless the last step of batch 1 ended its episode, batch 2 starts with the same id
        if not a["next", "done"][-1]:
            spanning += 1
            assert a["collector", "traj_ids"][-1] == b["collector", "traj_ids"][0]
    assert spanning >= 1
    check_count_env_batches([first, second, third])  # includes: ids never reused, across envs too


def test_traj_id_constant_across_batches_single_env():
    collector = Collector(make_env("gym", lengths=(25,)), None, frames_per_batch=10)
    ids = torch.cat([collector.next()["collector", "traj_ids"] for _ in range(3)])
    assert ids.tolist() == [0] * 25 + [1] * 5


@pytest.mark.parametrize("kind", ["gym-vector", "gym-vector-same-step", "td-batched"])
def test_traj_ids_continue_after_load_state_dict(kind):
    first = Collector(make_env(kind), None, frames_per_batch=10 * B)
    before = torch.cat([first.next() for _ in range(3)], -1)
    state = first.state_dict()
    second = Collector(make_env(kind), None, frames_per_batch=10 * B)
    second.load_state_dict(state)
    after = second.next()
    assert after["collector", "traj_ids"].min() > before["collector", "traj_ids"].max()
    check_count_env_batches([after])


# ------------------------------------------------------------- total_frames
def test_endless_collector():
    collector = Collector(make_env("gym"), None, frames_per_batch=10)
    with pytest.raises(TypeError, match="endless"):
        len(collector)
    batches = list(itertools.islice(collector, 5))
    assert len(batches) == 5 and collector.frames == 50
    assert collector.next().batch_size == torch.Size([10])


@pytest.mark.parametrize("total, expected", [(30, 3), (25, 3), (10, 1), (5, 1)])
def test_finite_collector_len(total, expected):
    told = pytest.warns(UserWarning, match=f"total_frames={total} is not a multiple") if total % 10 else nullcontext()
    with told:  # the run overshoots total_frames to whole batches, and says so
        collector = Collector(make_env("gym"), None, frames_per_batch=10, total_frames=total)
    assert len(collector) == expected
    assert len(list(collector)) == expected
    assert collector.frames == 10 * expected
    with pytest.raises(StopIteration):
        collector.next()


# ------------------------------------------------------------- max_frames_per_traj
@pytest.mark.parametrize("kind", KINDS)
def test_max_frames_per_traj_truncates(kind):
    n = n_envs(kind)
    collector = Collector(make_env(kind, lengths=(50,)), None, frames_per_batch=5 * n, max_frames_per_traj=4)
    batches = [collector.next() for _ in range(2)]  # the cap carries over a batch boundary
    for batch in batches:
        assert batch["step_count"].shape == (*batch.shape, 1) and batch["step_count"].dtype == torch.int64
        assert torch.equal(batch["next", "step_count"], batch["step_count"] + 1)
    stream = torch.cat(batches, -1)
    for env_row in rows(stream):
        assert env_row["step_count"].squeeze(-1).tolist() == [0, 1, 2, 3] * 2 + [0, 1]
        truncated = env_row["next", "truncated"].squeeze(-1)
        assert truncated.tolist() == [False, False, False, True] * 2 + [False, False]
        assert torch.equal(env_row["next", "done"].squeeze(-1), truncated)
        assert not env_row["next", "terminated"].any()
        assert (env_row["next", "observation"][truncated][:, 0] == 4).all()
    check_count_env_batches(batches, capped=True)


@pytest.mark.parametrize("kind", ["gym", "td-batched"])
def test_max_frames_per_traj_restarts_count_when_env_ends_first(kind):
    collector = Collector(make_env(kind, lengths=(2,)), None, frames_per_batch=6 * n_envs(kind),
                          max_frames_per_traj=4)
    batch = collector.next()
    for env_row in rows(batch):
        assert env_row["step_count"].squeeze(-1).tolist() == [0, 1] * 3
        assert env_row["next", "done"].squeeze(-1).tolist() == [False, True] * 3


def test_max_frames_per_traj_minus_one_is_no_limit():
    batch = Collector(make_env("gym", lengths=(50,)), None, frames_per_batch=10, max_frames_per_traj=-1).next()
    assert "step_count" not in batch.keys() and not batch["next", "done"].any()


# ------------------------------------------------------------- init_random_frames
class Recorder:
    """A TensorDict policy that always picks action 1 and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, td: TensorDict) -> TensorDict:
        self.calls += 1
        td["action"] = torch.ones(td.batch_size, dtype=torch.int64)
        return td


@pytest.mark.parametrize("kind", ["gym", "td-batched"])
def test_init_random_frames(kind):
    n = n_envs(kind)
    policy = Recorder()
    collector = Collector(make_env(kind), policy, frames_per_batch=20 * n, init_random_frames=30 * n)
    collector.set_seed(0)
    policy.calls = 0  # the constructor may call the policy once to check it
    for _ in range(2):  # 20 and 40 frames: both batches start before 30 frames
        batch = collector.next()
        assert policy.calls == 0
        assert set(batch["action"].unique().tolist()) == {0, 1}
    batch = collector.next()
    assert policy.calls == 20
    assert (batch["action"] == 1).all()


# ------------------------------------------------------------- reset_at_each_iter
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reset", [False, True])
def test_reset_at_each_iter(kind, reset):
    n = n_envs(kind)
    env = make_env(kind, lengths=(50,))
    collector = Collector(env, Recorder(), frames_per_batch=5 * n, reset_at_each_iter=reset)
    first, second = collector.next(), collector.next()
    start_t = second[..., 0]["observation"][..., 0]
    first_ids, second_ids = first["collector", "traj_ids"], second["collector", "traj_ids"]
    if reset:
        assert (start_t == 0).all()
        assert second_ids.min() > first_ids.max()
    else:
        assert (start_t == 5).all()
        assert torch.equal(second_ids[..., 0], first_ids[..., -1])
        check_count_env_batches([first, second])
    if isinstance(env, TDCountEnv):  # the first batch does not reset twice
        assert len(env.reset_masks) == (2 if reset else 1)


# ------------------------------------------------------------- split_trajs, postproc
@pytest.mark.parametrize("kind", ["gym", "td-batched"])
def test_split_trajs(kind):
    n = n_envs(kind)
    plain = Collector(make_env(kind), Recorder(), frames_per_batch=12 * n).next()
    split = Collector(make_env(kind), Recorder(), frames_per_batch=12 * n, split_trajs=True).next()
    mask = split["collector", "mask"]
    assert split.batch_dims == 2 and split.names == [None, "time"]
    assert mask.sum() == 12 * n
    # each row is one trajectory: one id, steps counting up from where it started
    for row, row_mask in zip(split.unbind(0), mask):
        ids = row["collector", "traj_ids"][row_mask]
        assert (ids == ids[0]).all()
        t = row["observation"][row_mask][:, 0]
        assert torch.equal(t, t[0] + torch.arange(len(t)))
    expected = split_trajectories(plain)
    for key in expected.keys(True, True):
        assert torch.equal(split[key], expected[key]), key


def test_postproc_after_split():
    seen = []

    def postproc(td):
        seen.append(td.batch_size)
        td["doubled"] = td["next", "reward"] * 2
        return td

    collector = Collector(make_env("gym"), None, frames_per_batch=10, split_trajs=True, postproc=postproc)
    batch = collector.next()
    assert seen == [batch.batch_size] and ("collector", "mask") in batch.keys(True)
    assert torch.equal(batch["doubled"], batch["next", "reward"] * 2)


# ------------------------------------------------------------- devices, replay buffer
def test_cpu_devices():
    collector = Collector(make_env("gym"), ArgmaxLinear(), frames_per_batch=10, device="cpu",
                          storing_device="cpu", env_device="cpu", policy_device=torch.device("cpu"))
    batch = collector.next()
    assert batch.device == torch.device("cpu")
    assert batch["observation"].device == torch.device("cpu")


class Buffer:
    def __init__(self) -> None:
        self.batches: list = []

    def extend(self, td: TensorDict) -> None:
        self.batches.append(td)


def test_replay_buffer():
    buffer = Buffer()
    collector = Collector(make_env("gym-vector"), None, frames_per_batch=5 * B, total_frames=45, replay_buffer=buffer)
    assert list(collector) == [None, None, None]
    assert [b.batch_size for b in buffer.batches] == [torch.Size([B, 5])] * 3
    check_count_env_batches(buffer.batches)


# ------------------------------------------------------------- policies
class TwoHeads(nn.Module):
    def forward(self, obs):
        logits = torch.stack([obs[..., 0], obs[..., 0] + 1], -1)  # favours action 1
        return logits, logits.argmax(-1)


POLICIES = {
    "tensordict-module": lambda: TensorDictModule(ArgmaxLinear(favour=1), in_keys=["observation"], out_keys=["action"]),
    "tensordict-module-two-outs": lambda: TensorDictModule(TwoHeads(), in_keys=["observation"], out_keys=["logits", "action"]),
    "tensordict-sequential": lambda: TensorDictSequential(
        TensorDictModule(lambda o: torch.stack([o[..., 0], o[..., 0] + 1], -1), in_keys=["observation"], out_keys=["logits"]),
        TensorDictModule(lambda logits: logits.argmax(-1), in_keys=["logits"], out_keys=["action"]),
    ),
    "nn-module": lambda: ArgmaxLinear(favour=1),
    "callable-in-place": Recorder,
    "callable-new-td": lambda: (lambda td: TensorDict(
        {"action": torch.ones(td.batch_size, dtype=torch.int64), "logits": torch.zeros(*td.batch_size, 2)},
        batch_size=td.batch_size)),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(POLICIES))
def test_policies(kind, name):
    n = n_envs(kind)
    collector = Collector(make_env(kind), POLICIES[name](), frames_per_batch=8 * n)
    batches = [collector.next(), collector.next()]
    for batch in batches:
        assert (batch["action"] == 1).all()
        if name in ("tensordict-module-two-outs", "tensordict-sequential", "callable-new-td"):
            assert batch["logits"].shape == (*batch.shape, 2)
    check_count_env_batches(batches)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", [None, "random-policy"])
def test_random_actions(kind, policy):
    if policy == "random-policy":
        policy = RandomPolicy(gym.spaces.Discrete(2))
    collector = Collector(make_env(kind), policy, frames_per_batch=20 * n_envs(kind))
    batch = collector.next()
    assert set(batch["action"].unique().tolist()) == {0, 1}
    check_count_env_batches([batch])


# ------------------------------------------------------------- weights
@pytest.mark.parametrize("wrap", [False, True])
def test_update_policy_weights(wrap):
    def policy(favour):
        module = ArgmaxLinear(favour=favour)
        return TensorDictModule(module, in_keys=["observation"], out_keys=["action"]) if wrap else module

    collector = Collector(make_env("gym-vector"), policy(0), frames_per_batch=4 * B, track_policy_version=True)
    batch = collector.next()
    assert (batch["action"] == 0).all() and (batch["collector", "policy_version"] == 0).all()
    updates = [
        policy(1),  # a module
        TensorDict.from_module(policy(0)),  # a TensorDict of weights
        policy(1).state_dict(),  # a state dict
    ]
    for version, update in enumerate(updates, start=1):
        collector.update_policy_weights_(update)
        batch = collector.next()
        assert (batch["collector", "policy_version"] == version).all()
        assert (batch["action"] == version % 2).all()
    collector.update_policy_weights_()  # no weights: the version still moves on
    assert (collector.next()["collector", "policy_version"] == 4).all()


def test_update_policy_weights_rejects_bad_input():
    collector = Collector(make_env("gym"), ArgmaxLinear(), frames_per_batch=4)
    with pytest.raises(TypeError, match="policy_or_weights"):
        collector.update_policy_weights_(5)
    with pytest.raises(ValueError, match="worker_ids=3"):
        collector.update_policy_weights_(worker_ids=3)


# ------------------------------------------------------------- seeds and state
def equal(a: TensorDict, b: TensorDict) -> bool:
    return set(a.keys(True, True)) == set(b.keys(True, True)) and all(
        torch.equal(a[k], b[k]) for k in a.keys(True, True))


@pytest.mark.parametrize("num_envs", [None, 4])
def test_set_seed_reproducible(num_envs):
    def run(seed):
        collector = Collector(GymEnv("CartPole-v1", num_envs=num_envs), None, frames_per_batch=100 * (num_envs or 1))
        next_seed = collector.set_seed(seed)
        return next_seed, [collector.next() for _ in range(2)]

    (seed_a, a), (seed_b, b), (_, c) = run(3), run(3), run(4)
    assert isinstance(seed_a, int) and seed_a == seed_b == 3 + (num_envs or 1)  # seeds 3.. are taken
    assert all(equal(x, y) for x, y in zip(a, b))
    assert not equal(a[0], c[0])


def test_set_seed_during_a_batch_takes_effect_from_the_next_one():
    """A batch in progress in another thread (a worker, a background collection) is not cut
    into: set_seed waits for it, and the next batch starts from the seeded reset."""
    frames = 10_000

    def fresh_seeded() -> TensorDict:
        collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=frames)
        collector.set_seed(3)
        return collector.next()

    collector = Collector(GymEnv("CartPole-v1"), None, frames_per_batch=frames)
    collector.next()
    in_flight = threading.Thread(target=collector.next)
    in_flight.start()
    deadline = time.monotonic() + 30
    while not collector._busy.locked():  # until the batch is under way
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.001)
    collector.set_seed(3)
    in_flight.join(timeout=60)
    ids = ("collector", "traj_ids")  # the first collector has numbered more trajectories
    assert equal(collector.next().exclude(ids), fresh_seeded().exclude(ids))


def test_set_seed_td_env_returns_next_seed():
    collector = Collector(TDCountEnv(B), None, frames_per_batch=B)
    assert collector.set_seed(10) == 11


def test_env_seeded_before_the_collector():
    """Seeding the env, then building the collector with a policy, seeds the first batch."""
    def run(seed_env_first):
        env = GymEnv("CartPole-v1")
        if seed_env_first:
            env.set_seed(0)
        torch.manual_seed(0)
        collector = Collector(env, ArgmaxLinear(4), frames_per_batch=50)
        if not seed_env_first:
            collector.set_seed(0)
        return collector.next()

    assert equal(run(True), run(False))


def test_state_dict_resume():
    first = Collector(make_env("gym"), ArgmaxLinear(favour=0), frames_per_batch=10, total_frames=60,
                      track_policy_version=True)
    for _ in range(2):
        before = first.next()
    first.update_policy_weights_(ArgmaxLinear(favour=1))
    before = first.next()
    assert (before["action"] == 1).all()
    state = first.state_dict()
    first.update_policy_weights_(ArgmaxLinear(favour=0))  # the saved state does not follow
    assert state["frames"] == 30 and state["iteration"] == 3 and state["policy_version"] == 1

    second = Collector(make_env("gym"), ArgmaxLinear(favour=0), frames_per_batch=10, total_frames=60,
                       track_policy_version=True)
    second.load_state_dict(state)
    assert second.frames == 30
    rest = list(second)
    assert len(rest) == 3 and second.frames == 60
    for batch in rest:
        assert (batch["collector", "policy_version"] == 1).all()
        assert (batch["action"] == 1).all()
    assert rest[0]["collector", "traj_ids"].min() > before["collector", "traj_ids"].max()
    assert second.state_dict()["iteration"] == 6


# ------------------------------------------------------------- lifecycle
def test_start_and_async_shutdown():
    buffer = Buffer()
    env = CountEnv()
    collector = Collector(GymEnv(env), None, frames_per_batch=10, replay_buffer=buffer)
    collector.start()
    assert collector.running
    deadline = time.monotonic() + 60
    while len(buffer.batches) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    collector.async_shutdown(timeout=30)
    assert not collector.running and env.closed
    count = len(buffer.batches)
    assert count >= 3
    assert all(b.batch_size == torch.Size([10]) for b in buffer.batches)
    check_count_env_batches(buffer.batches)
    collector.shutdown()  # again: no error


def test_weights_updated_in_the_background_apply_between_batches():
    buffer = Buffer()
    collector = Collector(make_env("gym-vector"), ArgmaxLinear(favour=0), frames_per_batch=4 * B, replay_buffer=buffer,
                          track_policy_version=True)
    collector.start()
    deadline = time.monotonic() + 60
    while not buffer.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    collector.update_policy_weights_(ArgmaxLinear(favour=1))
    while buffer.batches[-1]["collector", "policy_version"].max() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    collector.async_shutdown(timeout=30)
    versions = [b["collector", "policy_version"].unique().tolist() for b in buffer.batches]
    assert all(len(v) == 1 for v in versions)  # one policy version per batch, never mixed
    assert versions[0] == [0] and versions[-1] == [1]
    for batch, (version,) in zip(buffer.batches, versions):
        assert (batch["action"] == version).all()


def test_start_needs_a_replay_buffer():
    collector = Collector(make_env("gym"), None, frames_per_batch=10)
    with pytest.raises(RuntimeError, match="replay_buffer"):
        collector.start()


def test_background_error_surfaces_in_async_shutdown():
    class Boom(Exception):
        pass

    class Failing(CountEnv):
        def step(self, action):
            raise Boom("env broke")

    collector = Collector(GymEnv(Failing()), None, frames_per_batch=10, replay_buffer=Buffer())
    collector.start()
    with pytest.raises(Boom, match="env broke"):  # the first batch is always attempted
        collector.async_shutdown(timeout=30)


def test_shutdown_idempotent_and_context_manager():
    env = CountEnv()
    with Collector(GymEnv(env), None, frames_per_batch=10) as collector:
        assert collector.next().batch_size == torch.Size([10])
    assert env.closed
    collector.shutdown()
    collector.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        collector.next()

    td_env = TDCountEnv()
    collector = Collector(td_env, None, frames_per_batch=4)
    collector.shutdown(close_env=False)
    assert not td_env.closed


# ------------------------------------------------------------------ exploration and dict in_keys
def gaussian_policy() -> nn.Module:
    """A tensordict probabilistic policy without default_interaction_type (TorchRL's usual pattern)."""
    from tensordict.nn import ProbabilisticTensorDictModule, ProbabilisticTensorDictSequential

    torch.manual_seed(0)
    params = TensorDictModule(lambda obs: (obs[..., :1] * 0 + 0.5, torch.ones_like(obs[..., :1])),
                              in_keys=["observation"], out_keys=["loc", "scale"])
    return ProbabilisticTensorDictSequential(
        params, ProbabilisticTensorDictModule(in_keys=["loc", "scale"], out_keys=["action"],
                                              distribution_class=torch.distributions.Normal))


@pytest.mark.parametrize("exploration_type, sampled", [(None, True), ("random", True), ("deterministic", False)])
def test_exploration_type_set_around_the_policy(exploration_type, sampled):
    """Default RANDOM, as TorchRL's collectors: a probabilistic policy samples; DETERMINISTIC: its mean."""
    collector = Collector(TDCountEnv(), gaussian_policy(), frames_per_batch=50, exploration_type=exploration_type)
    actions = collector.next()["action"]
    assert (actions != 0.5).all() if sampled else (actions == 0.5).all()


def test_dict_in_keys_reach_their_keywords():
    """``in_keys={kwarg: key}``: the fast path passes each tensor by keyword, not by position."""
    class Signed(nn.Module):
        def forward(self, step, episode):
            return (step - episode > 0).long()

    env = TDCountEnv(num_envs=2)
    policy = TensorDictModule(Signed(), in_keys={"episode": ("obs", "episode"), "step": ("obs", "step")},
                              out_keys=["action"])

    def split(td):  # the observation's t and episode columns under keys of their own
        td.set(("obs", "step"), td["observation"][..., 0])
        td.set(("obs", "episode"), td["observation"][..., 1])
        return td

    class SplitEnv:
        batch_size = env.batch_size

        def reset(self, td=None):
            return split(env.reset(td))

        def step(self, td):
            out = env.step(td)
            split(out["next"])
            return out

        def rand_action(self, td=None):
            return env.rand_action(td)

    batch = Collector(SplitEnv(), policy, frames_per_batch=40).next()
    assert torch.equal(batch["action"], (batch["obs", "step"] > batch["obs", "episode"]).long())


# ------------------------------------------------------------- env classes as create_env_fn
class PropertyBatchEnv(TDCountEnv):
    """TDCountEnv whose ``batch_size`` is a property, as on TorchRL's ``EnvBase``."""

    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: torch.Size) -> None:
        self._batch_size = value


def test_env_class_as_create_env_fn_is_called():
    """A class is a factory (called), not an env, although it has reset/step/batch_size attributes."""
    with Collector(PropertyBatchEnv, None, frames_per_batch=6) as c:
        assert c.next().batch_size == torch.Size([6])
    from rpc_collectors import MultiSyncCollector
    with MultiSyncCollector([PropertyBatchEnv] * 2, None, frames_per_batch=8, launcher="debug") as c:
        assert c.next().batch_size == torch.Size([2, 4])


# ------------------------------------------------------------- track_policy_version
@pytest.mark.parametrize("kind", ["gym", "td-batched"])
def test_track_policy_version_writes_torchrls_keys(kind):
    """TorchRL's "policy_version" (root: the version the observation came with) and ("next", "policy_version")."""
    c = Collector(make_env(kind), ArgmaxLinear(), frames_per_batch=4 * n_envs(kind), track_policy_version=True)
    first = c.next()
    c.update_policy_weights_()
    second = c.next()
    for batch in (first, second):
        assert batch["policy_version"].dtype == torch.int64 and batch["policy_version"].shape == batch.shape
    assert (first["policy_version"] == 0).all() and (first["next", "policy_version"] == 0).all()
    assert (second["policy_version"][..., 0] == 0).all() and (second["policy_version"][..., 1:] == 1).all()
    assert (second["next", "policy_version"] == 1).all()
    assert "policy_version" not in Collector(make_env(kind), None, frames_per_batch=n_envs(kind)).next().keys()
    with pytest.raises(TypeError, match="track_policy_version='yes'"):
        Collector(make_env(kind), None, frames_per_batch=4, track_policy_version="yes")


def test_track_policy_version_in_workers():
    from rpc_collectors import MultiSyncCollector
    for kwargs in ({"track_policy_version": True}, {"collector_kwargs": {"track_policy_version": True}}):
        with MultiSyncCollector([partial(make_env, "td")] * 2, ArgmaxLinear(), frames_per_batch=8, launcher="debug",
                                **kwargs) as c:
            c.next()
            c.update_policy_weights_()
            batch = c.next()
        assert (batch["next", "policy_version"] == 1).all() and batch["policy_version"][:, 0].tolist() == [0, 0]
        assert (batch["collector", "policy_version"] == 1).all()


VERSION_KEYS = {("collector", "policy_version"), "policy_version", ("next", "policy_version")}


@pytest.mark.parametrize("track", [False, True])
def test_version_keys_only_with_track_policy_version_and_the_record_always(track):
    """As TorchRL: no version key unless track_policy_version=True; the collector's last_batch
    says which versions chose the batch's actions and how far behind the trainer they were."""
    c = Collector(make_env("gym"), ArgmaxLinear(), frames_per_batch=10, track_policy_version=track)
    first = c.next()
    assert c.last_batch.iteration == 1 and c.last_batch.frames == 10
    assert (c.last_batch.oldest_version, c.last_batch.newest_version, c.last_batch.lag) == (0, 0, 0)
    c.update_policy_weights_()
    c.update_policy_weights_()
    second = c.next()
    assert (c.last_batch.iteration, c.last_batch.oldest_version, c.last_batch.trainer_version) == (2, 2, 2)
    for batch in (first, second):
        assert (VERSION_KEYS <= set(batch.keys(True, True))) if track else \
            not VERSION_KEYS & set(batch.keys(True, True))
    if track:
        assert (second["collector", "policy_version"] == 2).all()


def test_multi_worker_batches_have_no_version_key_and_a_record_with_the_lag():
    """An async worker's batch collected before a push is behind the trainer by one version."""
    from rpc_collectors import MultiAsyncCollector
    with MultiAsyncCollector([partial(make_env, "td")] * 2, ArgmaxLinear(), frames_per_batch=8,
                             launcher="debug") as c:
        batch = c.next()
        assert ("collector", "policy_version") not in batch.keys(True)
        assert (c.last_batch.oldest_version, c.last_batch.lag) == (0, 0)
        c.update_policy_weights_()
        c.update_policy_weights_()
        records = []
        for _ in range(4):
            c.next()
            records.append(c.last_batch)
    assert [r.trainer_version for r in records] == [2] * 4 and [r.iteration for r in records] == [2, 3, 4, 5]
    assert records[-1].oldest_version == 2 and records[-1].lag == 0  # asked for after the push: the new weights


def test_track_policy_version_false_drops_an_empty_collector_entry():
    c = Collector(make_env("gym"), None, frames_per_batch=4, track_traj_ids=False)
    assert "collector" not in c.next().keys() and c.last_batch.frames == 4


# ------------------------------------------------------------- the next root, as TorchRL's step_mdp
class NoTruncatedEnv(TDCountEnv):
    """Done flags without "truncated": ``max_frames_per_traj`` adds it, as a StepCounter does."""

    def _flags(self, terminated: torch.Tensor, truncated: torch.Tensor) -> dict:
        ended = self._shape(terminated | truncated, 1)
        return {"done": ended, "terminated": ended}


@pytest.mark.parametrize("num_envs", [None, B])
def test_max_frames_per_traj_on_an_env_without_truncated(num_envs):
    c = Collector(NoTruncatedEnv(num_envs, lengths=(9,)), None, frames_per_batch=8 * (num_envs or 1),
                  max_frames_per_traj=3)
    batches = [c.next(), c.next()]
    for batch in batches:
        assert not batch["truncated"].any()
        assert torch.equal(batch["next", "truncated"], batch["next", "step_count"] == 3)
    check_count_env_batches(batches, capped=True)


def test_root_entries_are_carried_to_the_next_step():
    """As TorchRL's step_mdp (keep_other): what the policy wrote at the root is there at the next
    step (a recurrent state, an exploration module's noise), until the policy writes it again."""
    def policy(td):
        td.set("memory", td.get("memory", torch.zeros(td.shape)) + 1)
        td.set("action", torch.zeros(td.shape, dtype=torch.int64))
        return td

    batch = Collector(TDCountEnv(), policy, frames_per_batch=5).next()
    assert batch["memory"].tolist() == [1, 2, 3, 4, 5]


# ------------------------------------------------------------- policy outputs in random-action batches
@pytest.mark.parametrize("kind", KINDS)
def test_random_frames_batches_carry_the_policy_outputs(kind):
    """As TorchRL's: the policy's other outputs are there (zeros) from the first, random, batch on,
    so every batch has the same keys (a replay buffer or a worker's shared batch slots need that)."""
    n = n_envs(kind)
    c = Collector(make_env(kind), POLICIES["tensordict-module-two-outs"](), frames_per_batch=4 * n,
                  init_random_frames=4 * n)
    random, chosen = c.next(), c.next()
    assert set(random.keys(True, True)) == set(chosen.keys(True, True))
    assert random["logits"].shape == chosen["logits"].shape == (*random.shape, 2)
    assert (random["logits"] == 0).all() and (chosen["logits"] != 0).any()
