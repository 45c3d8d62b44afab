"""Property tests of the data paths: every collector hands out the frames a single-process ``Collector`` hands out.

Generated: envs whose observations are leaves of any dtype (bool, uint8, int32, int64, float16, float32, float64, and
bfloat16 behind TorchRL's ``EnvBase`` protocol), any shape per frame (``[]``, ``[1]``, ``[n, 1]``, ``[n]``), nested keys
(``("observation", "n0", "o1")``), and a policy (called on TensorDicts, or a ``TensorDictModule`` over tensors)
writing ``"action"`` and extra outputs of the same kinds; both write their tensors in a generated memory layout (plain,
expanded with stride 0 everywhere, broadcast with stride 0 along a frame's own dims, transposed, sliced, strided with a
storage offset). Each frame's values are a function of the frame
alone (``("observation", "count")`` = ``[t, episode, offset]``, the offset naming the env), so the streams of the envs
are told apart by the frames themselves. Properties:

- the single-process ``Collector`` records exactly what the env and the policy wrote (values, dtypes, shapes);
- ``Transitions`` (the batched collector's assembly, no processes) hands out each staged transition in order;
- ``RPCCollector`` (debug and local launchers), ``MultiCollector`` (sync and async), ``AsyncCollector`` and
  ``AsyncBatchedCollector`` (1-3 envs per worker, ``max_batch_size`` 1 to n, ``max_policy_lag`` or not): each
  env's stream of frames is a prefix of a single-process ``Collector``'s on the same env, key for key (dtype,
  shape, values), with the same trajectory boundaries where the batch has trajectory ids.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from torch import nn

from rpc_collectors import AsyncBatchedCollector, AsyncCollector, Collector, GymEnv, MultiCollector, RPCCollector
from rpc_collectors.trainer.transitions import ENV_INDEX, Transitions

COUNT = ("observation", "count")  # [t, episode, offset] of each frame
TRAJ = ("collector", "traj_ids")
FLAGS = ("done", "terminated", "truncated")
LAYOUTS = ("contiguous", "expand", "broadcast", "transposed", "sliced", "strided")
GYM_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64)
TD_DTYPES = (*GYM_DTYPES, torch.bfloat16)  # numpy (so gymnasium) has no bfloat16
SHAPES = ((), (1,), (2, 1), (3, 1), (2,), (3,))
LARGE = (*SHAPES, (300,))  # rows of 300 to 2,400 bytes: those past LARGE_ROW are copied one by one
LENGTHS = (3, 5, 2)
CHEAP = settings(deadline=None, derandomize=True, database=None, max_examples=40)  # in-process: no process starts
PROCESSES = settings(deadline=None, derandomize=True, database=None, max_examples=4)  # each example starts workers


@dataclass(frozen=True)
class Leaf:
    """One generated tensor: its key (under ``"observation"`` in an env, at the root for a policy), dtype, shape per
    frame and memory layout."""

    key: tuple
    dtype: torch.dtype
    shape: tuple
    layout: str = "contiguous"


@dataclass(frozen=True)
class Setup:
    """An env kind (``"gym"`` or ``"td"``) with its observation leaves, and the policy's output leaves, action layout
    and kind."""

    env: str
    observations: tuple
    outputs: tuple
    action_layout: str = "contiguous"
    policy: str = "td"  # "td": called on TensorDicts; "module": a TensorDictModule over tensors (the fast path)


def values(base: torch.Tensor, index: int, leaf: Leaf, modulus: int = 100) -> torch.Tensor:
    """Leaf ``index``'s values for frames of ``base`` (one float64 per frame, any leading shape), in ``leaf.layout``;
    whole numbers below ``modulus`` (2 for bool), so every dtype holds them exactly."""
    lead, shape, dtype = tuple(base.shape), leaf.shape, leaf.dtype
    modulus = 2 if dtype == torch.bool else modulus
    full, ones = (*lead, *shape), (*lead, *[1] * len(shape))
    if leaf.layout == "expand":  # stride 0 everywhere, even a [1] that torch calls contiguous
        return torch.tensor(index % modulus, dtype=dtype).expand(full)
    per_frame = (base + 3 * index) % modulus
    if leaf.layout == "broadcast":  # stride 0 along the frame's own dims
        return per_frame.to(dtype).reshape(ones).expand(full)
    steps = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    dense = ((per_frame.reshape(ones) + steps) % modulus).to(dtype)
    if leaf.layout == "transposed" and len(full) >= 2:
        order = tuple(reversed(range(len(full))))
        return dense.permute(order).contiguous().permute(order)
    if leaf.layout == "sliced" and len(full) >= 1:  # every other row of a larger tensor
        big = torch.zeros(2 * full[0], *full[1:], dtype=dtype)
        big[1::2] = dense
        return big[1::2]
    if leaf.layout in ("sliced", "strided"):  # every other element, from a storage offset
        big = torch.zeros(*full, 2, dtype=dtype)
        big[..., 1] = dense
        return big[..., 1]
    return dense


def frame_base(count: torch.Tensor) -> torch.Tensor:
    """One float64 per frame from its ``[t, episode, offset]``."""
    count = count.to(torch.float64)
    return count[..., 0] + 7 * count[..., 1] + 13 * count[..., 2]


class Episodes:
    """Episode ``k`` of the env at ``offset`` lasts ``LENGTHS[(k + offset) % 3]`` steps and ends terminated when ``k`` is
    even, truncated when odd."""

    def __init__(self, offset: int) -> None:
        self.offset, self.t, self.episode = offset, 0, -1

    def reset(self) -> torch.Tensor:
        self.t, self.episode = 0, self.episode + 1
        return self.count()

    def step(self) -> tuple[bool, bool]:
        self.t += 1
        end = self.t >= LENGTHS[(self.episode + self.offset) % len(LENGTHS)]
        return end and self.episode % 2 == 0, end and self.episode % 2 == 1

    def count(self) -> torch.Tensor:
        return torch.tensor([self.t, self.episode, self.offset], dtype=torch.float32)


def _nest(tree: dict, key: tuple, value: object) -> None:
    for name in key[:-1]:
        tree = tree.setdefault(name, {})
    tree[key[-1]] = value


def _space(tree: dict) -> gym.spaces.Dict:
    return gym.spaces.Dict({k: _space(v) if isinstance(v, dict) else v for k, v in tree.items()})


class SpecGymEnv(gym.Env):
    """A gymnasium env whose Dict observation holds ``count`` and a Box per generated leaf (numpy views in its layout)."""

    metadata: dict = {"render_modes": []}

    def __init__(self, leaves: tuple, offset: int) -> None:
        self.leaves, self.episodes = leaves, Episodes(offset)
        spaces: dict = {"count": gym.spaces.Box(-1e6, 1e6, (3,), np.float32)}
        for leaf in leaves:
            dtype = torch.empty(0, dtype=leaf.dtype).numpy().dtype
            _nest(spaces, leaf.key, gym.spaces.Box(0, 1 if leaf.dtype == torch.bool else 100, leaf.shape, dtype))
        self.observation_space, self.action_space = _space(spaces), gym.spaces.Discrete(2)

    def _obs(self, count: torch.Tensor) -> dict:
        obs: dict = {"count": count.numpy()}
        for i, leaf in enumerate(self.leaves):
            _nest(obs, leaf.key, values(frame_base(count), i, leaf).numpy())
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(self.episodes.reset()), {}

    def step(self, action):
        terminated, truncated = self.episodes.step()
        return self._obs(self.episodes.count()), float(self.episodes.t + int(action)), terminated, truncated, {}


class SpecTDEnv:
    """The same episodes behind TorchRL's ``EnvBase`` protocol (batch size ``[]``, ``step_and_maybe_reset``, no TorchRL
    needed), its TensorDicts holding the generated leaves in their layouts."""

    batch_size = torch.Size([])
    action_keys, done_keys, reward_keys = ["action"], list(FLAGS), ["reward"]
    full_done_spec = None  # read for its presence only

    def __init__(self, leaves: tuple, offset: int) -> None:
        self.leaves, self.episodes = leaves, Episodes(offset)

    def _obs(self, count: torch.Tensor, terminated: bool = False, truncated: bool = False) -> TensorDict:
        td = TensorDict({COUNT: count, "terminated": torch.tensor([terminated]), "truncated": torch.tensor([truncated])})
        td.set("done", td.get("terminated") | td.get("truncated"))
        for i, leaf in enumerate(self.leaves):
            td.set(("observation", *leaf.key), values(frame_base(count), i, leaf))
        return td

    def fake_tensordict(self) -> TensorDict:
        fake = self._obs(torch.zeros(3)).apply(torch.zeros_like)
        nxt = fake.clone()
        nxt.set("reward", torch.zeros(1))
        fake.update({"action": torch.zeros((), dtype=torch.int64), "next": nxt})
        return fake

    def reset(self, td: TensorDictBase | None = None) -> TensorDict:
        return self._obs(self.episodes.reset())

    def step(self, td: TensorDictBase) -> TensorDictBase:
        action = int(td.get("action"))
        terminated, truncated = self.episodes.step()
        nxt = self._obs(self.episodes.count(), terminated, truncated)
        nxt.set("reward", torch.tensor([float(self.episodes.t + action)]))
        td.set("next", nxt)
        return td

    def step_and_maybe_reset(self, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        nxt = self.step(td).get("next")
        return td, self.reset() if bool(nxt.get("done")) else nxt.exclude("reward")

    def rand_action(self, td: TensorDictBase | None = None) -> TensorDictBase:
        td = TensorDict() if td is None else td
        td.set("action", torch.tensor(1))
        return td

    def set_seed(self, seed: int) -> int:
        return seed + 1

    def close(self) -> None:
        pass


class SpecOutputs(nn.Module):
    """``count -> (action, *outputs)``: ``"action"`` (0 or 1) and the generated outputs, each in its layout."""

    def __init__(self, leaves: tuple, action_layout: str) -> None:
        super().__init__()
        self.leaves, self.action = leaves, Leaf(("action",), torch.int64, (), action_layout)

    def forward(self, count: torch.Tensor) -> tuple[torch.Tensor, ...]:
        base = frame_base(count)
        return values(base, 1, self.action, modulus=2), *(values(base, i + 1, leaf) for i, leaf in enumerate(self.leaves))


class SpecPolicy(TensorDictModuleBase):
    """Reads ``("observation", "count")`` from the TensorDict it is given and writes :class:`SpecOutputs` into it."""

    def __init__(self, leaves: tuple, action_layout: str) -> None:
        super().__init__()
        self.outputs = SpecOutputs(leaves, action_layout)
        self.in_keys, self.out_keys = [COUNT], ["action", *(leaf.key for leaf in leaves)]

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        for key, value in zip(self.out_keys, self.outputs(td.get(COUNT))):
            td.set(key, value)
        return td


def gym_env(leaves: tuple, offset: int) -> GymEnv:
    return GymEnv(SpecGymEnv(leaves, offset))


def factories(setup: Setup, n: int) -> list[Callable]:
    """One env factory per offset ``0..n-1``."""
    make = gym_env if setup.env == "gym" else SpecTDEnv
    return [functools.partial(make, setup.observations, i) for i in range(n)]


def policy_of(setup: Setup) -> TensorDictModuleBase:
    if setup.policy == "module":
        keys = ["action", *(leaf.key for leaf in setup.outputs)]
        return TensorDictModule(SpecOutputs(setup.outputs, setup.action_layout), in_keys=[COUNT], out_keys=keys)
    return SpecPolicy(setup.outputs, setup.action_layout)


# ------------------------------------------------------------------ strategies
def leaves(prefix: str, dtypes: tuple, min_size: int, max_size: int, shapes: tuple = SHAPES) -> st.SearchStrategy:
    """Leaves named ``prefix<i>``, at the root or under ``<prefix>n0``/``<prefix>n1``: unique keys, no key a prefix of another."""
    one = st.tuples(st.sampled_from(dtypes), st.sampled_from(shapes), st.sampled_from(LAYOUTS), st.sampled_from((None, 0, 1)))

    def named(drawn: list) -> tuple:
        return tuple(Leaf((f"{prefix}{i}",) if group is None else (f"{prefix}n{group}", f"{prefix}{i}"), dtype, shape, layout)
                     for i, (dtype, shape, layout, group) in enumerate(drawn))

    return st.lists(one, min_size=min_size, max_size=max_size).map(named)


def setups(min_size: int = 0, max_size: int = 4) -> st.SearchStrategy:
    def of(env: str) -> st.SearchStrategy:
        return st.builds(Setup, st.just(env), leaves("o", GYM_DTYPES if env == "gym" else TD_DTYPES, min_size, max_size),
                         leaves("p", TD_DTYPES, min_size, max_size), st.sampled_from(LAYOUTS), st.sampled_from(("td", "module")))

    return st.sampled_from(("gym", "td")).flatmap(of)


def every_dtype(prefix: str, shift: int) -> tuple:
    """A leaf of every dtype, the shapes, layouts and nesting taking turns: one example covers them all."""
    return tuple(Leaf((f"{prefix}{i}",) if (i + shift) % 3 else (f"{prefix}n0", f"{prefix}{i}"), dtype,
                      SHAPES[(i + shift) % len(SHAPES)], LAYOUTS[(i + 2 * shift) % len(LAYOUTS)])
                 for i, dtype in enumerate(TD_DTYPES))


ALL_OBS, ALL_OUT = every_dtype("o", 0), every_dtype("p", 1)
ALL_TD = Setup("td", ALL_OBS, ALL_OUT, "expand")
ALL_GYM = Setup("gym", tuple(leaf for leaf in ALL_OBS if leaf.dtype != torch.bfloat16), ALL_OUT, "sliced", "module")
# the policy output that crashed AsyncBatchedCollector at one env per pass: a [1] of stride 0, which torch calls contiguous
EXPANDED = Setup("gym", (), (Leaf(("p0",), torch.float32, (1,), "expand"),), "expand")
NESTED = Setup("gym", (), (Leaf(("pn0", "p0"), torch.int64, (2,)),))  # a nested output key: a leaf of its own in batches
TD_PLAIN = Setup("td", (), ())  # a TorchRL-protocol env, TorchRL not installed: stepped as it is


# ------------------------------------------------------------------ checks
def frame_keys(frames: TensorDictBase) -> set:
    """The leaf keys a stream is compared on: not the collector's own records (trajectory ids, env index, versions)."""
    return {key for key in frames.keys(include_nested=True, leaves_only=True)
            if key not in (ENV_INDEX, "policy_version") and not (isinstance(key, tuple) and key[0] == "collector")}


