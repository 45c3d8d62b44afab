"""The gymnasium spaces a :class:`~rpc_collectors.single_process.envs.GymEnv` accepts, the keys of
its observations' leaves (down a nested Dict space), and the numpy row operations of its partial
resets."""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


def obs_keys(space: gym.Space, path: tuple = ("observation",)) -> list:
    """The key of each observation leaf: ``"observation"``, or ``("observation",
    name, ...)`` down a (nested) Dict."""
    if isinstance(space, gym.spaces.Dict):
        return [key for name, sub in space.spaces.items() for key in obs_keys(sub, (*path, name))]
    return [path] if len(path) > 1 else ["observation"]


def leaf(obs: Any, key: Any) -> Any:
    """The part of a (nested) Dict observation, or of its space, at an observation key."""
    for name in key[1:] if isinstance(key, tuple) else ():
        obs = obs[name]
    return obs


def check_space(space: gym.Space, what: str) -> None:
    accepted = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                gym.spaces.MultiBinary)
    if isinstance(space, gym.spaces.Dict) and what == "observation":
        for sub in space.spaces.values():
            check_space(sub, what)
        return
    if not isinstance(space, accepted):
        raise TypeError(
            f"GymEnv: unsupported {what} space {space!r}; accepted: Box, Discrete, MultiDiscrete, "
            f"MultiBinary{' or a (nested) Dict of those' if what == 'observation' else ''}"
        )


def scatter(ids: np.ndarray, rows: np.ndarray, num_envs: int) -> np.ndarray:
    """``rows`` placed at ``ids`` of an array of ``num_envs`` rows (the others zero)."""
    out = np.zeros((num_envs, *rows.shape[1:]), rows.dtype)
    out[ids] = rows
    return out


def where(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rows of ``a`` where ``mask`` (one entry per env) is True, else rows of ``b``."""
    return np.where(mask.reshape(-1, *([1] * (a.ndim - 1))), a, b)
