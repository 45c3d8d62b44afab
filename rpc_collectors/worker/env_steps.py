"""An env worker of a batched-inference collector: it steps its env with the actions the trainer
writes into its row of the step plane (:mod:`rpc_collectors.planes.step_plane`), and runs no policy.

Per step: wait for the "go" byte, read the action from the row, step the env, write the step's
result (``"next"``) and the next observation (after a reset, if the episode ended) into the
row, answer with the ready byte. Numpy copies into shared memory, no TensorDict and no pickle.
"""
from __future__ import annotations

import os
import threading
import traceback

import numpy as np
import torch
from tensordict import TensorDict

from rpc_collectors.collection.envs import GymEnv
from rpc_collectors.planes.doorbell import _write_all
from rpc_collectors.planes.slots import SlotSpec, SlotWriter
from rpc_collectors.planes.step_plane import READY, send_error

FLAGS = ("done", "terminated", "truncated")


def _next_key(key: str | tuple) -> tuple:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def step_row(env: GymEnv) -> TensorDict:
    """One env's row of the step plane (zeros): its observation, its action, and under ``"next"``
    the observation, reward and done flags a step gives, as TorchRL lays out a transition."""
    if not isinstance(env, GymEnv) or env.is_vector:
        raise TypeError(
            f"AsyncBatchedCollector: the env factory gave {env!r}; accepted: a factory of one gymnasium env "
            "(an id, a gymnasium.Env or rpc_collectors.GymEnv of one env, not a vector env)"
        )
    row = TensorDict()
    for key in env.obs_keys:
        space = env.observation_space[key[1]] if isinstance(key, tuple) else env.observation_space
        zeros = torch.from_numpy(np.zeros(space.shape, space.dtype))
        row.set(key, zeros)
        row.set(_next_key(key), zeros.clone())
    row.set("action", torch.zeros(env.action_shape, dtype=env.sample_action().dtype))
    row.set(("next", "reward"), torch.zeros(1, dtype=torch.float32))
    for flag in FLAGS:
        row.set(("next", flag), torch.zeros(1, dtype=torch.bool))
    return row


class EnvSteps:
    """The step loop of one env, in a thread of its worker, until the trainer closes the doorbell."""

    def __init__(self, env: GymEnv, spec: SlotSpec) -> None:
        self.env = env
        self.writer = SlotWriter(spec)  # maps the plane; this env's row is target 0
        row = self.writer.targets[0]
        self.obs = {key: row.get(key).numpy() for key in env.obs_keys}
        self.next_obs = {key: row.get(_next_key(key)).numpy() for key in env.obs_keys}
        self.action = row.get("action")
        self.reward, self.flags = row.get(("next", "reward")).numpy(), [row.get(("next", f)).numpy() for f in FLAGS]
        self.go, self.ready = spec.doorbell.open()
        self.thread = threading.Thread(target=self._serve, name="rpc-collectors-env-steps", daemon=True)
        self.thread.start()

    def _write_obs(self, obs: dict) -> None:
        for key, value in obs.items():
            np.copyto(self.obs[key], value, casting="unsafe")

    def _serve(self) -> None:
        env = self.env
        try:
            try:
                self._write_obs(env.reset_arrays())
                _write_all(self.ready, READY)
                while os.read(self.go, 1):
                    next_obs, reward, term, trunc = env.step_arrays(env.action_to_numpy(self.action))
                    for key, value in next_obs.items():
                        np.copyto(self.next_obs[key], value, casting="unsafe")
                    self.reward[0] = reward
                    done = bool(term) or bool(trunc)
                    self.flags[0][0], self.flags[1][0], self.flags[2][0] = done, bool(term), bool(trunc)
                    self._write_obs(env.reset_arrays() if done else next_obs)
                    _write_all(self.ready, READY)
            except Exception:  # the env raised: its traceback goes to the trainer
                send_error(self.ready, traceback.format_exc())
        except OSError:  # the trainer closed the doorbell, or went away
            pass
        finally:
            os.close(self.go)
            os.close(self.ready)