def expected_keys(setup: Setup) -> set:
    """Every leaf key of a ``Collector``'s frames but its own records, as ``TensorDict.keys`` names them."""
    observations = [COUNT, *(("observation", *leaf.key) for leaf in setup.observations)]
    outputs = ["action", *(leaf.key[0] if len(leaf.key) == 1 else leaf.key for leaf in setup.outputs)]
    return {*observations, *(("next", *key) for key in observations), *outputs, *FLAGS, *(("next", flag) for flag in FLAGS),
            ("next", "reward")}


def assert_as_generated(frames: TensorDictBase, setup: Setup) -> None:
    """The frames ``[T]`` of one env hold what the env and the policy wrote, value for value, and nothing else."""
    assert frame_keys(frames) == expected_keys(setup)
    base, after = frame_base(frames[COUNT]), frame_base(frames[("next", *COUNT)])
    for i, leaf in enumerate(setup.observations):
        for key, at in ((("observation", *leaf.key), base), (("next", "observation", *leaf.key), after)):
            got = frames[key]
            assert got.dtype == leaf.dtype and torch.equal(got, values(at, i, leaf)), key
    action = Leaf(("action",), torch.int64, (), setup.action_layout)
    assert torch.equal(frames["action"], values(base, 1, action, modulus=2))
    for i, leaf in enumerate(setup.outputs):
        assert frames[leaf.key].dtype == leaf.dtype and torch.equal(frames[leaf.key], values(base, i + 1, leaf)), leaf.key
    t, nxt = frames[COUNT], frames[("next", *COUNT)]
    assert torch.equal(nxt[:, 0], t[:, 0] + 1) and torch.equal(nxt[:, 1:], t[:, 1:])
    assert torch.equal(frames["next", "reward"][:, 0], nxt[:, 0] + frames["action"])
    going_on = ~frames["next", "done"][:-1, 0]
    assert torch.equal(t[1:][going_on], nxt[:-1][going_on]) and (t[1:][~going_on][:, 0] == 0).all()
    assert not frames["done"].any() and not frames["terminated"].any() and not frames["truncated"].any()
    ended, even = frames["next", "done"][:, 0], t[:, 1] % 2 == 0
    assert torch.equal(frames["next", "terminated"][:, 0], ended & even)
    assert torch.equal(frames["next", "truncated"][:, 0], ended & ~even)


