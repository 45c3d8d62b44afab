"""TorchRL's ``AsyncCollector``: one collector in a background process.

It is :class:`~rpc_collectors.MultiAsyncCollector` with one worker, under TorchRL 0.14.1's
name and signature: the worker keeps collecting while the trainer works, and each batch is
the worker's ``[(B,) T]`` batch.
"""
from __future__ import annotations

from typing import Any

from tensordict.nn import InteractionType

from rpc_collectors.collectors.multi import MultiAsyncCollector


class AsyncCollector(MultiAsyncCollector):
    """Collects from ``create_env_fn`` in one worker process, as TorchRL's ``AsyncCollector``.

    Args:
        create_env_fn: an env factory (or env) for the worker.
        policy, policy_factory: as for :class:`~rpc_collectors.Collector`; a factory builds the
            policy in the worker (push its weights with ``update_policy_weights_(weights)``).
        create_env_kwargs: keyword arguments for ``create_env_fn``.
        split_trajs: None is False.
        update_at_each_batch: push the trainer's weights after each batch, before the worker's next.
        num_sub_threads: the worker's torch threads; 1 only (the worker runs one thread).

    Every other keyword (``frames_per_batch``, ``total_frames``, the devices,
    ``max_frames_per_traj``, ``init_random_frames``, ``reset_at_each_iter``, ``postproc``,
    ``exploration_type``, ``reset_when_done``, ``preemptive_threshold``, ``num_threads``,
    ``set_truncated``, ``track_policy_version``, ...) is as for
    :class:`~rpc_collectors.MultiAsyncCollector`.
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Any = None,
        frames_per_batch: int,
        total_frames: int | None = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        create_env_kwargs: dict | None = None,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool | None = None,
        exploration_type: Any = InteractionType.RANDOM,
        reset_when_done: bool = True,
        update_at_each_batch: bool = False,
        preemptive_threshold: float | None = None,
        num_threads: int | None = None,
        num_sub_threads: int = 1,
        set_truncated: bool = False,
        track_policy_version: bool = False,
        **kwargs: Any,
    ) -> None:
        if num_sub_threads != 1:
            raise ValueError(
                f"num_sub_threads={num_sub_threads!r} is not supported; accepted: 1 (the worker runs one torch thread)"
            )
        super().__init__(
            [create_env_fn], policy, policy_factory=policy_factory, frames_per_batch=frames_per_batch,
            total_frames=-1 if total_frames is None else total_frames, device=device, storing_device=storing_device,
            env_device=env_device, policy_device=policy_device, create_env_kwargs=create_env_kwargs,
            max_frames_per_traj=max_frames_per_traj, init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter, postproc=postproc, split_trajs=bool(split_trajs),
            exploration_type=exploration_type, reset_when_done=reset_when_done,
            update_at_each_batch=update_at_each_batch, preemptive_threshold=preemptive_threshold,
            num_threads=num_threads, set_truncated=set_truncated, track_policy_version=track_policy_version,
            **kwargs,
        )
