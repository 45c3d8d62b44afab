"""Gymnasium environments behind TorchRL's ``EnvBase`` protocol.

:class:`GymEnv` wraps a gymnasium env (an id, an instance or a vector env) so that
``reset()`` / ``step(td)`` speak TensorDicts with TorchRL's keys. Collectors step it through
its array methods (``reset_arrays`` / ``step_arrays``), which skip per-step TensorDict work.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.core import user_warnings
from rpc_collectors.single_process import gym_spaces

# {key or key tuple: np.ndarray}
ObsDict = dict
# vector envs that reset some of their envs (reset_mask)
PARTIAL_RESETS = (SyncVectorEnv, AsyncVectorEnv)


def resumed_seed(seed: int, resumes: int) -> int:
    """The env seed of the ``resumes``-th resume of a run seeded with ``seed``
    (from its seed sequence)."""
    return int(np.random.SeedSequence(seed, spawn_key=(resumes,)).generate_state(1)[0])


def check_env_id(env_id: str, argument: str) -> None:
    """A gymnasium id that does not exist (or whose module does not import) is a
    ValueError naming it."""
    try:
        gym.spec(env_id)
    except (gym.error.Error, ImportError) as err:
        raise ValueError(
            f"{argument}={env_id!r} is not a registered gymnasium env id ({err}); accepted: an id "
            "in gymnasium.registry such as 'CartPole-v1', or "
            "'module:EnvId-v0' for an env registered on import"
        ) from err


class GymEnv:
    """A gymnasium env as a TensorDict env with batch size ``[]`` or ``[num_envs]``.

    Args:
        env: a gymnasium id (``"CartPole-v1"``), a ``gymnasium.Env`` or a
            ``gymnasium.vector.VectorEnv``.
        num_envs: build a synchronous vector env of this many copies (ids only).
        categorical_action_encoding: discrete actions as integer indices (default) or, if False,
            one-hot vectors as TorchRL's ``GymEnv`` does by default.
        **make_kwargs: passed to ``gymnasium.make`` / ``gymnasium.make_vec``.

    Observation spaces: Box, Discrete, MultiDiscrete, MultiBinary, or a Dict of those (nested
    Dicts too), whose leaves are recorded under ``("observation", name, ...)``.

    Vector envs step in ``AutoresetMode.DISABLED`` (those built here) or ``SAME_STEP`` mode, so
    ``("next", "observation")`` is always the true final observation of an episode. Both reset
    single envs on request (``reset_arrays(mask)``, ``reset(td)`` with ``td["_reset"]``). In
    ``NEXT_STEP`` mode (gymnasium's default, and EnvPool's) the collector resets a finished env
    itself, before the env would spend its next step on the reset, so no reset is ever recorded
    as a transition; that needs partial resets, which gymnasium's ``SyncVectorEnv`` and
    ``AsyncVectorEnv`` (``reset_mask``) and EnvPool (``env_id``) have.
    """

    def __init__(
        self,
        env: str | gym.Env | VectorEnv,
        *,
        num_envs: int | None = None,
        categorical_action_encoding: bool = True,
        **make_kwargs: Any,
    ) -> None:
        if num_envs is not None and (not isinstance(num_envs, int) or num_envs < 1):
            raise ValueError(f"GymEnv: num_envs={num_envs!r} is invalid; "
                             "accepted: None or an int >= 1")
        if isinstance(env, str):
            check_env_id(env, "GymEnv: env")
            if num_envs is None:
                env = gym.make(env, **make_kwargs)
            else:
                env = gym.make_vec(
                    env, num_envs=num_envs, vectorization_mode="sync",
                    vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED}, **make_kwargs,
                )
        elif num_envs is not None:
            raise ValueError("GymEnv: num_envs is only accepted with a "
                             "gymnasium id, not an env instance")
        if not isinstance(env, (gym.Env, VectorEnv)):
            raise TypeError(
                f"GymEnv: env={env!r} is not accepted; expected a gymnasium id, gymnasium.Env or "
                "gymnasium.vector.VectorEnv"
            )
        self.env = env
        self.is_vector = isinstance(env, VectorEnv)
        if self.is_vector:
            mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
            # EnvPool
            self._reset_by_id = "env_id" in inspect.signature(env.reset).parameters
            resets_some = isinstance(env.unwrapped, PARTIAL_RESETS) or self._reset_by_id
            if mode == AutoresetMode.NEXT_STEP and not resets_some:
                raise ValueError(
                    f"GymEnv: the vector env {env!r} autoresets in NEXT_STEP mode and offers no "
                    "partial reset, so a finished env would spend its next step on a reset that "
                    "is not a transition; accepted: gymnasium's SyncVectorEnv or AsyncVectorEnv "
                    "(any mode), EnvPool envs (envpool.make_gymnasium), or another vector env "
                    "in DISABLED or SAME_STEP autoreset mode"
                )
            self.autoreset_mode = mode
            self.num_envs = env.num_envs
            self.batch_size = torch.Size([env.num_envs])
            self.observation_space = env.single_observation_space
            self.action_space = env.single_action_space
        else:
            self.autoreset_mode, self._reset_by_id = None, False
            self.num_envs = 1
            self.batch_size = torch.Size([])
            self.observation_space = env.observation_space
            self.action_space = env.action_space
        self._space_of_one = self.is_vector and env.action_space == self.action_space
        gym_spaces.check_space(self.observation_space, "observation")
        gym_spaces.check_space(self.action_space, "action")
        self.one_hot = (isinstance(self.action_space, gym.spaces.Discrete)
                        and not categorical_action_encoding)
        self.obs_keys = gym_spaces.obs_keys(self.observation_space)
        self._seed: int | None = None
        # SAME_STEP vector envs: observations and done mask returned by the last step
        self._final_pending: ObsDict | None = None
        self._final_done: np.ndarray | None = None

    # ----------------------------------------------------------------- array interface
    def _obs_dict(self, obs: Any) -> ObsDict:
        if isinstance(obs, dict):
            return {key: np.array(gym_spaces.leaf(obs, key)) for key in self.obs_keys}
        return {"observation": np.array(obs)}

    def reset_arrays(self, mask: np.ndarray | None = None) -> ObsDict:
        """Reset all envs (``mask=None``) or those where ``mask`` is True; return observations."""
        seed, self._seed = self._seed, None
        if mask is None or not self.is_vector:
            self._final_pending = self._final_done = None
            obs, _ = self.env.reset(seed=seed)
            return self._obs_dict(obs)
        if self.autoreset_mode == AutoresetMode.SAME_STEP and self._final_pending is not None:
            # envs whose episode ended were reset by the env inside step(); reset the others
            # (e.g. truncated by max_frames_per_traj) here
            pending, rest = self._final_pending, mask & ~self._final_done
            if not rest.any():
                return pending
            fresh = self._obs_dict(self.env.reset(seed=seed, options={"reset_mask": rest})[0])
            return {key: gym_spaces.where(rest, fresh[key], value)
                    for key, value in pending.items()}
        # EnvPool: the observations of the reset envs only
        if self._reset_by_id:
            ids = np.flatnonzero(mask)
            fresh = self._obs_dict(self.env.reset(ids)[0])
            return {key: gym_spaces.scatter(ids, value, self.num_envs)
                    for key, value in fresh.items()}
        obs, _ = self.env.reset(seed=seed, options={"reset_mask": mask})
        return self._obs_dict(obs)

    def step_arrays(self, action: np.ndarray | int) -> tuple[ObsDict, Any, Any, Any]:
        """Step with a numpy action; return (next observation, reward, terminated, truncated)."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            done = np.logical_or(terminated, truncated)
            self._final_done = done
            self._final_pending = self._obs_dict(obs)
            if done.any():
                final = info["final_obs"]
                obs = {key: arr.copy() for key, arr in self._final_pending.items()}
                for i in np.flatnonzero(done):
                    for key in self.obs_keys:
                        obs[key][i] = gym_spaces.leaf(final[i], key)
                return obs, reward, terminated, truncated
        return self._obs_dict(obs), reward, terminated, truncated

    def action_to_numpy(self, action: torch.Tensor) -> np.ndarray | int:
        """Convert a policy's action tensor to what ``gymnasium`` expects."""
        if self.one_hot:
            action = action.argmax(-1)
        if not self.is_vector and isinstance(self.action_space, gym.spaces.Discrete):
            return int(action)
        return action.detach().cpu().numpy()

    def obs_space(self, key: Any) -> gym.Space:
        """The observation space of one observation key (of ``obs_keys``)."""
        return gym_spaces.leaf(self.observation_space, key)

    @property
    def action_shape(self) -> torch.Size | None:
        """The shape of the action tensor a policy must give for all envs together (None: a space
        without one shape, such as Dict)."""
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            per_env = (int(space.n),) if self.one_hot else ()
        elif isinstance(space, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            per_env = tuple(space.shape)
        else:
            return None
        return torch.Size([*self.batch_size, *per_env])

    def sample_action(self) -> torch.Tensor:
        """One random action for every env, as a tensor in this env's action encoding."""
        space = self.env.action_space
        # EnvPool: a vector env whose action_space is one env's
        if self._space_of_one:
            sample = torch.as_tensor(np.stack([space.sample() for _ in range(self.num_envs)]))
        else:
            sample = torch.as_tensor(np.asarray(space.sample()))
        if self.one_hot:
            sample = torch.nn.functional.one_hot(sample, int(self.action_space.n))
        return sample

    # ------------------------------------------------------------ TensorDict interface
    def _to_td(self, obs: ObsDict) -> TensorDict:
        return TensorDict({k: torch.as_tensor(v) for k, v in obs.items()},
                          batch_size=self.batch_size)

    def _flags(self, terminated: Any, truncated: Any) -> dict[str, torch.Tensor]:
        term = torch.as_tensor(np.asarray(terminated, dtype=bool)).reshape(*self.batch_size, 1)
        trunc = torch.as_tensor(np.asarray(truncated, dtype=bool)).reshape(*self.batch_size, 1)
        return {"done": term | trunc, "terminated": term, "truncated": trunc}

    def reset(self, td: TensorDictBase | None = None) -> TensorDict:
        """Reset every env, or those where ``td["_reset"]`` is True; returns
        observation and all-False done flags."""
        mask = None
        if td is not None and self.is_vector and "_reset" in td.keys():
            mask = td.get("_reset").reshape(self.batch_size).cpu().numpy()
        out = self._to_td(self.reset_arrays(mask))
        out.update(self._flags(np.zeros(self.batch_size, bool), np.zeros(self.batch_size, bool)))
        return out

    def step(self, td: TensorDictBase) -> TensorDictBase:
        """Step with ``td["action"]``; writes the transition under
        ``td["next"]`` and returns ``td``."""
        obs, reward, terminated, truncated = self.step_arrays(self.action_to_numpy(td["action"]))
        nxt = self._to_td(obs)
        nxt["reward"] = torch.as_tensor(np.asarray(reward, dtype=np.float32)).reshape(
            *self.batch_size, 1
        )
        nxt.update(self._flags(terminated, truncated))
        td["next"] = nxt
        return td

    def rand_action(self, td: TensorDictBase | None = None) -> TensorDictBase:
        """Write a random action from the action space into ``td`` (a new one if None)."""
        td = TensorDict(batch_size=self.batch_size) if td is None else td
        td["action"] = self.sample_action()
        return td

    def set_seed(self, seed: int) -> int:
        """Seed the next reset and the action space; return the next free seed."""
        self._seed = int(seed)
        self.env.action_space.seed(int(seed))
        return int(seed) + self.num_envs

    def close(self) -> None:
        self.env.close()

    def __repr__(self) -> str:
        return f"GymEnv({self.env!r}, batch_size={list(self.batch_size)})"


def make_env(create_env_fn: Any, kwargs: dict | None = None,
             argument: str = "create_env_fn") -> Any:
    """Build an env from what a collector received: an env, a gymnasium id, or a callable returning
    one, called with ``kwargs`` (TorchRL's ``create_env_kwargs``).

    Classes and callables are called; only an instance with the env protocol is taken as an env
    (a TorchRL env is callable, an env class has ``reset``/``step`` attributes).
    """
    env, kwargs = create_env_fn, kwargs or {}
    if isinstance(env, str):
        env = GymEnv(env, **kwargs)
    elif isinstance(env, type) or (callable(env) and not _is_env(env)):
        env = env(**kwargs)
    elif kwargs:
        if not callable(getattr(env, "update_kwargs", None)):
            raise ValueError(
                f"create_env_kwargs={kwargs!r} cannot be given to the env instance {env!r}; "
                "accepted: an env factory (or a TorchRL batched env, which "
                "takes them with update_kwargs)"
            )
        env.update_kwargs(kwargs)
    if isinstance(env, (gym.Env, VectorEnv)):
        env = GymEnv(env)
    if not _is_env(env):
        raise TypeError(
            f"{argument}={create_env_fn!r} gave {env!r}, which is not an env; accepted: a GymEnv, "
            "a gymnasium id or env, an object with reset(), step(td) and batch_size "
            "(TorchRL's EnvBase), or a callable returning one"
        )
    return env


def _is_env(obj: Any) -> bool:
    """An env instance: ``reset``, ``step`` and ``batch_size`` (a class is not an instance)."""
    if isinstance(obj, type):
        return False
    return all(callable(getattr(obj, m, None)) for m in ("reset", "step")) and hasattr(
        obj, "batch_size"
    )



def is_torchrl_env(env: Any) -> bool:
    """A TorchRL ``EnvBase``: it has specs and steps with ``step_and_maybe_reset``."""
    return callable(getattr(env, "step_and_maybe_reset", None)) and hasattr(env, "full_done_spec")


def with_step_counter(env: Any, max_steps: int) -> Any:
    """A TorchRL env whose trajectories end after ``max_steps`` steps (TorchRL's ``StepCounter``,
    appended as its collectors append it for ``max_frames_per_traj``)."""
    # a TorchRL env: TorchRL is installed
    from torchrl.envs import StepCounter, TransformedEnv

    return TransformedEnv(env, StepCounter(max_steps=max_steps))


def _is_env_base(env: Any) -> bool:
    """Whether ``env`` is an instance of TorchRL's ``EnvBase`` (whose module is
    imported once one exists)."""
    envs = sys.modules.get("torchrl.envs")
    return envs is not None and isinstance(env, envs.EnvBase)


def with_policy_transforms(env: Any, policy: Any, register: bool | None) -> Any:
    """TorchRL's ``auto_register_policy_transforms``: True appends the transforms a recurrent policy
    needs (``InitTracker``, ``TensorDictPrimer``) to the TorchRL env if it lacks them; None leaves
    the env as it is and warns when they lack (TorchRL 0.14's default); False leaves it silently.

    Invariant: only an instance of TorchRL's ``EnvBase`` is handed to TorchRL's helpers; an env
    that merely has its protocol (a hand-written one, ``step_and_maybe_reset`` and all, TorchRL
    installed or not) steps as it is under None, and True is a ValueError naming the argument."""
    if register is False or policy is None:
        return env
    if not _is_env_base(env):
        if register:
            raise ValueError(
                "auto_register_policy_transforms=True appends TorchRL transforms, which need a "
                f"TorchRL env (an instance of torchrl.envs.EnvBase), not {env!r}; "
                "accepted with this env: None or False"
            )
        return env
    import torchrl.modules.utils.utils as torchrl_utils

    if register:
        return torchrl_utils._maybe_append_env_transforms_from_module(env, policy)
    missing = torchrl_utils._compute_missing_env_transforms(env, policy)
    if missing:
        user_warnings.warn(
            "the env lacks transforms the policy needs "
            f"({', '.join(type(t).__name__ for t in missing)}); pass "
            "auto_register_policy_transforms=True to append them (TorchRL 0.15's "
            "default), or False to silence this",
            FutureWarning,
        )
    return env