def reference(setup: Setup, offset: int, frames: int) -> TensorDictBase:
    """``frames`` frames of the env at ``offset`` from its first reset, from a single-process ``Collector``."""
    with Collector(factories(setup, offset + 1)[offset], policy_of(setup), frames_per_batch=frames, total_frames=frames) as c:
        batch = next(iter(c))
    assert_as_generated(batch, setup)
    return batch


def streams(batches: list[TensorDictBase], num_envs: int) -> list[TensorDictBase]:
    """Each env's frames in order (told apart by their offset), from batches of any layout."""
    for batch in batches:  # a stacked [N, T] batch: lane i is worker i's
        assert batch.batch_dims == 1 or all((lane[COUNT][:, 2] == i).all() for i, lane in enumerate(batch.unbind(0)))
    frames = torch.cat([batch.reshape(-1) for batch in batches])
    offsets = frames[COUNT][:, 2]
    assert set(offsets.tolist()) <= set(range(num_envs))
    return [frames[offsets == k] for k in range(num_envs)]


def assert_same_streams(batches: list[TensorDictBase], setup: Setup, num_envs: int) -> None:
    """Each env's stream is a prefix of a ``Collector``'s on the same env: keys, dtypes, shapes, values, trajectories."""
    for offset, ours in enumerate(streams(batches, num_envs)):
        if not len(ours):
            continue
        theirs = reference(setup, offset, len(ours))
        assert frame_keys(ours) == frame_keys(theirs)
        for key in frame_keys(ours):
            mine, want = ours[key], theirs[key]
            assert (mine.dtype, mine.shape) == (want.dtype, want.shape) and torch.equal(mine, want), (offset, key)
        if ENV_INDEX in ours.keys():
            assert (ours[ENV_INDEX] == offset).all()
        if TRAJ in ours.keys(include_nested=True):  # the same trajectory boundaries
            assert torch.equal(ours[TRAJ].diff() != 0, theirs[TRAJ].diff() != 0)


