"""What a multi-worker collector runs with: its :class:`Plan`.

A plan holds the option groups as the table checked them
(:class:`~rpc_collectors.core.options.Options`) and what
:func:`rpc_collectors.collectors.construction.plan` resolved from them: the launcher and its
rendezvous, the workers, each worker's batch size and spec. It is the one way into a collector
front; the front and its parts read options here, never from copies. The properties read the
groups; a batch's path (:mod:`.schedule`) reads the groups themselves.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rpc_collectors.core.options import Options
from rpc_collectors.core.protocol import NodeSpec
from rpc_collectors.transport.rendezvous import Rendezvous


@dataclass(frozen=True)
class Plan:
    """The option groups of a collector front (``options``) and what was resolved from them.

    ``rdv``: under torchrun/SLURM, the rendezvous this process is rank 0 of. ``frames_per_batch``:
    the collector's (sync: a multiple of the workers); ``frames_per_batch_worker``: each worker's.
    ``weight_transport``: as ``weight_sync_schemes`` names it; ``no_push``: TorchRL's
    ``NoWeightSyncScheme``. ``preemptive_threshold``: as checked (1.0: every worker finishes);
    ``preempt_after``: a sync round stops the other workers once this many handed in (None: it
    waits for all). ``update_after_each_batch``: that option or TorchRL's ``update_at_each_batch``.
    ``exploration_type`` and ``track_policy_version``: the workers' (``collector_kwargs`` may set
    them). ``policy_device``: a list holds one per worker. ``specs``: what each worker builds its
    collector from (a hook set later replaces entries). ``tcp_port``: local, the weight store's
    port; submitit, the trainer's rendezvous port. ``executor``: submitit's, which submits the
    collector jobs. ``node``: node collectors, what each worker runs. ``policy_factory``: the
    workers build their policies, so the weight plane waits for pushed weights.
    """

    options: Options
    launcher: str
    rdv: Rendezvous | None
    num_workers: int
    cat_results: str | int
    frames_per_batch: int
    frames_per_batch_worker: list[int]
    weight_transport: str
    no_push: bool
    max_worker_restarts: int
    preemptive_threshold: float | None
    preempt_after: int | None
    update_after_each_batch: bool
    exploration_type: Any
    track_policy_version: bool
    policy_device: torch.device | list | None
    storing_device: torch.device | None
    specs: list[bytes]
    tcp_port: int | None = None
    executor: Any = None
    node: NodeSpec | None = None
    policy_factory: bool = False

    @property
    def sync(self) -> bool:
        return self.options.run.sync

    @property
    def max_policy_lag(self) -> int | None:
        return self.options.run.max_policy_lag

    @property
    def num_threads(self) -> int | None:
        return self.options.run.num_threads

    @property
    def elastic(self) -> bool:
        return self.options.launch.elastic

    @property
    def join_timeout(self) -> float:
        return self.options.launch.join_timeout

    @property
    def rpc_timeout(self) -> float:
        return self.options.launch.rpc_timeout

    @property
    def backend(self) -> str:
        return self.options.weights.backend

    @property
    def max_weight_update_interval(self) -> int:
        return self.options.weights.max_weight_update_interval
