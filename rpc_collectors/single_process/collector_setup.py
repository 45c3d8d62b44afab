"""How a single-process :class:`~rpc_collectors.single_process.collector.Collector` is set up from
its options: the options it keeps, its env with the transforms and batch edits they ask for, the
rollout that steps it, and the first look at the policy's outputs.

Each function takes the collector being built and sets its attributes.
"""
from __future__ import annotations

from typing import Any

import torch
from tensordict.nn import set_interaction_type

from rpc_collectors.core import checks, options, torchrl_args
from rpc_collectors.single_process import batch_edits, envs
from rpc_collectors.single_process.policies import MissingAction, check_action_shape
from rpc_collectors.single_process.rollout import TensorDictRollout, rollout_for
from rpc_collectors.single_process.trajectories import TrajectoryIds


def keep_options(collector: Any, c: options.Collect, worker_idx: Any, no_cuda_sync: Any,
                 interruptor: Any, weight_sync_schemes: Any) -> bool | None:
    """Keep the worker's options (``c``) and TorchRL's single-process ones;
    ``use_buffers`` as checked."""
    # this collector makes no CUDA synchronize calls to skip
    checks.boolean("no_cuda_sync", no_cuda_sync)
    collector.interruptor = checks.interruptor(interruptor)
    collector.track_traj_ids = c.track_traj_ids
    checks.split_needs_ids(collector.split_trajs or collector.whole_trajectories,
                           collector.track_traj_ids)
    collector.worker_idx = (None if worker_idx is None
                            else checks.non_negative_int("worker_idx", worker_idx))
    collector.compile_policy = c.compile_policy
    use_buffers = checks.use_buffers(c.use_buffers, collector.replay_buffer)
    # -1 is None
    collector.max_frames_per_traj = checks.max_frames_per_traj(c.max_frames_per_traj)
    # None and -1 are 0
    collector.init_random_frames = checks.init_random_frames(c.init_random_frames)
    collector.reset_at_each_iter = c.reset_at_each_iter
    collector.pre_collect_hook = c.pre_collect_hook
    collector.devices = checks.devices(c.device, c.storing_device, c.env_device, c.policy_device)
    collector.exploration_type = c.exploration_type
    collector.track_policy_version = c.track_policy_version
    # the policy is in this process: a scheme only says whether
    # update_policy_weights_ does anything
    scheme = torchrl_args.weight_sync_schemes(weight_sync_schemes, "auto")
    collector._no_push = scheme == torchrl_args.NO_PUSH
    return use_buffers


def open_env(collector: Any, create_env_fn: Any, policy: Any, c: options.Collect) -> int:
    """Build the env with the transforms its options ask for, its action
    keys and batch edits; its number of envs."""
    collector.env = envs.make_env(create_env_fn, checks.env_kwargs(c.create_env_kwargs))
    torchrl_env = envs.is_torchrl_env(collector.env)
    if collector.max_frames_per_traj is not None:
        checks.no_step_counter(collector.env, c.max_frames_per_traj)
        # as TorchRL's collectors: the env counts its steps
        if torchrl_env:
            collector.env = envs.with_step_counter(collector.env, collector.max_frames_per_traj)
    collector.env = envs.with_policy_transforms(collector.env, policy,
                                                c.auto_register_policy_transforms)
    collector.action_keys = list(collector.env.action_keys) if torchrl_env else ["action"]
    # TorchRL's RandomPolicy() without a spec
    if callable(getattr(policy, "set_action_spec_from_env", None)):
        policy.set_action_spec_from_env(collector.env)
    collector.truncated_keys = batch_edits.truncated_keys(collector.env) if c.set_truncated else []
    collector.compact_keys = batch_edits.observation_keys(collector.env) if c.compact_obs else []
    return int(torch.Size(collector.env.batch_size).numel())


def check_random_actions(collector: Any, create_env_fn: Any, policy: Any) -> None:
    """Random actions (no policy, or ``init_random_frames``) need the env's ``rand_action()``."""
    random_actions = collector.policy is None or collector.init_random_frames
    if random_actions and not callable(getattr(collector.env, "rand_action", None)):
        raise TypeError(
            f"create_env_fn={create_env_fn!r} gave an env without rand_action(), which random "
            f"actions (policy={policy!r}, init_random_frames={collector.init_random_frames}) need; "
            "accepted: an env with rand_action(td), or a policy with init_random_frames=0"
        )


def open_rollout(collector: Any, traj_ids: TrajectoryIds, use_buffers: bool | None) -> None:
    """The rollout that steps this env kind, and how it stacks steps
    (TorchRL's ``_use_buffers``)."""
    collector.traj_ids = traj_ids
    collector.rollout = rollout_for(collector.env, traj_ids, collector.max_frames_per_traj,
                                    collector.devices["storing_device"])
    # metrics=False: a clock that reads no time
    collector.rollout.clock = collector._meter.watch(collector.rollout.clock)
    # a GymEnv's batches are dense always
    if isinstance(collector.rollout, TensorDictRollout):
        whole_batches = (collector.replay_buffer is not None and collector.extend_buffer
                         and not collector.split_trajs)
        lazy_ok = whole_batches and collector.trajs_per_batch is None
        collector.rollout.stacking = "dense" if use_buffers else "lazy" if lazy_ok else "auto"
    # TorchRL's attribute: batches are dense unless the env's shapes change
    # or a buffer takes them (lazy stacks then)
    lazy = (getattr(collector.rollout, "stacking", None) == "lazy"
            or getattr(collector.env, "_has_dynamic_specs", False))
    collector._use_buffers = use_buffers if use_buffers is not None else not lazy


def check_policy(collector: Any) -> None:
    """Run the policy once on a reset observation: the other outputs it writes are recorded
    (zero-filled in random-action steps). A policy that writes no action is refused by the
    first batch, as TorchRL's first step refuses it (env transforms may be what it lacks).

    The env is not stepped; the first batch starts from this reset (and its seed, if any).
    """
    try:
        with torch.no_grad(), set_interaction_type(collector.exploration_type):
            out = collector.rollout.probe(collector.policy)
    except MissingAction:
        return
    if isinstance(collector.env, envs.GymEnv):
        check_action_shape(collector.policy.source, out, collector.env.action_shape,
                           collector.env.action_space)
    collector.rollout.policy_zeros = collector.policy.zeros_of_other_outputs(out)
