"""What a multi-worker collector's front and its pool run with: :class:`Settings`, every value
checked (by :func:`rpc_collectors.collectors.construction.check`, where the public classes are built)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rpc_collectors.core.protocol import NodeSpec
from rpc_collectors.transport.rendezvous import Rendezvous


@dataclass
class Settings:
    """What the collector front and its pool run with (every value checked)."""

    launcher: str
    rdv: Rendezvous | None  # torchrun/SLURM: this process is rank 0 of it
    elastic: bool
    join_timeout: float
    num_workers: int
    sync: bool
    cat_results: str | int
    num_threads: int | None
    backend: str
    rpc_timeout: float
    update_after_each_batch: bool
    max_weight_update_interval: int
    weight_transport: str
    max_worker_restarts: int
    frames_per_batch: int  # of the collector: in sync mode a multiple of the workers
    frames_per_batch_worker: list[int]  # of each worker's batch, one per worker
    exploration_type: Any
    policy_device: torch.device | list | None  # a list: one per worker
    storing_device: torch.device | None
    specs: list[bytes]  # what each worker builds its collector from
    tcp_port: int | None = None  # local: the weight store's port; submitit: the trainer's rendezvous port
    executor: Any = None  # submitit: submits the collector jobs
    node: NodeSpec | None = None  # node collectors: what each worker runs (collector_class, num_workers_per_collector)
    preemptive_threshold: float | None = None  # checked by checks.preemptive_threshold
    track_policy_version: bool = False  # batches keep ("collector", "policy_version") and TorchRL's keys
    policy_factory: bool = False  # the workers build their policies: the weight plane waits for pushed weights