def collected(collector) -> list[TensorDictBase]:
    """Every batch of ``collector``, which is shut down whatever happens."""
    with collector:
        return [batch.clone() for batch in collector]


# ------------------------------------------------------------------ in-process properties
@CHEAP
@given(setup=setups(max_size=5))
@example(setup=TD_PLAIN)  # failed: a TorchRL-protocol env without TorchRL installed (envs.with_policy_transforms)
@example(setup=ALL_TD)
@example(setup=ALL_GYM)
def test_the_collector_records_what_the_env_and_the_policy_wrote(setup):
    with Collector(factories(setup, 2)[1], policy_of(setup), frames_per_batch=7, total_frames=14) as c:
        frames = torch.cat([batch.clone() for batch in c])
    assert_as_generated(frames, setup)


@CHEAP
@given(setup=setups(max_size=5), sync=st.booleans())
@example(setup=ALL_TD, sync=True)
def test_rpc_collector_in_process_hands_out_the_collectors_frames(setup, sync):
    assert_same_streams(collected(RPCCollector(factories(setup, 2), policy_of(setup), frames_per_batch=16, total_frames=48,
                                               launcher="debug", sync=sync)), setup, 2)


def plane_rows(observations: tuple, num_envs: int) -> TensorDict:
    """The step plane's rows of ``num_envs`` envs observing ``observations``."""
    rows = TensorDict({"action": torch.zeros(num_envs, dtype=torch.int64), ("next", "reward"): torch.zeros(num_envs, 1)},
                      batch_size=[num_envs])
    for leaf in observations:
        for key in (leaf.key, ("next", *leaf.key)):
            rows.set(key, torch.zeros(num_envs, *leaf.shape, dtype=leaf.dtype))
    for flag in FLAGS:
        rows.set(("next", flag), torch.zeros(num_envs, 1, dtype=torch.bool))
    return rows


