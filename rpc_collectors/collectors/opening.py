"""How a public collector opens over the pool its launcher picks (local processes, torchrun/SLURM
ranks, elastic members, jobs it submits, or in-process debug workers), from its option groups.

Each class over those pools (``RPCCollector``, the ``Multi*`` classes, ``DistributedCollector``)
converts its arguments into :class:`~rpc_collectors.core.options.Options` and calls :func:`start`,
the one way a front is built: options, then their plan, then the front.
"""
from __future__ import annotations

import functools
from typing import Any

import rpc_collectors.collectors.construction as construction
from rpc_collectors.core import options
from rpc_collectors.pools.debug import DebugPool
from rpc_collectors.pools.local import LocalPool
from rpc_collectors.pools.ranks.elastic_pool import ElasticPool
from rpc_collectors.pools.ranks.static import RankPool
from rpc_collectors.pools.ranks.submitit import SubmititPool
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.trainer.collector_front import CollectorFront
from rpc_collectors.trainer.plan import Plan


def _pool(plan: Plan, on_death: Any, on_arrival: Any) -> Any:
    """The worker pool of a collector with ``plan``."""
    if plan.launcher == "debug":
        return DebugPool(plan.num_workers)
    if plan.launcher == "submitit":
        # jobs this process submits, which join it
        return SubmititPool(plan.executor, plan.num_workers, plan.rpc_timeout, plan.join_timeout,
                            plan.tcp_port, plan.elastic, on_arrival)
    if plan.elastic:
        # collectors are admitted as they join, while collecting
        return ElasticPool(plan.rdv, plan.num_workers, plan.rpc_timeout, on_arrival)
    if plan.rdv is not None:
        return RankPool(plan.rdv, plan.num_workers, plan.rpc_timeout)
    return LocalPool(plan.num_workers, plan.rpc_timeout, on_death, plan.tcp_port,
                     nodes=plan.node is not None)


def start(front: CollectorFront, create_env_fn: Any, policy: Any, o: options.Options,
          node_collector: type) -> None:
    """Plan ``front`` from its options (:func:`.construction.plan`) and start its workers;
    ``node_collector`` is the class each node runs (``collector_class="sync"``/``"async"``)."""
    BaseCollector.__init__(front, o.batches, one_per_worker=True)
    # closed until the workers are up
    front._closed = front._closing = True
    plan = construction.plan(o, create_env_fn=create_env_fn, policy=policy,
                             default_cat_results=front._default_cat_results,
                             node_collector=node_collector)
    front._open(plan, policy, functools.partial(_pool, plan))
