"""How a public collector opens over the pool its launcher picks (local processes, torchrun/SLURM
ranks, elastic members, jobs it submits, or in-process debug workers), from its option groups.

Each class over those pools (``RPCCollector``, the ``Multi*`` classes, ``DistributedCollector``)
converts its arguments into :class:`~rpc_collectors.core.options.Options` and calls :func:`start`.
"""
from __future__ import annotations

import functools
from typing import Any

from rpc_collectors.collectors import construction
from rpc_collectors.core import checks, options, torchrl_args
from rpc_collectors.pools.debug import DebugPool
from rpc_collectors.pools.local import LocalPool
from rpc_collectors.pools.ranks.elastic_pool import ElasticPool
from rpc_collectors.pools.ranks.static import RankPool
from rpc_collectors.pools.ranks.submitit import SubmititPool
from rpc_collectors.trainer.collector_front import CollectorFront
from rpc_collectors.trainer.settings import Settings


def _pool(s: Settings, on_death: Any, on_arrival: Any) -> Any:
    """The worker pool of a collector with settings ``s``."""
    if s.launcher == "debug":
        return DebugPool(s.num_workers)
    if s.launcher == "submitit":  # jobs this process submits, which join it
        return SubmititPool(s.executor, s.num_workers, s.rpc_timeout, s.join_timeout, s.tcp_port, s.elastic, on_arrival)
    if s.elastic:  # collectors are admitted as they join, while collecting
        return ElasticPool(s.rdv, s.num_workers, s.rpc_timeout, on_arrival)
    if s.rdv is not None:
        return RankPool(s.rdv, s.num_workers, s.rpc_timeout)
    return LocalPool(s.num_workers, s.rpc_timeout, on_death, s.tcp_port, nodes=s.node is not None)


def start(front: CollectorFront, create_env_fn: Any, policy: Any, o: options.Options, node_collector: type) -> None:
    """Check the options of ``front`` that read several groups, the launcher or the env, and start its
    workers; ``node_collector`` is the class each node runs (``collector_class="sync"``/``"async"``)."""
    batches, run, weights, launch, collect = o.batches, o.run, o.weights, o.launch, o.collect
    CollectorFront.__init__(front, batches, one_per_worker=True)
    front._closed = front._closing = True  # until the workers are up
    front.max_policy_lag = construction.check_max_policy_lag(run.max_policy_lag, run.sync)
    checks.split_needs_ids(front.split_trajs or front.whole_trajectories, collect.track_traj_ids)
    checks.use_buffers(collect.use_buffers, front.replay_buffer)
    front.preemptive_threshold = checks.preemptive_threshold(
        run.preemptive_threshold, run.sync, launch.elastic, front.split_trajs or front.whole_trajectories,
    )
    weight_transport = torchrl_args.weight_sync_schemes(weights.weight_sync_schemes, weights.weight_transport)
    front._no_push = weight_transport == torchrl_args.NO_PUSH  # TorchRL's NoWeightSyncScheme
    front._schemes_given, front._use_buffers = weights.weight_sync_schemes, collect.use_buffers
    front._hooks = {"pre_collect_hook": collect.pre_collect_hook, "post_collect_hook": collect.post_collect_hook}
    resolved, rdv = construction.rendezvous(launch.launcher, launch.elastic, launch.join_timeout, launch.rpc_timeout)
    checked = construction.check(
        o, launcher=resolved, rdv=rdv, create_env_fn=create_env_fn, policy=policy,
        frames_per_batch=front.requested_frames_per_batch, default_cat_results=front._default_cat_results,
        weight_transport="auto" if front._no_push else weight_transport,
        preemptive_threshold=None if front.preemptive_threshold == 1.0 else front.preemptive_threshold,
        node_collector=node_collector,
    )
    front._open(checked, policy, functools.partial(_pool, checked))
