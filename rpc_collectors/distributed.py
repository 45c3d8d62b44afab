"""TorchRL's ``torchrl.collectors.distributed`` module path: ``DistributedCollector``,
``DistributedSyncCollector``, ``RPCCollector`` and ``RayCollector`` (imported on first use: it
needs the ``ray`` extra)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rpc_collectors.collectors.distributed_collector import (
    DistributedCollector,
    DistributedSyncCollector,
)
from rpc_collectors.collectors.ray_extra import ray_collector
from rpc_collectors.collectors.rpc import RPCCollector

if TYPE_CHECKING:
    from rpc_collectors.collectors.ray import RayCollector

__all__ = ["DistributedCollector", "DistributedSyncCollector", "RPCCollector", "RayCollector"]


def __getattr__(name: str) -> Any:
    if name == "RayCollector":
        return ray_collector()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
