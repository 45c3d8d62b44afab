"""Reinforcement-learning experience collectors for HPC clusters.

A trainer process owns a collector; the collector steps environments with a copy of the
policy, in this process, in local worker processes or on other nodes over
``torch.distributed.rpc``, and yields batches as TensorDicts in TorchRL's layout.

The package's layers, top to bottom, grouped by the process they run in (each imports only
from the layers below it). Public API: :mod:`~rpc_collectors.apps` (PPO, the demo, the command
line) and :mod:`~rpc_collectors.collectors` (the public multi-worker classes and ``Collector``'s
dispatch). Trainer side: :mod:`~rpc_collectors.trainer` and :mod:`~rpc_collectors.pools` (what a
multi-worker collector means, and how its workers exist: independent of each other) and
:mod:`~rpc_collectors.cluster` (SLURM, collector jobs, elastic membership). Worker side:
:mod:`~rpc_collectors.worker` (what runs in a worker process). Both sides:
:mod:`~rpc_collectors.single_process` (the single-process ``Collector`` every worker runs),
:mod:`~rpc_collectors.transport` (moving weights and batches between processes, rendezvous, RPC
membership) and :mod:`~rpc_collectors.core` (options, the trainer-worker protocol, errors and
checks). ``rpc_collectors.distributed`` and ``rpc_collectors.slurm`` are public module paths onto
those layers.
"""
from rpc_collectors.cluster.run_checkpoint import RunCheckpoint
from rpc_collectors.collectors.async_batched import AsyncBatchedCollector
from rpc_collectors.collectors.async_collector import AsyncCollector
from rpc_collectors.collectors.dispatch import resolve
from rpc_collectors.collectors.distributed_collector import (
    DistributedCollector,
    DistributedSyncCollector,
)
from rpc_collectors.collectors.evaluator import Evaluator
from rpc_collectors.collectors.multi import MultiAsyncCollector, MultiCollector, MultiSyncCollector
from rpc_collectors.collectors.ray_extra import ray_collector
from rpc_collectors.collectors.rpc import RPCCollector
from rpc_collectors.core.errors import WorkerError
from rpc_collectors.core.metrics import Metrics
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.single_process.dispatching import dispatch_with
from rpc_collectors.single_process.envs import GymEnv
from rpc_collectors.single_process.metric_exports import (
    Export,
    JsonLines,
    Prometheus,
    PrometheusTextfile,
    TensorBoard,
)
from rpc_collectors.single_process.policies import RandomPolicy
from rpc_collectors.single_process.trajectories import split_trajectories
from rpc_collectors.transport.membership import WorkerLeftWarning, WorkerRestartWarning

# Collector(..., num_collectors=N, backend=...) builds the collectors above
dispatch_with(resolve)

# TorchRL's legacy names
SyncDataCollector = Collector
DataCollectorBase = BaseCollector
MultiSyncDataCollector = MultiSyncCollector
MultiaSyncDataCollector = MultiAsyncCollector


def __getattr__(name: str) -> type:
    """``RayCollector`` is imported on first use: it needs the optional ``ray`` extra."""
    if name == "RayCollector":
        return ray_collector()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncBatchedCollector",
    "AsyncCollector",
    "BaseCollector",
    "Collector",
    "DataCollectorBase",
    "DistributedCollector",
    "DistributedSyncCollector",
    "Evaluator",
    "Export",
    "GymEnv",
    "JsonLines",
    "Metrics",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "Prometheus",
    "PrometheusTextfile",
    "RPCCollector",
    "RandomPolicy",
    "RunCheckpoint",
    "RayCollector",
    "SyncDataCollector",
    "TensorBoard",
    "WorkerError",
    "WorkerLeftWarning",
    "WorkerRestartWarning",
    "split_trajectories",
]