@settings(deadline=None, derandomize=True, database=None, max_examples=100)
@given(observations=leaves("o", TD_DTYPES, 0, 4, LARGE), outputs=leaves("p", TD_DTYPES, 0, 4, LARGE),
       action_layout=st.sampled_from(LAYOUTS), num_envs=st.integers(1, 4), frames_per_batch=st.integers(1, 4),
       turns=st.lists(st.tuples(st.integers(1, 15), st.booleans(), st.sampled_from((False, False, False, True))),
                      min_size=6, max_size=24))
# the first failed before transitions.source_rows (an expanded output for one env), the second before
# transitions.output_leaves (a nested output key); the second also has rows past LARGE_ROW, a cut and envs out of order
@example(observations=(), outputs=EXPANDED.outputs, action_layout="expand", num_envs=2, frames_per_batch=2,
         turns=[(1, False, False), (2, False, False), (1, False, False), (3, False, False)])
@example(observations=(Leaf(("on0", "o0"), torch.bfloat16, (520,)),), outputs=NESTED.outputs, action_layout="sliced",
         num_envs=3, frames_per_batch=2, turns=[(7, False, False), (5, False, True), (7, True, False), (7, False, False)])
def test_transitions_hand_out_each_staged_transition_in_order(observations, outputs, action_layout, num_envs,
                                                               frames_per_batch, turns):
    """As the inference loop drives it: a turn records the envs whose steps completed, stages what the policy chose
    for them (outputs in their layouts, the envs in any order) and steps them; a cut marks an env's held transition.
    Each frame handed out holds what chose its action and what its step gave."""
    rows, action = plane_rows(observations, num_envs), Leaf(("action",), torch.int64, (), action_layout)
    one = TensorDict({"action": torch.zeros(1, dtype=torch.int64),
                      **{leaf.key: torch.zeros(1, *leaf.shape, dtype=leaf.dtype) for leaf in outputs}}, batch_size=[1])
    transitions = Transitions(rows, {key: value[0] for key, value in one.items()}, frames_per_batch, "policy_version", 1)
    steps = [0] * num_envs
    in_flight: list[dict | None] = [None] * num_envs  # what chose each env's action in flight
    held: list[dict | None] = [None] * num_envs  # each env's latest complete transition
    due, released, handed = [], [], []  # the model's transitions due and moved into batches; the batches handed out

    def observe(env: int) -> None:  # the env stepped: its row holds the step's result and its next observation
        base = torch.tensor(10.0 * env + steps[env], dtype=torch.float64)
        for i, leaf in enumerate(observations):
            rows[leaf.key][env] = rows[("next", *leaf.key)][env] = values(base, i, leaf)
        rows["next", "reward"][env] = float(steps[env])
        rows["next", "done"][env] = steps[env] % 3 == 0

    for env in range(num_envs):
        observe(env)
    for version, (mask, reverse, cut) in enumerate(turns):
        envs = [env for env in range(num_envs) if mask >> env & 1] or [mask % num_envs]
        if cut:  # the env's worker was replaced: its step in flight is lost, its held transition marked and due
            env, frame = envs[0], held[envs[0]]
            if frame is not None:
                frame["next", "truncated"] = frame["next", "truncated"] | ~frame["next", "done"]
                frame["next", "done"] = torch.ones(1, dtype=torch.bool)
                released, due, held[env] = released + due + [frame], [], None
            in_flight[env] = None
            handed += transitions.cut(env)
            continue
        completed = sorted(env for env in envs if in_flight[env] is not None)
        for env in completed:
            due += [] if held[env] is None else [held[env]]
            held[env], in_flight[env] = in_flight[env], None
            held[env].update({key: rows[key][env].clone() for key in transitions.next_keys})
        transitions.record(completed)
        envs = envs[::-1] if reverse else envs
        index = torch.tensor(envs)
        inputs = {key: rows.get(key).index_select(0, index) for key in transitions.obs_keys}
        bases = torch.tensor([100.0 * env + steps[env] for env in envs], dtype=torch.float64)
        chosen = TensorDict({"action": values(bases, 1, action, modulus=2),
                             **{leaf.key: values(bases, i + 1, leaf) for i, leaf in enumerate(outputs)}}, batch_size=[len(envs)])
        transitions.check(chosen, len(envs))
        handed += transitions.stage(envs, inputs, chosen, version)
        released, due = released + due, []
        for j, env in enumerate(envs):
            in_flight[env] = {"env": env, "version": version, **{key: value[j].clone() for key, value in inputs.items()},
                              **{key: value[j].clone() for key, value in chosen.items(True, True)}}
            steps[env] += 1
            observe(env)
    frames = [frame for batch in handed for frame in batch.unbind(0)]
    assert all(batch.shape == (frames_per_batch,) for batch in handed)
    assert len(frames) == len(released) // frames_per_batch * frames_per_batch
    for got, want in zip(frames, released):
        assert got[ENV_INDEX] == want.pop("env") and got["policy_version"] == want.pop("version")
        assert not any(got[flag].any() for flag in FLAGS)
        assert frame_keys(got) - set(FLAGS) == set(want)
        for key, value in want.items():
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


