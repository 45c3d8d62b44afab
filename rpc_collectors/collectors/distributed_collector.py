"""TorchRL's ``DistributedCollector`` and ``DistributedSyncCollector``.

TorchRL runs these over ``torch.distributed`` point-to-point sends; here each is the
collector front over the same pools as :class:`~rpc_collectors.RPCCollector` (the launcher
picks them: ``"submitit"``, TorchRL's default, submits one SLURM job per collector; ``"mp"``
starts local processes), with TorchRL's signatures, defaults and stacked sync layout.
"""
from __future__ import annotations

from typing import Any

from tensordict.nn import InteractionType

from rpc_collectors.collectors.multi import MultiCollector
from rpc_collectors.collectors.rpc import options_of
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.trainer.collector_front import CollectorFront


def _cadence(update_interval: int | None, update_after_each_batch: bool,
             max_weight_update_interval: int) -> dict:
    """TorchRL's ``update_interval`` (push the weights every k batches) in this front's terms:
    k=1 is ``update_after_each_batch``, k>1 ``max_weight_update_interval=k-1``."""
    if update_interval is None:
        return {"update_after_each_batch": update_after_each_batch,
                "max_weight_update_interval": max_weight_update_interval}
    not_int = isinstance(update_interval, bool) or not isinstance(update_interval, int)
    if not_int or update_interval < 1:
        raise ValueError(f"update_interval={update_interval!r} is invalid; accepted: None or an "
                         "int >= 1")
    if update_after_each_batch or max_weight_update_interval != -1:
        raise ValueError(
            f"update_interval={update_interval!r} conflicts with "
            f"update_after_each_batch={update_after_each_batch!r}, "
            f"max_weight_update_interval={max_weight_update_interval!r}; accepted: one way to set "
            "the weight cadence"
        )
    if update_interval == 1:
        return {"update_after_each_batch": True, "max_weight_update_interval": -1}
    return {"update_after_each_batch": False, "max_weight_update_interval": update_interval - 1}


def _node_collectors(arguments: dict) -> dict:
    """``arguments`` with TorchRL's default ``collector_class`` (its ``Collector``, one worker
    each) as ``"single"``."""
    if arguments["collector_class"] is Collector and arguments["num_workers_per_collector"] == 1:
        return dict(arguments, collector_class="single")
    return arguments


class DistributedCollector(CollectorFront):
    """TorchRL's ``DistributedCollector``: N collectors on SLURM jobs (``launcher="submitit"``) or
    local processes (``"mp"``); sync batches stacked ``[N, (B,) T]``, async ones one worker's.

    ``policy`` and TorchRL's other arguments keep their meaning and defaults (``sync=False``,
    ``launcher="submitit"``, ``update_interval``: push the weights every k batches);
    ``create_env_fn`` is a list with one env factory per collector, or one factory with
    ``num_collectors``. Every other option is as for :class:`~rpc_collectors.RPCCollector`
    (``elastic``, ``rpc_timeout``, ``cat_results``, ...). TorchRL's ``weight_sync_schemes`` name
    the weight transport (:mod:`rpc_collectors.core.torchrl_args`); ``weight_updater``,
    ``weight_recv_schemes``, ``visible_devices`` and ``tensorpipe_options`` are accepted as None
    only, as for ``RPCCollector``.
    """

    # TorchRL stacks its nodes' batches
    _default_cat_results: str | int = "stack"

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Any = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        max_frames_per_traj: int | None = -1,
        init_random_frames: int | None = -1,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool = False,
        exploration_type: Any = InteractionType.RANDOM,
        collector_class: Any = Collector,
        collector_kwargs: dict | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        update_interval: int | None = None,
        launcher: str = "submitit",
        tcp_port: int | str | None = None,
        weight_updater: Any = None,
        weight_sync_schemes: Any = None,
        weight_recv_schemes: Any = None,
        num_collectors: int | None = None,
        cat_results: str | int | None = None,
        rpc_timeout: float = 60.0,
        track_policy_version: bool = False,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_at_each_batch: bool = False,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        inference: str = "worker",
        replay_buffer: Any = None,
        metrics: Any = None,
        create_env_kwargs: dict | list | None = None,
        init_fn: Any = None,
        set_truncated: bool = False,
        reset_when_done: bool = True,
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
        preemptive_threshold: float | None = None,
        extend_buffer: bool = True,
        trust_policy: bool | None = None,
        cudagraph_policy: bool | dict | None = None,
        visible_devices: Any = None,
        tensorpipe_options: dict | None = None,
    ) -> None:
        arguments = dict(locals(), **_cadence(update_interval, update_after_each_batch,
                                              max_weight_update_interval))
        self._start(create_env_fn, policy, options_of(_node_collectors(arguments)))

    # opens over the pool the launcher picks
    _start = MultiCollector._start


class DistributedSyncCollector(CollectorFront):
    """TorchRL's ``DistributedSyncCollector``: :class:`DistributedCollector` with sync rounds
    (``[N, (B,) T]`` batches) and the weights pushed before every ``update_interval``-th round
    (default 1: every round; None: only by ``update_policy_weights_`` or
    ``max_weight_update_interval``); ``create_env_fn``, ``policy``, ``weight_updater``,
    ``weight_recv_schemes``, ``visible_devices``, ``tensorpipe_options`` and every other option
    are as for :class:`DistributedCollector`, but ``sync``."""

    # as DistributedCollector's
    _default_cat_results: str | int = "stack"

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Any = None,
        frames_per_batch: int,
        total_frames: int = -1,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        max_frames_per_traj: int | None = -1,
        init_random_frames: int | None = -1,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        split_trajs: bool = False,
        exploration_type: Any = InteractionType.RANDOM,
        collector_class: Any = Collector,
        collector_kwargs: dict | None = None,
        num_workers_per_collector: int = 1,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        max_weight_update_interval: int = -1,
        update_interval: int | None = 1,
        launcher: str = "submitit",
        tcp_port: int | str | None = None,
        num_collectors: int | None = None,
        cat_results: str | int | None = None,
        rpc_timeout: float = 60.0,
        track_policy_version: bool = False,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        update_at_each_batch: bool = False,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        inference: str = "worker",
        replay_buffer: Any = None,
        metrics: Any = None,
        create_env_kwargs: dict | list | None = None,
        init_fn: Any = None,
        set_truncated: bool = False,
        reset_when_done: bool = True,
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
        preemptive_threshold: float | None = None,
        extend_buffer: bool = True,
        trust_policy: bool | None = None,
        cudagraph_policy: bool | dict | None = None,
        weight_sync_schemes: dict | None = None,
        weight_updater: Any = None,
        weight_recv_schemes: dict | None = None,
        visible_devices: Any = None,
        tensorpipe_options: dict | None = None,
    ) -> None:
        arguments = dict(locals(), sync=True, **_cadence(update_interval, update_after_each_batch,
                                                         max_weight_update_interval))
        self._start(create_env_fn, policy, options_of(_node_collectors(arguments)))

    _start = MultiCollector._start
