"""``RayCollector``: the collector front over Ray actors (:mod:`rpc_collectors.pools.ray_actors`),
with TorchRL's ``RayCollector`` arguments. Needs the ``ray`` extra
(``pip install "rpc_collectors[ray]"``)."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Awaitable, Iterator

from tensordict.nn import InteractionType

import rpc_collectors.collectors.construction as construction
from rpc_collectors.collectors.multi import MultiCollector
from rpc_collectors.core import checks, options
from rpc_collectors.pools import ray_actors as ray_pool
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.trainer.collector_front import CollectorFront
from rpc_collectors.trainer.plan import Plan

# TorchRL's names of the single-process collector
SINGLE_COLLECTORS = ("Collector", "SyncDataCollector")


class RayCollector(CollectorFront):
    """Collects with ``num_collectors`` Ray actors, each running a single-process
    :class:`Collector`.

    Args are TorchRL's ``RayCollector``'s, with this library's collector semantics:

        create_env_fn: an env factory (with ``num_collectors``) or a list of them, one per actor.
        policy_factory: builds the policy inside each actor instead of ``policy`` (a callable, or
            a list of one per actor); ``update_policy_weights_(weights)`` pushes to them.
        policy, frames_per_batch, total_frames (-1: endless), max_frames_per_traj,
            init_random_frames, reset_at_each_iter, postproc, split_trajs, exploration_type,
            replay_buffer, replay_write_mode, track_policy_version: as for
            :class:`~rpc_collectors.RPCCollector`.
        device, storing_device, env_device, policy_device: one device, or a list with one per
            collector (``storing_device``: one device; batches are stored on the trainer).
        collector_class: what each actor runs: ``"single"`` or the single-process ``Collector``
            (the default), or a node of ``num_workers_per_collector`` local worker processes:
            ``"sync"``/``MultiSyncCollector`` (each request answered with ``[W, (B,) T]``) or
            ``"async"``/``MultiAsyncCollector`` (one local worker's batch), as for
            :class:`~rpc_collectors.RPCCollector`. The local workers are child processes of the
            actor (reserve their CPUs with ``remote_configs={"num_cpus": W}``).
        collector_kwargs: a dict for every actor's ``Collector``, or a list of dicts, one per
            actor; never modified.
        num_workers_per_collector: W, the local workers of each node actor (1 with ``"single"``).
        sync: True: each batch stacks one batch per actor, ``[N, frames_per_batch / N]``;
            False (default): each batch is one actor's ``[frames_per_batch]``, first ready first
            served.
        ray_init_config: None attaches to the Ray of this process, or one Ray can find
            (``RAY_ADDRESS``, the newest on this machine), else starts a local instance; a dict
            with ``address`` attaches there; one without starts a local instance with it.
            Ray is stopped at :meth:`shutdown` only if this collector started it.
        remote_configs: Ray actor options (``num_cpus``, ``num_gpus``, ``memory``, ``resources``
            ...), one dict for all or a list with one per actor; default 1 CPU and 2 GiB.
        num_collectors: the number of actors when ``create_env_fn`` is not a list.
        update_after_each_batch, max_weight_update_interval: the weight-update cadence.
        max_worker_restarts: actors replaced after a failure (with a ``WorkerRestartWarning``)
            before a ``WorkerError``; Ray itself never restarts them.
        rpc_timeout: seconds any single wait on an actor may take; also the most an actor may
            stay pending for resources at start-up.
        shared_memory: actors on the trainer's node exchange batches and weights with it through
            shared memory (default); False sends them through Ray's object store, as for actors
            on other nodes.
        num_threads: torch threads of the trainer while local actors run (as RPCCollector).
        trust_policy: as for :class:`Collector`, in every actor.
        weight_sync_schemes: TorchRL's ``{"policy": scheme}``, mapped onto the actors' weight
            transport (:mod:`rpc_collectors.core.torchrl_args`): ``RayWeightSyncScheme`` and
            ``MultiProcessWeightSyncScheme`` one ``ray.put`` per version,
            ``SharedMemWeightSyncScheme`` the trainer's policy memory, shared (actors on the
            trainer's node; :mod:`rpc_collectors.transport.weight_sync`),
            ``NoWeightSyncScheme`` no pushes.
    """

    # the "rpc" transport is one ray.put (TorchRL's RayWeightSyncScheme)
    _ray_actors = True

    _default_cat_results: str | int = "stack"

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        policy_factory: Any = None,
        trust_policy: bool | None = None,
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
        collector_class: Any = "single",
        collector_kwargs: dict | list[dict] | None = None,
        num_workers_per_collector: int = 1,
        sync: bool = False,
        ray_init_config: dict | None = None,
        remote_configs: dict | list[dict] | None = None,
        num_collectors: int | None = None,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
        replay_buffer: Any = None,
        metrics: Any = None,
        replay_write_mode: str | None = None,
        track_policy_version: bool = False,
        max_worker_restarts: int = 0,
        rpc_timeout: float = 60.0,
        shared_memory: bool = True,
        num_threads: int | None = None,
        weight_sync_schemes: dict | None = None,
    ) -> None:
        super().__init__(options.Batches.given(locals()))
        # until the actors are up
        self._closed = self._closing = True
        self._ray_started = False
        shared_memory = checks.boolean("shared_memory", shared_memory)
        count = len(create_env_fn) if isinstance(create_env_fn, (list, tuple)) else num_collectors
        kwargs_each = _listed("collector_kwargs", collector_kwargs, count) or [collector_kwargs]
        configs = _remote_configs(remote_configs, count)

        # collector_kwargs: one dict, or one per collector, each planned on its own below
        named = dict(locals(), collector_kwargs=None, collector_class=_class_name(collector_class))
        given = options.Options.given(named)

        def plan(kwargs: dict | None) -> Plan:
            launch = dataclasses.replace(given.launch, collector_kwargs=kwargs)
            o = dataclasses.replace(given, launch=launch)
            return construction.plan(o, create_env_fn=create_env_fn, policy=policy,
                                     default_cat_results=self._default_cat_results,
                                     node_collector=MultiCollector, ray=True)

        # a plan takes one collector_kwargs dict: each collector's spec comes from the plan with its
        # own
        plans = [plan(kwargs) for kwargs in kwargs_each]
        s = plans[0]
        if len(plans) > 1:
            s = dataclasses.replace(s, specs=[p.specs[i] for i, p in enumerate(plans)])
        if configs is None:
            configs = [dict(ray_pool.DEFAULT_REMOTE_CONFIG) for _ in range(s.num_workers)]
        elif len(configs) != s.num_workers:
            raise ValueError(f"remote_configs has {len(configs)} entries for {s.num_workers} "
                             "collectors; accepted: one per collector")
        self._ray_started = ray_pool.connect(ray_init_config, s.rpc_timeout)
        try:
            ray_pool.check_resources(configs)
            self._open(s, policy, functools.partial(_pool, s, configs, shared_memory))
        except BaseException:
            self._stop_ray(False)
            raise

    @property
    def remote_collectors(self) -> list:
        """The Ray actor handles, one per collector (each serves one single-process
        ``Collector``)."""
        if self.workers is None:
            return []
        return [self.workers.actors[i] for i in sorted(self.workers.actors)]

    def local_policy(self) -> Any:
        """The trainer's policy, whose weights :meth:`update_policy_weights_` pushes."""
        return self.policy

    def shutdown(self, timeout: float | None = None, shutdown_ray: bool = False,
                 close_env: bool = True) -> None:
        """Close every actor's collector and envs (within ``timeout`` seconds, default 5), kill the
        actors, and stop Ray if this collector started it (or ``shutdown_ray``)."""
        if timeout is not None and self.workers is not None:
            self.workers.close_timeout = checks.timeout("timeout", timeout)
        super().shutdown(close_env)
        self._stop_ray(shutdown_ray)

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True,
                       shutdown_ray: bool = False) -> Awaitable[None]:
        """Stop background collection after the current batch, then :meth:`shutdown`
        (``shutdown_ray`` as there). Done when it returns; TorchRL's ``RayCollector.async_shutdown``
        is a coroutine, so what it returns may also be awaited
        (``await collector.async_shutdown(shutdown_ray=False)``)."""
        super().async_shutdown(timeout, close_env)
        self._stop_ray(shutdown_ray)
        return _Done()

    def _stop_ray(self, requested: bool) -> None:
        if (self._ray_started or requested) and ray_pool.ray.is_initialized():
            ray_pool.ray.shutdown()
        self._ray_started = False


