"""TorchRL's ``DistributedCollector`` and ``DistributedSyncCollector``.

TorchRL runs these over ``torch.distributed`` point-to-point sends; here each is the
collector front over the same pools as :class:`~rpc_collectors.RPCCollector` (the launcher
picks them: ``"submitit"``, TorchRL's default, submits one SLURM job per collector; ``"mp"``
starts local processes), with TorchRL's signatures, defaults and stacked sync layout.
"""
from __future__ import annotations

from typing import Any

from tensordict.nn import InteractionType

from rpc_collectors.collectors import rpc
from rpc_collectors.collectors.multi import MultiCollector
from rpc_collectors.core import options
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.trainer.collector_front import CollectorFront


def _cadence(update_interval: int | None, update_after_each_batch: bool, max_weight_update_interval: int) -> dict:
    """TorchRL's ``update_interval`` (push the weights every k batches) in this front's terms:
    k=1 is ``update_after_each_batch``, k>1 ``max_weight_update_interval=k-1``."""
    if update_interval is None:
        return {"update_after_each_batch": update_after_each_batch, "max_weight_update_interval": max_weight_update_interval}
    if isinstance(update_interval, bool) or not isinstance(update_interval, int) or update_interval < 1:
        raise ValueError(f"update_interval={update_interval!r} is invalid; accepted: None or an int >= 1")
    if update_after_each_batch or max_weight_update_interval != -1:
        raise ValueError(
            f"update_interval={update_interval!r} conflicts with update_after_each_batch={update_after_each_batch!r}, "
            f"max_weight_update_interval={max_weight_update_interval!r}; accepted: one way to set the weight cadence"
        )
    if update_interval == 1:
        return {"update_after_each_batch": True, "max_weight_update_interval": -1}
    return {"update_after_each_batch": False, "max_weight_update_interval": update_interval - 1}


def _given(
    create_env_fn: Any, policy: Any, *, update_interval: int | None, update_after_each_batch: bool = False,
    max_weight_update_interval: int, collector_class: Any, num_workers_per_collector: int, **kwargs: Any,
) -> options.Options:
    """The option groups of a distributed collector's arguments (TorchRL's, and ``RPCCollector``'s keywords)."""
    return rpc.given(
        create_env_fn, policy, **_cadence(update_interval, update_after_each_batch, max_weight_update_interval),
        **_node_collectors(collector_class, num_workers_per_collector), **kwargs,
    )


def _node_collectors(collector_class: Any, num_workers_per_collector: int) -> dict:
    """``collector_class``/``num_workers_per_collector`` for ``RPCCollector``, when not TorchRL's defaults."""
    if collector_class in (Collector, "single") and num_workers_per_collector == 1:
        return {}
    return {"collector_class": collector_class, "num_workers_per_collector": num_workers_per_collector}


class DistributedCollector(CollectorFront):
    """TorchRL's ``DistributedCollector``: N collectors on SLURM jobs (``launcher="submitit"``) or
    local processes (``"mp"``); sync batches stacked ``[N, (B,) T]``, async ones one worker's.

    TorchRL's arguments keep their meaning and defaults (``sync=False``, ``launcher="submitit"``,
    ``update_interval``: push the weights every k batches); ``create_env_fn`` is a list with one
    env factory per collector, or one factory with ``num_collectors``. Every other keyword of
    :class:`~rpc_collectors.RPCCollector` is accepted (``elastic``, ``rpc_timeout``, ``cat_results``, ...).
    TorchRL's ``weight_sync_schemes`` name the weight transport (:mod:`rpc_collectors.core.torchrl_args`);
    ``weight_updater`` and ``weight_recv_schemes`` are accepted as None only, as for ``RPCCollector``.
    """

    _default_cat_results: str | int = "stack"  # TorchRL stacks its nodes' batches

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
        **kwargs: Any,
    ) -> None:
        self._start(create_env_fn, policy, _given(
            create_env_fn, policy, policy_factory=policy_factory, frames_per_batch=frames_per_batch,
            total_frames=total_frames, device=device,
            storing_device=storing_device, env_device=env_device, policy_device=policy_device,
            max_frames_per_traj=max_frames_per_traj, init_random_frames=init_random_frames,
            reset_at_each_iter=reset_at_each_iter, postproc=postproc, split_trajs=split_trajs,
            exploration_type=exploration_type, collector_kwargs=collector_kwargs, sync=sync,
            slurm_kwargs=slurm_kwargs, backend=backend, launcher=launcher, tcp_port=tcp_port,
            weight_updater=weight_updater, weight_sync_schemes=weight_sync_schemes, weight_recv_schemes=weight_recv_schemes,
            update_interval=update_interval, update_after_each_batch=update_after_each_batch,
            max_weight_update_interval=max_weight_update_interval, collector_class=collector_class,
            num_workers_per_collector=num_workers_per_collector, **kwargs,
        ))

    _start = MultiCollector._start  # opens over the pool the launcher picks


class DistributedSyncCollector(CollectorFront):
    """TorchRL's ``DistributedSyncCollector``: :class:`DistributedCollector` with sync rounds
    (``[N, (B,) T]`` batches) and the weights pushed before every ``update_interval``-th round
    (default 1: every round; None: only by ``update_policy_weights_`` or ``max_weight_update_interval``)."""

    _default_cat_results: str | int = "stack"  # as DistributedCollector's

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
        **kwargs: Any,
    ) -> None:
        if "sync" in kwargs:
            raise TypeError(f"sync={kwargs['sync']!r}: DistributedSyncCollector always collects in sync rounds; "
                            "accepted: no sync argument (DistributedCollector takes sync=False)")
        self._start(create_env_fn, policy, _given(
            create_env_fn, policy, policy_factory=policy_factory, frames_per_batch=frames_per_batch,
            total_frames=total_frames, device=device, storing_device=storing_device, env_device=env_device,
            policy_device=policy_device, max_frames_per_traj=max_frames_per_traj,
            init_random_frames=init_random_frames, reset_at_each_iter=reset_at_each_iter, postproc=postproc,
            split_trajs=split_trajs, exploration_type=exploration_type, collector_class=collector_class,
            collector_kwargs=collector_kwargs, num_workers_per_collector=num_workers_per_collector, sync=True,
            slurm_kwargs=slurm_kwargs, backend=backend, max_weight_update_interval=max_weight_update_interval,
            update_interval=update_interval, launcher=launcher, tcp_port=tcp_port, **kwargs,
        ))

    _start = MultiCollector._start
