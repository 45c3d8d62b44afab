"""Node collectors: each of a collector's workers runs W local worker processes of its own.

With ``collector_class`` ``"sync"``/``"async"`` (TorchRL's ``MultiSyncCollector``/
``MultiAsyncCollector``) and ``num_workers_per_collector=W``, the server that the trainer
drives on a rank (or a local or debug worker) is a node: it runs a multi-worker collector of
W local worker processes on its own host (:class:`NodeCollector`), receives the trainer's
weights once and passes them on through shared memory, and answers each of the trainer's
requests with one batch: ``[W, (B,) T]`` stacked (``"sync"``) or one local worker's batch
(``"async"``). The trainer talks to N nodes, not N x W workers.

Ids: local worker ``w`` of node ``i`` is the flat run's worker ``i * W + w``. Its trajectory
ids are the ones that worker would have (``i * W + w + k * N * W``), and seeds pass through
the nodes' local workers in that order, so a node run yields the frames of the flat run of N x W
workers with the same seed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from .batch_record import VERSION
from .errors import LocalWorkerError, WorkerError
from .trajectories import TRAJ_IDS

# collector_class: TorchRL's strings and class names -> the node's local collector (None: a single Collector)
CLASS_NAMES = {
    "single": None, "Collector": None, "SyncDataCollector": None,
    "sync": "sync", "MultiSyncCollector": "sync", "MultiSyncDataCollector": "sync",
    "async": "async", "MultiAsyncCollector": "async", "MultiaSyncDataCollector": "async",
}


@dataclass(frozen=True)
class NodeSpec:
    """What a node runs: ``num_workers`` local workers, sync or async, restarted up to ``max_worker_restarts``."""

    sync: bool
    num_workers: int
    launcher: str  # "local", or "debug" under the debug launcher: the local workers live in the node too
    max_worker_restarts: int
    rpc_timeout: float


def node_class(collector_class: Any, num_workers_per_collector: Any) -> tuple[str | None, int]:
    """``("sync" | "async" | None, W)`` of TorchRL's ``collector_class`` (a string, or one of
    the collector classes, ours or TorchRL's, by name) and ``num_workers_per_collector``."""
    accepted = ("'single', 'sync', 'async', or the classes Collector, MultiSyncCollector, MultiAsyncCollector "
                "(ours or TorchRL's; also their older names)")
    name = collector_class if isinstance(collector_class, str) else getattr(collector_class, "__name__", None)
    module = getattr(collector_class, "__module__", "") or ""
    known = isinstance(collector_class, str) or (
        isinstance(collector_class, type) and module.split(".")[0] in ("rpc_collectors", "torchrl")
    )
    if not known or name not in CLASS_NAMES:
        raise ValueError(f"collector_class={collector_class!r} is invalid; accepted: {accepted}")
    kind = CLASS_NAMES[name]
    if isinstance(num_workers_per_collector, bool) or not isinstance(num_workers_per_collector, int) \
            or num_workers_per_collector < 1:
        raise ValueError(f"num_workers_per_collector={num_workers_per_collector!r} is invalid; accepted: an int >= 1")
    if kind is None and num_workers_per_collector != 1:
        raise ValueError(
            f"num_workers_per_collector={num_workers_per_collector} needs a multi-process collector_class; "
            f"accepted with collector_class={collector_class!r}: 1 (or collector_class='sync' / 'async')"
        )
    return kind, int(num_workers_per_collector)


class NodeCollector:
    """A node's collector: W local workers behind the one server the trainer calls.

    Built by :class:`~rpc_collectors.worker.WorkerState` from a spec with a :class:`NodeSpec`;
    it offers what the server uses of a single-process ``Collector``. ``traj_id_start`` and
    ``traj_id_stride`` are the node's trajectory ids as the trainer gives them to any worker
    (``start + k * stride``, with ``stride`` the trainer's number of nodes).
    """

    def __init__(
        self, create_env_fn: Any, policy: Any, node: NodeSpec, traj_id_start: int, traj_id_stride: int,
        **kwargs: Any,
    ) -> None:
        from .rpc_collector import MultiCollector  # the node's collector is the library's own front

        self.node = node
        # where the trainer's weights land: the policy, or (policy_factory) a TensorDict laid out as they are
        self.module: nn.Module | TensorDictBase | None = policy if isinstance(policy, nn.Module) else None
        # local worker w's ids x = w + W * c become traj_id_start * W + w + traj_id_stride * W * c
        self._base, self._stride = traj_id_start * node.num_workers, traj_id_stride * node.num_workers
        self._version = 0  # of the weights in this node's policy
        self.local = MultiCollector(
            [create_env_fn] * node.num_workers, policy, sync=node.sync, launcher=node.launcher,
            total_frames=-1, cat_results="stack", rpc_timeout=node.rpc_timeout,
            max_worker_restarts=node.max_worker_restarts, **kwargs,
        )
        self.local.keep_version_key = True  # passed on to the trainer, which reads and removes it

    @property
    def num_envs(self) -> int:
        return sum(info["envs"] for info in self.local.infos)

    @property
    def pids(self) -> list[int | None]:
        """The local workers' pids."""
        return [info["pid"] for info in self.local.infos]

    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        """New weights are in this node's policy (the weight receiver put them there): the local
        workers get them through shared memory before their next batch."""
        self._version = version

    def hold_weights(self, holder: TensorDictBase) -> None:
        """The local workers build their policies (policy_factory): the trainer's weights land in
        ``holder`` and are passed on from there."""
        self.module = holder

    def _pass_weights_on(self) -> None:
        if self.module is not None and self._version > self.local.policy_version:
            given = self.module if isinstance(self.module, TensorDictBase) else None
            self.local.push_version(self._version, given)

    def next(self) -> TensorDictBase:
        """The node's next batch, with trajectory ids in the trainer's numbering.

        Every frame of it was collected with the newest weights the node has passed on: an async
        node drops the local batches its workers collected before (at most the requests in flight).
        """
        self._pass_weights_on()
        try:
            batch = self.local.next()
            while batch.get(VERSION).min() < self.local.policy_version:
                batch = self.local.next()
        except WorkerError as err:  # the trainer's WorkerError names this node and, from this, the local worker
            detail = f"\n{err.remote_traceback}" if err.remote_traceback else ""
            raise LocalWorkerError(
                f"lost its local worker {err.worker_id} (pid {err.pid}), which {err.reason}{detail}"
            ) from None
        ids = batch.get(TRAJ_IDS)
        width = self.node.num_workers
        batch.set_(TRAJ_IDS, self._base + ids % width + self._stride * torch.div(ids, width, rounding_mode="floor"))
        return batch

    def set_seed(self, seed: int) -> int:
        return self.local.set_seed(seed)

    def state_dict(self) -> dict:
        """The local collector's state; ``traj_count`` bounds the local workers' trajectory counts."""
        self._pass_weights_on()
        return {"local": self.local.state_dict(), "traj_count": max(self.local.restarts.bounds())}

    def load_state_dict(self, state: dict) -> None:
        self.local.load_state_dict(state["local"])
        self._version = self.local.policy_version

    def shutdown(self) -> None:
        self.local.shutdown()