# ------------------------------------------------------------------ properties of the kinds that start processes
PROCESS_KINDS: dict[str, Callable] = {  # (env factories, policy) -> a collector of 2 workers (AsyncCollector: 1)
    "multi-sync": lambda envs, policy: MultiCollector(envs, policy, frames_per_batch=16, total_frames=48, sync=True),
    "multi-async": lambda envs, policy: MultiCollector(envs, policy, frames_per_batch=8, total_frames=48, sync=False),
    "async": lambda envs, policy: AsyncCollector(envs[0], policy, frames_per_batch=8, total_frames=24),
    "rpc-local": lambda envs, policy: RPCCollector(envs, policy, frames_per_batch=16, total_frames=48, launcher="local"),
}


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", PROCESS_KINDS)
@PROCESSES
@given(setup=setups(min_size=3, max_size=6))
@example(setup=ALL_TD)  # failed: a TorchRL-protocol env without TorchRL installed (envs.with_policy_transforms)
@example(setup=ALL_GYM)
def test_worker_processes_hand_out_the_collectors_frames(kind, setup):
    num_envs = 1 if kind == "async" else 2
    assert_same_streams(collected(PROCESS_KINDS[kind](factories(setup, num_envs), policy_of(setup))), setup, num_envs)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(300)
@settings(deadline=None, derandomize=True, database=None, max_examples=10)
@given(setup=setups(min_size=3, max_size=6), num_envs=st.integers(1, 4), envs_per_worker=st.integers(1, 3),
       max_batch_size=st.integers(1, 4), max_policy_lag=st.sampled_from([None, 1, 2]))
@example(setup=EXPANDED, num_envs=2, envs_per_worker=1, max_batch_size=1,  # failed before transitions.source_rows
         max_policy_lag=None)
@example(setup=NESTED, num_envs=2, envs_per_worker=2, max_batch_size=2,  # failed: transitions.output_leaves
         max_policy_lag=None)
@example(setup=ALL_TD, num_envs=3, envs_per_worker=3, max_batch_size=3, max_policy_lag=1)
def test_batched_inference_hands_out_each_envs_collector_frames(setup, num_envs, envs_per_worker, max_batch_size,
                                                                max_policy_lag):
    collector = AsyncBatchedCollector(factories(setup, num_envs), policy=policy_of(setup), frames_per_batch=8,
                                      total_frames=32, envs_per_worker=envs_per_worker,
                                      max_batch_size=min(max_batch_size, num_envs), max_policy_lag=max_policy_lag)
    batches = collected(collector)
    assert [batch.shape for batch in batches] == [torch.Size([8])] * 4
    assert_same_streams(batches, setup, num_envs)
