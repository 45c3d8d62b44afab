"""An env worker of a batched-inference collector: it steps its env with the actions the trainer
writes into its row of the step plane (:mod:`rpc_collectors.transport.step_plane`), and runs no policy.

Per step: wait for the "go" byte, read the action from the row, step the env, write the step's
result (``"next"``) and the next observation (after a reset, if the episode ended) into the
row, answer with the ready byte. No pickle: a gymnasium env's arrays are copied into shared
memory directly; a TorchRL env's TensorDict entries are copied there. An entry whose shape is
not its row's (an observation that changed its shape) is a ValueError naming it, never broadcast.
"""
from __future__ import annotations

import os
import threading
import traceback
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.single_process.envs import GymEnv, is_torchrl_env
from rpc_collectors.transport.data import SlotSpec, SlotWriter
from rpc_collectors.transport.doorbell import _write_all
from rpc_collectors.transport.step_plane import READY, send_error

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
        row = fake.exclude("next", "action", *env.done_keys).clone()  # what the policy reads
        row.set("action", fake.get("action").clone())
        row.set("next", fake.get("next").clone())
        return row
    raise TypeError(
        f"AsyncBatchedCollector: the env factory gave {env!r}; accepted: a factory of one env: a gymnasium id, "
        "gymnasium.Env or rpc_collectors.GymEnv (not a vector env), or a TorchRL env of batch size [] whose "
        "action key is 'action'"
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


class EnvSteps:
    """The step loop of one env, in a thread of its worker, until the trainer closes the doorbell.

    A :class:`GymEnv` steps through numpy arrays; a TorchRL env with its own
    ``step_and_maybe_reset``, its root and ``"next"`` entries copied into the row."""

    def __init__(self, env: Any, spec: SlotSpec) -> None:
        self.env, self.index = env, spec.row
        self.writer = SlotWriter(spec)  # maps the plane; this env's row is target 0
        self.row = row = self.writer.targets[0]
        self.action = row.get("action")
        leaves = list(row.keys(include_nested=True, leaves_only=True))
        self.root_keys = [k for k in leaves if k != "action" and not (isinstance(k, tuple) and k[0] == "next")]
        self.next_keys = [k for k in leaves if isinstance(k, tuple) and k[0] == "next"]
        if isinstance(env, GymEnv):
            self.obs = {key: row.get(key).numpy() for key in env.obs_keys}
            self.next_obs = {key: row.get(_next_key(key)).numpy() for key in env.obs_keys}
            self.reward, self.flags = row.get(("next", "reward")).numpy(), [row.get(("next", f)).numpy() for f in FLAGS]
            self._reset, self._step = self._gym_reset, self._gym_step
        else:
            self.root: TensorDictBase | None = None
            self._reset, self._step = self._torchrl_reset, self._torchrl_step
        self.go, self.ready = spec.doorbell.open()
        self.thread = threading.Thread(target=self._serve, name="rpc-collectors-env-steps", daemon=True)
        self.thread.start()

    def _fits(self, key: str | tuple, shape: tuple, want: tuple) -> None:
        """Raise ValueError unless the env gave ``key`` the shape its row holds (no broadcast)."""
        if tuple(shape) != tuple(want):
            raise ValueError(
                f"AsyncBatchedCollector: env {self.index} gave {key!r} of shape {list(shape)}; accepted: shape "
                f"{list(want)}, the shape it had at start-up (an env's entries keep their shapes)"
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

    def _serve(self) -> None:
        try:
            try:
                self._reset()
                _write_all(self.ready, READY)
                while os.read(self.go, 1):
                    self._step()
                    _write_all(self.ready, READY)
            except Exception:  # the env raised: its traceback goes to the trainer
                send_error(self.ready, traceback.format_exc())
        except OSError:  # the trainer closed the doorbell, or went away
            pass
        finally:
            os.close(self.go)
            os.close(self.ready)
