"""Reinforcement-learning experience collectors for HPC clusters.

A trainer process owns a collector; the collector steps environments with a copy of the
policy, in this process, in local worker processes or on other nodes over
``torch.distributed.rpc``, and yields batches as TensorDicts in TorchRL's layout.
"""
from .async_collector import AsyncCollector
from .base import BaseCollector
from .collector import Collector
from .distributed import DistributedCollector, DistributedSyncCollector
from .envs import GymEnv
from .errors import WorkerError
from .membership import WorkerLeftWarning, WorkerRestartWarning
from .policies import RandomPolicy
from .rpc_collector import MultiAsyncCollector, MultiCollector, MultiSyncCollector, RPCCollector
from .trajectories import split_trajectories

# TorchRL's legacy names
SyncDataCollector = Collector
DataCollectorBase = BaseCollector
MultiSyncDataCollector = MultiSyncCollector
MultiaSyncDataCollector = MultiAsyncCollector


def __getattr__(name: str):
    """``RayCollector`` is imported on first use: it needs the optional ``ray`` extra."""
    if name == "RayCollector":
        try:
            from .ray_collector import RayCollector
        except ModuleNotFoundError as err:
            if err.name != "ray":
                raise
            raise ImportError('RayCollector needs Ray: pip install "rpc_collectors[ray]"') from err
        return RayCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
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
    "RayCollector",
    "SyncDataCollector",
    "WorkerError",
    "WorkerLeftWarning",
    "WorkerRestartWarning",
    "split_trajectories",
]
