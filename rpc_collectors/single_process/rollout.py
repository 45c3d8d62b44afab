"""Stepping one env for a batch of steps and recording the transitions in TorchRL's layout.

:class:`ArrayRollout` steps a :class:`~rpc_collectors.single_process.envs.GymEnv` through numpy
arrays and builds the batch TensorDict once per batch; :class:`EnvBaseRollout` steps a TorchRL env
as TorchRL's collectors do, and :class:`TensorDictRollout` any other env with TorchRL's ``EnvBase``
protocol (``reset``, ``step(td)``, ``batch_size``). All keep the env's state and trajectory ids
across batches.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.single_process import gym_spaces
from rpc_collectors.single_process.envs import GymEnv, is_torchrl_env
from rpc_collectors.single_process.phase_clock import PhaseClock
from rpc_collectors.single_process.policies import StepPolicy
from rpc_collectors.single_process.step_count import word
from rpc_collectors.single_process.step_records import FLAGS, StepRecords, set_marks
from rpc_collectors.single_process.step_stacking import _dense, _stack_steps, end_of_trajectory
from rpc_collectors.single_process.trajectories import TRAJ_IDS, TrajectoryIds


class ArrayRollout:
    """Fast rollout of a GymEnv: per step only numpy work and the policy call.

    ``out``, if not empty, holds the tensors of a shared-memory slot by key
    (:func:`~rpc_collectors.transport.data.tensors_by_key`): the steps are stacked straight into
    them instead of into new ones. ``device``: the CPU,
    where the collector stores batches on it (they are made there), else None (no device).
    """

    def __init__(self, env: GymEnv, traj_ids: TrajectoryIds,
                 max_frames_per_traj: int | None) -> None:
        self.env, self.traj_ids, self.max_steps = env, traj_ids, max_frames_per_traj
        self.obs: dict | None = None
        self.traj: Any = None
        # the tensors of the slot the next batch goes to, by key (see tensors_by_key)
        self.out: dict = {}
        # the policy's outputs but the action, zeros of one step
        self.policy_zeros: dict = {}
        self.device: torch.device | None = None
        # times its policy calls and env steps
        self.clock = PhaseClock()
        # the frames its env stepped (step_count: a local worker's is shared with its pool)
        self.counted = word()

    def invalidate(self) -> None:
        """Start the next batch from a fresh reset."""
        self.obs = None

    @property
    def fresh(self) -> bool:
        """True until the first step after a reset (or before any reset)."""
        return self.obs is None or self.traj is None

    @property
    def needs_reset(self) -> bool:
        """The next batch starts from a reset."""
        return self.obs is None

    def cut(self) -> None:
        """The trajectories in progress continue under new ids from the next
        step (the env goes on)."""
        if self.obs is not None and self.traj is not None:
            ids = self.traj_ids.new(self.env.num_envs)
            self.traj = ids if self.env.is_vector else int(ids[0])

    def reset(self) -> None:
        self.obs = self.env.reset_arrays()
        # ids are handed out at the first step: a reset never stepped costs none
        self.traj = None
        self.steps = np.zeros(self.env.num_envs, np.int64) if self.env.is_vector else 0

    def probe(self, policy: StepPolicy) -> dict:
        """Call ``policy`` on the current observation without stepping (checks a new policy)."""
        if self.obs is None:
            self.reset()
        return policy({k: torch.from_numpy(v) for k, v in self.obs.items()}, self.env.batch_size)

    def collect(self, num_steps: int, policy: StepPolicy | None,
                stopped: Callable[[], bool] | None = None,
                marks: Callable[[], dict] | None = None) -> TensorDict:
        """Step ``num_steps`` times with ``policy`` (random actions if None); fewer if ``stopped()``
        turns True (checked after each step); ``marks()``, called once the steps are done: entries
        set on every step (see :func:`~rpc_collectors.single_process.step_records.set_marks`)."""
        if self.obs is None:
            self.reset()
        if self.traj is None:
            ids = self.traj_ids.new(self.env.num_envs)
            self.traj = ids if self.env.is_vector else int(ids[0])
        env, vector, max_steps = self.env, self.env.is_vector, self.max_steps
        batch = env.batch_size
        counted, frames = self.counted, env.num_envs
        rec = StepRecords(self.out)
        timing, now, stamps = self.clock.steps(num_steps)
        timed = env_ns = 0
        for timed_step in timing:
            obs = self.obs
            if policy is None:
                out = {"action": env.sample_action()}
            else:
                out = policy({k: torch.from_numpy(v) for k, v in obs.items()}, batch)
            if timed_step:
                read = now()
            next_obs, reward, term, trunc = env.step_arrays(env.action_to_numpy(out["action"]))
            counted.value += frames
            rec.obs.append(obs)
            rec.next_obs.append(next_obs)
            rec.add_outputs(out)
            rec.rewards.append(reward)
            rec.traj_ids.append(self.traj)
            if max_steps is not None:
                rec.counts.append(self.steps)
                self.steps = self.steps + 1
                trunc = (np.logical_or(trunc, self.steps >= max_steps) if vector else trunc
                         or self.steps >= max_steps)
            rec.terminated.append(term)
            rec.truncated.append(trunc)
            if vector:
                done = np.logical_or(term, trunc)
                if done.any():
                    reset_obs = env.reset_arrays(done)
                    self.obs = {k: gym_spaces.where(done, reset_obs[k], v)
                                for k, v in next_obs.items()}
                    self.traj = self.traj.copy()
                    self.traj[done] = self.traj_ids.new(int(done.sum()))
                    self.steps = np.where(done, 0, self.steps)
                else:
                    self.obs = next_obs
            elif term or trunc:
                self.obs = env.reset_arrays()
                self.traj = int(self.traj_ids.new(1)[0])
                self.steps = 0
            else:
                self.obs = next_obs
            if timed_step:
                env_ns, timed = env_ns + now() - read, timed + 1
            if stopped is not None and stopped():
                break
        self.clock.stepped(len(rec.rewards), timed, env_ns, stamps)
        return rec.to_tensordict(batch, vector, self.policy_zeros, self.device,
                                 marks() if marks is not None else {})


class TensorDictRollout:
    """Rollout of an env with TorchRL's ``EnvBase`` protocol (``reset``, ``step(td)``,
    ``batch_size``) but without its specs.

    The next step's root is built as TorchRL's ``step_mdp`` builds it: this step's root without
    ``"next"``, actions and rewards (policy outputs and other entries are carried), updated with
    every entry of ``"next"`` but its rewards.
    """

    def __init__(self, env: Any, traj_ids: TrajectoryIds, max_frames_per_traj: int | None) -> None:
        self.env, self.traj_ids, self.max_steps = env, traj_ids, max_frames_per_traj
        self.td: TensorDictBase | None = None
        self.stepped = False
        # the policy's outputs but the action, zeros of one step
        self.policy_zeros: dict = {}
        # times its policy calls and env steps
        self.clock = PhaseClock()
        # the frames its env stepped (step_count: a local worker's is shared with its pool)
        self.counted = word()
        # how steps are stacked (_stack_steps): "dense" is TorchRL's use_buffers=True
        self.stacking = "auto"
        self.rewards = list(getattr(env, "reward_keys", ["reward"]))
        self.dropped = ["next", "_reset", *getattr(env, "action_keys", ["action"]), *self.rewards]

    def invalidate(self) -> None:
        """Start the next batch from a fresh reset."""
        self.td = None

    @property
    def fresh(self) -> bool:
        """True until the first step after a reset (or before any reset)."""
        return self.td is None or not self.stepped

    @property
    def needs_reset(self) -> bool:
        """The next batch starts from a reset."""
        return self.td is None

    def cut(self) -> None:
        """The trajectories in progress continue under new ids from the next
        step (the env goes on)."""
        if self.td is not None and self.stepped:
            ids = self.td.get(TRAJ_IDS)
            self.td.set(TRAJ_IDS,
                        torch.as_tensor(self.traj_ids.new(ids.numel())).reshape(ids.shape))

    def reset(self) -> None:
        self.td = _dense(self.env.reset())
        # ids are handed out at the first step: a reset never stepped costs none
        self.stepped = False
        # as a StepCounter's reset: a count, and a truncated flag
        if self.max_steps is not None:
            self.td.set("step_count", torch.zeros(*self.env.batch_size, 1, dtype=torch.int64))
            if "truncated" not in self.td.keys():
                self.td.set("truncated", torch.zeros_like(self.td.get("done")))

    def probe(self, policy: StepPolicy) -> dict:
        """Call ``policy`` on a copy of the current state without stepping (checks a new policy)."""
        if self.td is None:
            self.reset()
        return policy(self.td.clone(), self.env.batch_size)

    def collect(self, num_steps: int, policy: StepPolicy | None,
                stopped: Callable[[], bool] | None = None,
                marks: Callable[[], dict] | None = None) -> TensorDictBase:
        if self.td is None:
            self.reset()
        env, batch, steps = self.env, self.env.batch_size, []
        # frames a step of its envs gives
        counted, frames = self.counted, int(np.prod(batch)) if len(batch) else 1
        if not self.stepped:
            self.td.set(TRAJ_IDS, torch.as_tensor(self.traj_ids.new(frames)).reshape(batch))
            self.stepped = True
        timing, now, stamps = self.clock.steps(num_steps)
        timed = env_ns = 0
        for timed_step in timing:
            td = self.td
            if policy is None:
                td = env.rand_action(td)
            else:
                td.update(policy(td, batch))
            if timed_step:
                read = now()
            td = env.step(td)
            counted.value += frames
            nxt = td.get("next")
            dense = _dense(nxt)
            # a lazy stack the env writes again: keep a copy of its own
            if dense is not nxt:
                nxt = dense
                td.set("next", nxt)
            # random actions: the policy's other outputs not carried yet, as zeros
            if policy is None:
                for key, zero in self.policy_zeros.items():
                    if key not in td.keys(include_nested=True):
                        td.set(key, zero)
            if self.max_steps is not None:
                count = td.get("step_count") + 1
                nxt.set("step_count", count)
                capped = count >= self.max_steps
                nxt.set("truncated", nxt.get("truncated", torch.zeros_like(capped)) | capped)
                nxt.set("done", nxt.get("done") | capped)
            steps.append(td)
            self.td = self._next_root(nxt, td)
            if timed_step:
                env_ns, timed = env_ns + now() - read, timed + 1
            if stopped is not None and stopped():
                break
        self.clock.stepped(len(steps), timed, env_ns, stamps)
        return set_marks(_stack_steps(steps, len(batch), self.stacking),
                         marks() if marks is not None else {})

    def _next_root(self, nxt: TensorDictBase, td: TensorDictBase) -> TensorDictBase:
        """The root of the next step: the next state, with finished envs reset."""
        # its own nested TensorDicts: setting in them leaves td's
        root = td.exclude(*self.dropped).clone(False)
        root.update(nxt.exclude(*self.rewards))
        done = nxt.get("done")
        if not done.any():
            return root
        if len(self.env.batch_size) == 0:
            fresh = self.env.reset()
            mask = torch.ones((), dtype=torch.bool)
        else:
            mask = done.reshape(self.env.batch_size)
            # the whole state with "_reset", as TorchRL's collectors pass it: a batched env of
            # individual TensorDicts (share_individual_td=True) reads its device and keys from it
            request = root.exclude(TRAJ_IDS)
            request.set("_reset", done.clone())
            fresh = self.env.reset(request)
        # set, not written in place: a lazy stack's get() is a copy
        ids = root.get(TRAJ_IDS).clone()
        ids[mask] = torch.as_tensor(self.traj_ids.new(int(mask.sum())))
        root.set(TRAJ_IDS, ids)
        # a fresh episode is not done, whether or not reset() says so
        for key in FLAGS:
            if key in root.keys():
                flag = root.get(key)
                root.set(key, flag & ~mask.reshape(*mask.shape, *[1] * (flag.dim() - mask.dim())))
        for key in fresh.keys(include_nested=True, leaves_only=True):
            if key == "_reset":
                continue
            value = fresh.get(key)
            if len(self.env.batch_size) == 0:
                root.set(key, value)
            else:
                rows = mask.reshape(*mask.shape, *[1] * (value.dim() - mask.dim()))
                root.set(key, torch.where(rows, value, root.get(key)))
        if self.max_steps is not None:
            rows = mask.reshape(*mask.shape, 1) if mask.dim() else mask
            root.set("step_count", torch.where(rows, 0, root.get("step_count")))
        return root


class EnvBaseRollout(TensorDictRollout):
    """Rollout of a TorchRL ``EnvBase``, stepped as TorchRL's collectors step it: with the env's own
    ``step_and_maybe_reset`` (its ``step_mdp`` builds the next root from its specs and it resets the
    envs its ``done_keys`` mark, nested keys included), trajectory ids from those ``done_keys``.

    ``max_frames_per_traj`` is the env's ``StepCounter`` here (the collector appends it, as
    TorchRL's does).
    """

    def __init__(self, env: Any, traj_ids: TrajectoryIds) -> None:
        super().__init__(env, traj_ids, None)
        self.done_keys = list(env.done_keys)

    def reset(self) -> None:
        self.td = _dense(self.env.reset())
        self.stepped = False

    def collect(self, num_steps: int, policy: StepPolicy | None,
                stopped: Callable[[], bool] | None = None,
                marks: Callable[[], dict] | None = None) -> TensorDictBase:
        if self.td is None:
            self.reset()
        env, batch, steps = self.env, self.env.batch_size, []
        # frames a step of its envs gives
        counted, frames = self.counted, int(np.prod(batch)) if len(batch) else 1
        if not self.stepped:
            self.td.set(TRAJ_IDS, torch.as_tensor(self.traj_ids.new(frames)).reshape(batch))
            self.stepped = True
        timing, now, stamps = self.clock.steps(num_steps)
        timed = env_ns = 0
        for timed_step in timing:
            td = self.td
            if policy is None:
                td = env.rand_action(td)
                # the policy's other outputs, as zeros
                for key, zero in self.policy_zeros.items():
                    if key not in td.keys(include_nested=True):
                        td.set(key, zero)
            else:
                td.update(policy(td, batch))
            if timed_step:
                read = now()
            ids = td.get(TRAJ_IDS)
            td, root = env.step_and_maybe_reset(td)
            counted.value += frames
            nxt = td.get("next")
            dense = _dense(nxt)
            # a lazy stack the env writes again: keep a copy of its own
            if dense is not nxt:
                td.set("next", dense)
            steps.append(td)
            ended = end_of_trajectory(dense, self.done_keys, batch)
            if ended.any():
                ids = ids.clone()
                ids[ended] = torch.as_tensor(self.traj_ids.new(int(ended.sum())))
            root = _dense(root)
            root.set(TRAJ_IDS, ids)
            self.td = root
            if timed_step:
                env_ns, timed = env_ns + now() - read, timed + 1
            if stopped is not None and stopped():
                break
        self.clock.stepped(len(steps), timed, env_ns, stamps)
        return set_marks(_stack_steps(steps, len(batch), self.stacking),
                         marks() if marks is not None else {})


def rollout_for(env: Any, traj_ids: TrajectoryIds, max_frames_per_traj: int | None,
                storing_device: Any) -> Any:
    """The rollout that steps ``env``'s kind: a ``GymEnv`` (batches made on the CPU when stored
    there), a TorchRL env, or any other env on TensorDicts."""
    if isinstance(env, GymEnv):
        rollout = ArrayRollout(env, traj_ids, max_frames_per_traj)
        if storing_device == torch.device("cpu"):
            rollout.device = storing_device
        return rollout
    if is_torchrl_env(env):
        return EnvBaseRollout(env, traj_ids)
    return TensorDictRollout(env, traj_ids, max_frames_per_traj)
