"""An env worker of a batched-inference collector: it steps its envs with the actions the trainer
writes into their rows of the step plane
(:mod:`rpc_collectors.transport.step_plane`), and runs no policy.

Per step of an env: wait for its "go" byte, read the action from its row, step the env, write
the step's result (``"next"``) and the next observation (after a reset, if the episode ended)
into the row, answer with the ready byte. No pickle: a gymnasium env's arrays are copied into
shared memory directly; a TorchRL env's TensorDict entries are copied there. An entry whose
shape is not its row's (an observation that changed its shape) is a ValueError naming it, never
broadcast.

A worker of several envs splits them into two halves (Sample Factory's double buffering) and
steps them in turn: it steps one half and rings its envs' ready bytes, then waits for the
actions of the other half, which the trainer computed meanwhile, and steps it. While the
trainer acts for one half, the worker steps the other, so it never idles waiting for actions
as long as a half's step takes at least as long as a forward pass. With one env it is the
plain step loop above. Each env's first reset is done before the worker's ``join_steps`` call
returns, so a seed the trainer sets afterwards applies from the next reset on.

The loop marks its worker's collector's phase clock
(:mod:`~rpc_collectors.single_process.phase_clock`, read anew each turn: a trace window may swap
it) three times per half: ``idle`` once its actions came, ``env`` once its envs stepped and wrote
their results into their rows, ``write`` once it rang their ready bytes. So the worker's ``phases``
and ``trace`` calls (:mod:`~rpc_collectors.worker.observing`) answer for it; with ``metrics=False``
the clock reads no time.
"""
from __future__ import annotations

import os
import threading
import traceback
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.core.metrics import WorkerPhases
from rpc_collectors.core.protocol import WorkerSpec
from rpc_collectors.single_process.envs import GymEnv, is_torchrl_env, make_env
from rpc_collectors.transport.data import SlotSpec
from rpc_collectors.transport.doorbell import _write_all
from rpc_collectors.transport.step_plane import READY, StepGroup, send_error
from rpc_collectors.worker.served_collector import ServedCollector
from rpc_collectors.worker.single import SlotWriter

FLAGS = ("done", "terminated", "truncated")


def _next_key(key: str | tuple) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def step_row(env: Any) -> TensorDict:
    """One env's row of the step plane (zeros): its observation, its action, and under ``"next"``
    the observation, reward and done flags a step gives, as TorchRL lays out a transition."""
    if isinstance(env, GymEnv) and not env.is_vector:
        return _gym_row(env)
    if is_torchrl_env(env) and not len(env.batch_size) and list(env.action_keys) == ["action"]:
        fake = env.fake_tensordict()
        # what the policy reads
        row = fake.exclude("next", "action", *env.done_keys).clone()
        row.set("action", fake.get("action").clone())
        row.set("next", fake.get("next").clone())
        return row
    raise TypeError(
        f"AsyncBatchedCollector: the env factory gave {env!r}; accepted: a factory of one env: a "
        "gymnasium id, gymnasium.Env or rpc_collectors.GymEnv (not a vector env), or a TorchRL env "
        "of batch size [] whose action key is 'action'"
    )


def _gym_row(env: GymEnv) -> TensorDict:
    row = TensorDict()
    for key in env.obs_keys:
        space = env.obs_space(key)
        zeros = torch.from_numpy(np.zeros(space.shape, space.dtype))
        row.set(key, zeros)
        row.set(_next_key(key), zeros.clone())
    row.set("action", torch.zeros(env.action_shape, dtype=env.sample_action().dtype))
    row.set(("next", "reward"), torch.zeros(1, dtype=torch.float32))
    for flag in FLAGS:
        row.set(("next", flag), torch.zeros(1, dtype=torch.bool))
    return row