class _Done:
    """An awaitable that is already done (``await`` gives None)."""

    def __await__(self) -> Iterator[None]:
        return iter(())


def _pool(s: Plan, configs: list[dict], shared_memory: bool, on_death: Any, on_arrival: Any) -> Any:
    """The actors' pool: no death is reported unasked (a dead actor fails its calls and
    doorbell)."""
    return ray_pool.RayPool(s.num_workers, s.rpc_timeout, configs, s.rpc_timeout, shared_memory)


def _class_name(value: Any) -> Any:
    """TorchRL's ``collector_class`` as :func:`~rpc_collectors.node.node_class` takes it: its
    ``Collector`` (also TorchRL's, in any module) is the single-process one."""
    if value is Collector or getattr(value, "__name__", None) in SINGLE_COLLECTORS:
        return "single"
    return value


def _listed(name: str, value: Any, count: int | None) -> list | None:
    """``value`` as one entry per collector if it is a list (of ``count`` entries), else None."""
    if not isinstance(value, (list, tuple)):
        return None
    if count is None or len(value) != count:
        raise ValueError(f"{name} has {len(value)} entries; accepted: one value, or a list with "
                         f"one per collector ({count})")
    return list(value)


def _remote_configs(value: Any, count: int | None) -> list[dict] | None:
    if value is None:
        return None
    configs = value if isinstance(value, (list, tuple)) else [value] * (count or 0)
    for i, config in enumerate(configs):
        if not isinstance(config, dict):
            raise TypeError(f"remote_configs[{i}]={config!r} is invalid; accepted: a dict of Ray "
                            "actor options")
    return [dict(config) for config in configs]
