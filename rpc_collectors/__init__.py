"""Reinforcement-learning experience collectors for HPC clusters.

A trainer process owns a collector; the collector steps environments with a copy of the
policy, in this process, in local worker processes or on other nodes over
``torch.distributed.rpc``, and yields batches as TensorDicts in TorchRL's layout.

The package's layers, top to bottom (each imports only from the layers below it):
:mod:`~rpc_collectors.apps` (PPO, the demo, the command line),
:mod:`~rpc_collectors.collectors` (the public multi-worker classes and ``Collector``'s dispatch),
:mod:`~rpc_collectors.front` and :mod:`~rpc_collectors.pools` (what a multi-worker collector
means, and how its workers exist: independent of each other),
:mod:`~rpc_collectors.cluster` (SLURM, collector jobs, elastic membership),
:mod:`~rpc_collectors.worker` (what runs in a worker process),
:mod:`~rpc_collectors.collection` (single-process collection),
:mod:`~rpc_collectors.planes` (moving weights and batches, rendezvous, RPC membership) and
:mod:`~rpc_collectors.core` (errors and argument checks). ``rpc_collectors.distributed`` and
``rpc_collectors.slurm`` are public module paths onto those layers.
"""
from rpc_collectors.cluster.run_checkpoint import RunCheckpoint
from rpc_collectors.collection.base import BaseCollector
from rpc_collectors.collection.collector import Collector
from rpc_collectors.collection.dispatching import dispatch_with
from rpc_collectors.collection.envs import GymEnv
from rpc_collectors.collection.policies import RandomPolicy
from rpc_collectors.collection.trajectories import split_trajectories
from rpc_collectors.collectors.async_batched import AsyncBatchedCollector
from rpc_collectors.collectors.async_collector import AsyncCollector
from rpc_collectors.collectors.dispatch import resolve
from rpc_collectors.collectors.distributed import DistributedCollector, DistributedSyncCollector
from rpc_collectors.collectors.multi import MultiAsyncCollector, MultiCollector, MultiSyncCollector
from rpc_collectors.collectors.ray_extra import ray_collector
from rpc_collectors.collectors.rpc import RPCCollector
from rpc_collectors.core.errors import WorkerError
from rpc_collectors.planes.membership import WorkerLeftWarning, WorkerRestartWarning

dispatch_with(resolve)  # Collector(..., num_collectors=N, backend=...) builds the collectors above

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
    "GymEnv",
    "MultiAsyncCollector",
    "MultiCollector",
    "MultiSyncCollector",
    "MultiSyncDataCollector",
    "MultiaSyncDataCollector",
    "RPCCollector",
    "RandomPolicy",
    "RunCheckpoint",
    "RayCollector",
    "SyncDataCollector",
    "WorkerError",
    "WorkerLeftWarning",
    "WorkerRestartWarning",
    "split_trajectories",
]
