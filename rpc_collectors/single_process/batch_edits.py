"""What a collector changes in a batch after its rollout, on TorchRL's arguments: ``set_truncated``
(the last step truncated), ``compact_obs`` (no ``("next", obs)`` copies),
``track_traj_ids=False``."""
from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from rpc_collectors.single_process.envs import GymEnv, is_torchrl_env
from rpc_collectors.single_process.trajectories import TRAJ_IDS


def _key(key: Any) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def truncated_keys(env: Any) -> list[tuple]:
    """The env's done keys named ``"truncated"``, which ``set_truncated=True`` sets at a batch's
    last step; a ``ValueError`` if it has none, as TorchRL raises."""
    if isinstance(env, GymEnv) or not is_torchrl_env(env):
        # GymEnv and spec-less envs: the rollout writes ("next", "truncated")
        keys = [("truncated",)]
    else:
        keys = [_key(key) for key in env.done_keys if _key(key)[-1] == "truncated"]
    if not keys:
        raise ValueError(
            f"set_truncated=True needs a 'truncated' done key, which the env {env!r} lacks (its "
            f"done keys: {list(env.done_keys)}); accepted: set_truncated=False, or an "
            "env with one (env.add_truncated_keys())"
        )
    return keys


def set_truncated(batch: TensorDictBase, keys: list[tuple]) -> None:
    """Mark the last step of ``batch`` truncated (and done) under each of
    ``keys``, as TorchRL does."""
    # time is the batch's last dim; nested
    last_step = (slice(None),) * (batch.batch_dims - 1) + (-1,)
    # entries may have more dims of their own (("data", "truncated") of [T, 3, 1])
    for key in keys:
        truncated = batch.get(("next", *key)).clone()
        truncated[last_step] = True
        batch.set(("next", *key), truncated)
        done = ("next", *key[:-1], "done")
        batch.set(done, batch.get(done) | truncated)


def observation_keys(env: Any) -> list[tuple]:
    """The ``("next", ...)`` entries ``compact_obs=True`` drops: the env's observations and state
    (its reset keys but done flags), which the next step's root holds too."""
    if isinstance(env, GymEnv):
        return [("next", *_key(key)) for key in env.obs_keys]
    if not is_torchrl_env(env):
        raise ValueError(
            "compact_obs=True needs an env with observation specs (a TorchRL env or a GymEnv), "
            f"not {env!r}; accepted with this env: compact_obs=False"
        )
    # TorchRL's compact_obs keys
    keys = list(env._observation_keys_step_mdp) + list(env._state_keys_step_mdp)
    return [("next", *_key(key)) for key in keys]


def drop_traj_ids(batch: TensorDictBase) -> None:
    """``track_traj_ids=False``: no ``("collector", "traj_ids")`` in the batch."""
    batch.exclude(TRAJ_IDS, inplace=True)
