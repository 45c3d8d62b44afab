"""TorchRL's ``AsyncCollector``: one collector in a background process.

It is :class:`~rpc_collectors.MultiAsyncCollector` with one worker, under TorchRL 0.14.1's
name and signature: the worker keeps collecting while the trainer works, and each batch is
the worker's ``[(B,) T]`` batch.
"""
from __future__ import annotations

from typing import Any

from tensordict.nn import InteractionType

from rpc_collectors.collectors.multi import MultiAsyncCollector, local_options


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

    Every other option (``frames_per_batch``, ``total_frames``, the devices,
    ``max_frames_per_traj``, ``init_random_frames``, ``reset_at_each_iter``, ``postproc``,
    ``exploration_type``, ``reset_when_done``, ``preemptive_threshold``, ``num_threads``,
    ``set_truncated``, ``track_policy_version``, ...) is as for
    :class:`~rpc_collectors.MultiAsyncCollector` (``weight_updater`` and ``weight_recv_schemes``
    too),
    but its ``num_workers`` and ``num_collectors`` (one worker).
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
        cat_results: str | int | None = None,
        launcher: str = "local",
        tcp_port: int | str | None = None,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        rpc_timeout: float = 60.0,
        collector_kwargs: dict | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        collector_class: Any = "single",
        num_workers_per_collector: int = 1,
        inference: str = "worker",
        replay_buffer: Any = None,
        metrics: Any = None,
        init_fn: Any = None,
        track_traj_ids: bool = True,
        compile_policy: bool | dict | None = None,
        compact_obs: bool = False,
        pre_collect_hook: Any = None,
        post_collect_hook: Any = None,
        trajs_per_batch: int | None = None,
        replay_write_mode: str | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        auto_register_policy_transforms: bool | None = None,
        use_buffers: bool | None = None,
        extend_buffer: bool = True,
        trust_policy: bool | None = None,
        cudagraph_policy: bool | dict | None = None,
        weight_sync_schemes: dict | None = None,
        weight_updater: Any = None,
        weight_recv_schemes: dict | None = None,
    ) -> None:
        if num_sub_threads != 1:
            raise ValueError(
                f"num_sub_threads={num_sub_threads!r} is not supported; accepted: 1 (the worker "
                "runs one torch thread)"
            )
        arguments = dict(locals(), total_frames=-1 if total_frames is None else total_frames,
                         sync=False)
        self._start([create_env_fn], policy, local_options([create_env_fn], None, arguments))