class EnvRow:
    """One env and its row of the step plane: :meth:`reset` and :meth:`step` write into the row.

    A :class:`GymEnv` steps through numpy arrays; a TorchRL env with its own
    ``step_and_maybe_reset``, its root and ``"next"`` entries copied into the row."""

    def __init__(self, env: Any, spec: SlotSpec) -> None:
        self.env, self.index = env, spec.row
        # maps the plane; this env's row is target 0
        self.writer = SlotWriter(spec)
        self.row = row = self.writer.targets[0]
        self.action = row.get("action")
        leaves = list(row.keys(include_nested=True, leaves_only=True))
        self.root_keys = [k for k in leaves
                          if k != "action" and not (isinstance(k, tuple) and k[0] == "next")]
        self.next_keys = [k for k in leaves if isinstance(k, tuple) and k[0] == "next"]
        if isinstance(env, GymEnv):
            self.obs = {key: row.get(key).numpy() for key in env.obs_keys}
            self.next_obs = {key: row.get(_next_key(key)).numpy() for key in env.obs_keys}
            self.reward, self.flags = row.get(("next",
                                               "reward")).numpy(), [row.get(
                                                   ("next", f)).numpy() for f in FLAGS]
            self.reset, self.step = self._gym_reset, self._gym_step
        else:
            self.root: TensorDictBase | None = None
            self.reset, self.step = self._torchrl_reset, self._torchrl_step
        self.go, self.ready = spec.doorbell.open()

    def _fits(self, key: str | tuple, shape: tuple, want: tuple) -> None:
        """Raise ValueError unless the env gave ``key`` the shape its row holds (no broadcast)."""
        if tuple(shape) != tuple(want):
            raise ValueError(
                f"AsyncBatchedCollector: env {self.index} gave {key!r} of shape {list(shape)}; "
                f"accepted: shape {list(want)}, the shape it had at start-up (an env's entries "
                "keep their shapes)"
            )

    def _write_obs(self, obs: dict) -> None:
        for key, value in obs.items():
            dest = self.obs[key]
            self._fits(key, np.shape(value), dest.shape)
            np.copyto(dest, value, casting="unsafe")

    def _gym_reset(self) -> None:
        self._write_obs(self.env.reset_arrays())

    def _gym_step(self) -> None:
        env = self.env
        next_obs, reward, term, trunc = env.step_arrays(env.action_to_numpy(self.action))
        for key, value in next_obs.items():
            dest = self.next_obs[key]
            self._fits(_next_key(key), np.shape(value), dest.shape)
            np.copyto(dest, value, casting="unsafe")
        self.reward[0] = reward
        done = bool(term) or bool(trunc)
        self.flags[0][0], self.flags[1][0], self.flags[2][0] = done, bool(term), bool(trunc)
        self._write_obs(env.reset_arrays() if done else next_obs)

    def _write_root(self, root: TensorDictBase) -> None:
        self.root = root
        for key in self.root_keys:
            self._copy(key, root.get(key))

    def _copy(self, key: str | tuple, value: torch.Tensor) -> None:
        dest = self.row.get(key)
        self._fits(key, value.shape, dest.shape)
        dest.copy_(value)

    def _torchrl_reset(self) -> None:
        self._write_root(self.env.reset())

    def _torchrl_step(self) -> None:
        td = self.root
        td.set("action", self.action.clone())
        td, root = self.env.step_and_maybe_reset(td)
        for key in self.next_keys:
            self._copy(key, td.get(key))
        self._write_root(root)


class EnvSteps:
    """The step loop of a worker's envs (:class:`EnvRow`), in a thread of the worker, until the
    trainer closes a doorbell: the envs in two halves, stepped in turn (one env: one half).

    Args:
        collector: the worker's collector: its env is the group's first, its ``phase_clock`` the one
            the loop marks.
        group: the rows of the group's envs, the specs of its other envs (built here) and its seed.
    """

    def __init__(self, collector: ServedCollector, group: StepGroup) -> None:
        self.collector = collector
        # env steps taken, in its rollout's word (the one its pool reads)
        self.counted = collector.rollout.counted
        envs = [collector.env]
        for data in group.others:
            spec = WorkerSpec.loads(data)
            envs.append(make_env(spec.create_env_fn, spec.options.get("create_env_kwargs")))
        self.envs: list[EnvRow] = []
        try:
            for e, spec in zip(envs, group.rows):
                self.envs.append(EnvRow(e, spec))
            if group.seed is not None:
                self.set_seed(group.seed)
            # the first resets, before the trainer's call returns: a seed set after applies next
            for row in self.envs:
                row.reset()
            _ring(self.envs)
        except BaseException:
            self._close()
            raise
        half = -(-len(self.envs) // 2)
        self.halves = [part for part in (self.envs[:half], self.envs[half:]) if part]
        self.thread = threading.Thread(target=self._serve, name="rpc-collectors-env-steps",
                                       daemon=True)
        self.thread.start()

    def set_seed(self, seed: int) -> None:
        """Seed the group's env ``i`` with ``seed + i`` from its next reset on (the first env
        is also the worker's collector's, which the worker seeds itself)."""
        for i, row in enumerate(self.envs[1:], start=1):
            row.env.set_seed(seed + i)

    def phases(self, worker_id: int) -> tuple[WorkerPhases]:
        """Its env steps and its phase clock's totals: the worker's answer to ``phases``."""
        frames = self.counted.value
        return (WorkerPhases(worker_id, os.getpid(), frames, 0,
                             dict(self.collector.phase_clock.totals_ns), frames),)

    def _serve(self) -> None:
        current = self.envs[0]
        collector = self.collector
        try:
            try:
                while True:
                    for half in self.halves:
                        for row in half:
                            if not os.read(row.go, 1):
                                return
                        clock = collector.phase_clock
                        clock.mark("idle")
                        for current in half:
                            current.step()
                        self.counted.value += len(half)
                        clock.mark("env")
                        _ring(half)
                        clock.mark("write")
            except Exception:
                # an env raised: its traceback goes to the trainer on its pipe
                send_error(current.ready, traceback.format_exc())
        except OSError:
            # the trainer closed a doorbell, or went away
            pass
        finally:
            self._close()

    def _close(self) -> None:
        for row in self.envs:
            os.close(row.go)
            os.close(row.ready)


def _ring(half: list[EnvRow]) -> None:
    """Tell the trainer that the envs of ``half`` hold their steps' results
    and next observations."""
    for row in half:
        _write_all(row.ready, READY)
