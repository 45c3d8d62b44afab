"""The multi-process collectors of TorchRL's names: ``MultiCollector``, ``MultiSyncCollector`` and
``MultiAsyncCollector``, each the collector front over N local worker processes (as in TorchRL,
``MultiSyncCollector`` and ``MultiAsyncCollector`` derive from ``MultiCollector``).

Each spells out every option it takes (TorchRL's signature, for editors and ``inspect.signature``)
and converts them into the option groups of :mod:`rpc_collectors.core.options`.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from tensordict.nn import InteractionType

import rpc_collectors.collectors.opening as opening
from rpc_collectors.core import checks, options, torchrl_args
from rpc_collectors.trainer.collector_front import CollectorFront

LAUNCHERS = ("local", "mp", "debug")


def local_options(create_env_fn: Any, num_workers: Any,
                  arguments: Mapping[str, Any]) -> options.Options:
    """The options of a local multi-process collector: TorchRL's ``num_workers`` is
    ``num_collectors``."""
    torchrl_args.not_here(weight_recv_schemes=arguments["weight_recv_schemes"])
    launcher = arguments["launcher"]
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher={launcher!r} is invalid for MultiCollector; accepted: 'local', "
                         "'mp' or 'debug'")
    if num_workers is None:
        return options.Options.given(arguments)
    num_workers = checks.positive_int("num_workers", num_workers)
    listed = isinstance(create_env_fn, (list, tuple))
    given = len(create_env_fn) if listed else arguments["num_collectors"]
    if given is not None and given != num_workers:
        raise ValueError(
            f"num_workers={num_workers} does not match the {given} workers of "
            "create_env_fn/num_collectors; "
            "accepted: the same number, or one env factory and num_workers"
        )
    return options.Options.given({**arguments, "num_collectors": num_workers})


class _SyncChoosesClass(type):
    """``MultiCollector(..., sync=True|False)`` is a ``MultiSyncCollector`` or
    ``MultiAsyncCollector``, as in TorchRL."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        sync = kwargs.get("sync")
        if cls is MultiCollector and isinstance(sync, bool):
            kwargs.pop("sync")
            return (MultiSyncCollector if sync else MultiAsyncCollector)(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        """What ``help()``, editors and ``inspect.signature`` show: the class's ``__init__`` (not
        ``__call__``)."""
        init = inspect.signature(cls.__init__)
        return init.replace(parameters=list(init.parameters.values())[1:])


class MultiCollector(CollectorFront, metaclass=_SyncChoosesClass):
    """N worker processes on this host (``RPCCollector`` with ``launcher="local"``).

    ``create_env_fn`` is a list with one env factory per worker, or one env factory for
    ``num_workers`` workers (TorchRL's argument; ``num_collectors`` too); ``sync`` chooses between
    round-based batches of all workers and first-ready batches of one (given, it makes the
    collector a ``MultiSyncCollector`` or ``MultiAsyncCollector``, as TorchRL's does). Sync
    batches are stacked ``[N, (B,) T]`` by default, as TorchRL's ``MultiSyncCollector``.
    ``launcher`` is ``"local"``, TorchRL's ``"mp"`` or ``"debug"``; ``weight_updater`` is TorchRL's
    legacy ``WeightUpdaterBase``, which ``update_policy_weights_`` then calls and which pushes
    through ``pipes`` (:mod:`rpc_collectors.trainer.legacy_updater`); ``policy`` and every other
    argument (``weight_recv_schemes`` too) are as for :class:`~rpc_collectors.RPCCollector`.
    """

    _default_cat_results: str | int = "stack"

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int | list[int],
        total_frames: int = -1,
        num_collectors: int | None = None,
        sync: bool = True,
        cat_results: str | int | None = None,
        launcher: str = "local",
        tcp_port: int | str | None = None,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        rpc_timeout: float = 60.0,
        collector_kwargs: dict | None = None,
        exploration_type: Any = InteractionType.RANDOM,
        track_policy_version: bool = False,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        update_at_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        collector_class: Any = "single",
        num_workers_per_collector: int = 1,
        inference: str = "worker",
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool | None = None,
        postproc: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        replay_buffer: Any = None,
        metrics: Any = None,
        create_env_kwargs: dict | list | None = None,
        policy_factory: Any = None,
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
    ) -> None:
        self._start(create_env_fn, policy, local_options(create_env_fn, num_workers, locals()))

    def _start(self, create_env_fn: Any, policy: Any, o: options.Options) -> None:
        """Open over the pool the launcher picks (:func:`.opening.start`; ``RPCCollector`` and
        the distributed classes open the same way); node collectors (``collector_class``) run
        ``MultiCollector``."""
        opening.start(self, create_env_fn, policy, o, MultiCollector)


class MultiSyncCollector(MultiCollector):
    """``MultiCollector`` with ``sync=True`` (TorchRL's name); ``create_env_fn``, ``policy``,
    ``num_workers``, ``weight_updater``, ``weight_recv_schemes`` and every other argument as
    there."""

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int | list[int],
        total_frames: int = -1,
        num_collectors: int | None = None,
        cat_results: str | int | None = None,
        launcher: str = "local",
        tcp_port: int | str | None = None,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        rpc_timeout: float = 60.0,
        collector_kwargs: dict | None = None,
        exploration_type: Any = InteractionType.RANDOM,
        track_policy_version: bool = False,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        update_at_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        collector_class: Any = "single",
        num_workers_per_collector: int = 1,
        inference: str = "worker",
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool | None = None,
        postproc: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        replay_buffer: Any = None,
        metrics: Any = None,
        create_env_kwargs: dict | list | None = None,
        policy_factory: Any = None,
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
    ) -> None:
        self._start(create_env_fn, policy,
                    local_options(create_env_fn, num_workers, dict(locals(), sync=True)))


class MultiAsyncCollector(MultiCollector):
    """``MultiCollector`` with ``sync=False`` (TorchRL's name); ``create_env_fn``, ``policy``,
    ``num_workers``, ``weight_updater``, ``weight_recv_schemes`` and every other argument as
    there."""

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        num_workers: int | None = None,
        frames_per_batch: int | list[int],
        total_frames: int = -1,
        num_collectors: int | None = None,
        cat_results: str | int | None = None,
        launcher: str = "local",
        tcp_port: int | str | None = None,
        slurm_kwargs: dict | None = None,
        backend: str = "gloo",
        rpc_timeout: float = 60.0,
        collector_kwargs: dict | None = None,
        exploration_type: Any = InteractionType.RANDOM,
        track_policy_version: bool = False,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        update_at_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        weight_transport: str = "auto",
        collector_class: Any = "single",
        num_workers_per_collector: int = 1,
        inference: str = "worker",
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool | None = None,
        postproc: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        replay_buffer: Any = None,
        metrics: Any = None,
        create_env_kwargs: dict | list | None = None,
        policy_factory: Any = None,
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
    ) -> None:
        self._start(create_env_fn, policy,
                    local_options(create_env_fn, num_workers, dict(locals(), sync=False)))
