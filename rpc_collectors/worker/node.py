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

Nested waits, nested deadlines: the trainer waits ``rpc_timeout`` for a node, and a node waits
``NODE_WAIT_SHARE`` of it (half) for each of its local workers. A local worker that hangs is
given up by the node first, replaced (``max_worker_restarts``) or reported as the node's
failure, with the other half of the trainer's wait left for the replacement's batch.

With ``inference="node"`` the node holds the only policy: its local workers send each step's
observations to it (:mod:`rpc_collectors.worker.node_inference`), and the trainer's weights land
in it, to be used by the next forward pass.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import replace
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from rpc_collectors.core import checks
from rpc_collectors.core.errors import LocalWorkerError, WorkerError
from rpc_collectors.core.metrics import WorkerPhases
from rpc_collectors.core.protocol import Dropped, LocalRestart, NodeSpec, ProcessSpans
from rpc_collectors.single_process.batch_record import VERSION, workers_in
from rpc_collectors.single_process.phase_clock import PhaseClock, StoppedClock
from rpc_collectors.single_process.policies import StepPolicy
from rpc_collectors.single_process.trajectories import TRAJ_IDS
from rpc_collectors.transport import local_restarts
from rpc_collectors.transport.weights import holder_of, signature_of
from rpc_collectors.worker.node_credits import Credits
from rpc_collectors.worker.node_inference import NodeInference

# collector_class: TorchRL's strings and class names -> the node's local collector
# (None: a single Collector)
# of the trainer's rpc_timeout: how long a node waits on one of its local workers
NODE_WAIT_SHARE = 0.5
# how many of its last batches a node remembers the local workers of (the
# trainer asks at most 2 ahead)
KEEP_HANDED = 4


def check_inference(inference: Any, node_kind: str | None, collector_class: Any, policy: Any,
                    factories: list) -> str:
    """``inference`` (its value checked by the options table) against the rest: ``"node"`` needs
    node collectors and a policy with ``in_keys`` (a ``TensorDictModule`` or an ``nn.Module``)
    given as ``policy``."""
    if inference == "worker":
        return inference
    if node_kind is None:
        raise ValueError("inference='node' needs node collectors; "
                         f"collector_class={collector_class!r} runs none; accepted: "
                         "collector_class='sync' or 'async' (with num_workers_per_collector), or "
                         "inference='worker'")
    if any(factory is not None for factory in factories):
        raise ValueError("inference='node' takes the policy itself; accepted: policy=<module>, "
                         "policy_factory=None")
    if policy is None or StepPolicy(policy).td_module is None:
        raise ValueError(f"inference='node': policy={policy!r} has no in_keys to send to the node; "
                         "accepted: a TensorDictModule or an nn.Module (reading 'observation')")
    return inference


class NodeCollector:
    """A node's collector: W local workers behind the one server the trainer calls.

    Built by :class:`~rpc_collectors.worker.server.WorkerState` from a spec with a
    :class:`NodeSpec`; it meets :class:`~rpc_collectors.worker.served_collector.ServedCollector`.
    ``traj_id_start`` and ``traj_id_stride`` are the node's trajectory ids as the trainer gives them
    to any worker (``start + k * stride``, with ``stride`` the trainer's number of nodes);
    ``node_id``: the trainer's worker id of this node, which its warnings name.
    """

    # a node is never an env worker: its local workers step the envs
    env = None

    def __init__(
        self, create_env_fn: Any, policy: Any, node: NodeSpec, traj_id_start: int,
        traj_id_stride: int, node_id: int = 0, **kwargs: Any,
    ) -> None:
        self.node, self.node_id = node, node_id
        # TorchRL's attribute: which worker this is
        self.worker_idx = node_id
        # where the trainer's weights land: the policy, or (policy_factory) a
        # TensorDict laid out as they are
        module = policy if isinstance(policy, nn.Module) else None
        self.module: nn.Module | TensorDictBase | None = module
        # local worker w's ids x = w + W * c become traj_id_start * W + w + traj_id_stride * W * c
        width = node.num_workers
        self._base, self._stride = traj_id_start * width, traj_id_stride * width
        # of the weights in this node's policy
        self._version = 0
        self.inference: NodeInference | None = None
        if node.inference == "node":
            policy = self._serve_policy(policy, kwargs)
        try:
            self.local = node.collector(
                [create_env_fn] * node.num_workers, policy, sync=node.sync, launcher=node.launcher,
                total_frames=-1, cat_results="stack",
                rpc_timeout=node.rpc_timeout * NODE_WAIT_SHARE,
                max_worker_restarts=node.max_worker_restarts, **kwargs,
            )
        except Exception:
            if self.inference is not None:
                self.inference.close()
                # the node's policy raised on the local workers' first step
                if self.inference.error is not None:
                    raise self.inference.error from None
            raise
        # passed on to the trainer, which reads and removes it, and counts the progress
        self.local.keep_version_key, self.local.counts_progress = True, False
        # under the trainer's admission: a local batch per request, none ahead (node_credits)
        self.credits = Credits(width) if node.credits else None
        self.local.schedule.on_demand = self.credits is not None
        self.local.roster.name = f"node {node_id}'s local worker {{}}"
        # of the local collector's restarts, how many the trainer was told of
        self._told = 0
        # of the local collector's drops, what the trainer was told of
        self._dropped_told = Dropped()
        # answers may leave side by side (RPC): each drop is told once
        self._telling = threading.Lock()
        # held by a batch in progress: a cut waits for its end
        self._busy = threading.Lock()
        # the local workers in each of the last batches handed out, by number
        self._handed: dict[int, list[int]] = {}
        # batches handed out
        self._count = 0

    def _serve_policy(self, policy: Any, kwargs: dict) -> Any:
        """Run ``policy`` here, on the policy device (else a GPU if there is one), for every local
        worker; returns what the local workers call instead."""
        device = kwargs.pop("policy_device", None)
        device = torch.device(device if device is not None else "cuda" if torch.cuda.is_available()
                              else "cpu")
        if isinstance(policy, nn.Module):
            # in place: the trainer's weights land where it runs
            policy.to(device)
        self.inference = NodeInference(
            policy, device, kwargs.get("exploration_type"), lambda: self._version,
            checks.compile_kwargs(kwargs.pop("compile_policy", None)),
        )
        return self.inference.stub(self.node.rpc_timeout * NODE_WAIT_SHARE)

    @property
    def weights_lock(self) -> Any:
        """Held while weights land in the node's policy (none: the local workers have their own)."""
        return self.inference.lock if self.inference is not None else contextlib.nullcontext()

    @property
    def phase_clock(self) -> PhaseClock:
        """A clock that counts nothing: its local workers keep their phases on their own clocks."""
        return StoppedClock()

    @property
    def pids(self) -> list[int | None]:
        """The local workers' pids."""
        return [info["pid"] for info in self.local.infos]

    def worker_info(self) -> dict:
        """Its local workers' envs and pids, and its inference mode."""
        envs = sum(info["envs"] for info in self.local.infos)
        return {"envs": envs, "local_pids": self.pids, "inference": self.node.inference}

    def new_restarts(self) -> tuple[LocalRestart, ...]:
        """The local workers replaced since the last call, for the trainer (with
        the node's next answer)."""
        taken = self.local.roster.taken[self._told:]
        self._told += len(taken)
        return tuple(LocalRestart(worker, reason, self.pids[worker]) for worker, reason in taken)

    def new_drops(self) -> Dropped:
        """The frames and batches the node dropped since the last call, for the trainer's
        ``dropped_frames`` (with the node's next answer)."""
        with self._telling:
            told, now = self._dropped_told, Dropped(self.local.dropped_frames,
                                                    self.local.dropped_batches)
            self._dropped_told = now
        return Dropped(now.frames - told.frames, now.batches - told.batches)

    @property
    def policy_version(self) -> int:
        return self._version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        """New weights are in this node's policy (the weight receiver put them there): the local
        workers get them through shared memory before their next batch."""
        self._version = version

    def weights_signature(self) -> tuple | None:
        """What the node's policy holds; None: it takes any (its local workers
        build their policies)."""
        return signature_of(self.module) if self.module is not None else None

    def weights_holder(self, signature: tuple) -> nn.Module | TensorDictBase | None:
        """Where the trainer's weights land: the node's policy or, where its local workers build
        theirs (policy_factory), empty tensors laid out as ``signature``, held from now on and
        passed on from there."""
        if self.module is None and signature:
            self.module = holder_of(signature)
        return self.module

    def _pass_weights_on(self) -> None:
        behind = self._version > self.local.pushed_version
        if self.inference is None and self.module is not None and behind:
            given = self.module if isinstance(self.module, TensorDictBase) else None
            self.local.push_version(self._version, given)

    def cut(self, batch: int | None = None) -> None:
        """The trainer dropped this node's ``batch``-th batch: the streams of the local
        workers in it are cut (:mod:`~rpc_collectors.trainer.continuity`; every local worker's
        if it is no longer known)."""
        with self._busy:
            self.local.continuity.cut(self._handed.get(batch))

    def write_into(self, tensors: dict) -> None:
        """Nothing: its local workers write into slots of their own, and its server
        copies the node's batch."""

    def next(self) -> TensorDictBase:
        """The node's next batch, with trajectory ids in the trainer's numbering.

        A sync node's local round starts after the node passed its newest weights on, so every
        frame of it has them. An async node's local workers collect ahead, as flat async workers
        do. Under an async trainer a batch may hold the weights its worker had before the last
        push (each frame's version says which), and the trainer's ``max_policy_lag`` decides;
        under its admission each local batch is asked for one request of the trainer, after that
        request's weights (:mod:`~rpc_collectors.worker.node_credits`). Under a sync trainer a
        round holds only the newest weights (``NodeSpec.fresh``): the node drops the local batches
        begun before them, which cuts those workers' streams
        (:mod:`~rpc_collectors.trainer.continuity`)."""
        with self._busy:
            return self._next()

    def _next(self) -> TensorDictBase:
        self._pass_weights_on()
        try:
            if self.credits is not None:
                batch = self.credits.next(self.local)
            else:
                newest = self._version if self.inference is not None else self.local.pushed_version
                batch = self.local.next()
                while self.node.fresh and batch.get(VERSION).min() < newest:
                    self.local.continuity.drop(batch)
                    batch = self.local.next()
        except WorkerError as err:
            # the trainer's WorkerError names this node and, from this, the local worker
            if self.inference is not None and self.inference.error is not None:
                # the node's policy raised: its own traceback
                raise self.inference.error from None
            detail = f"\n{err.remote_traceback}" if err.remote_traceback else ""
            raise LocalWorkerError(
                f"lost its local worker {err.worker_id} (pid {err.pid}), which {err.reason}{detail}"
            ) from None
        self._count += 1
        self._handed[self._count] = workers_in(batch)
        self._handed.pop(self._count - KEEP_HANDED, None)
        ids = batch.get(TRAJ_IDS)
        width = self.node.num_workers
        batch.set_(TRAJ_IDS,
                   self._base + ids % width + self._stride * torch.div(
                       ids, width, rounding_mode="floor"))
        return batch

    def returned(self, batch: TensorDictBase) -> TensorDictBase:
        """A copy of ``batch``: its tensors view the local workers' shared slots, which an
        answer would carry whole."""
        return batch.clone()

    def noted(self, answer: Any) -> Any:
        """``answer`` with the local restarts and drops since the last
        (:mod:`~rpc_collectors.transport.local_restarts`)."""
        return local_restarts.attach(answer, self.new_restarts(), self.new_drops())

    def phases(self) -> tuple[WorkerPhases, ...]:
        """Its local workers' frames, batches and phases, by the flat run's worker ids
        (``node_id * W + w``)."""
        first = self.node_id * self.node.num_workers
        # the steps of the local processes it replaced count too (the trainer sees no restart)
        ended = self.local.ledger.ended_by
        return tuple(replace(p, worker_id=first + p.worker_id,
                             stepped=p.stepped + ended[p.worker_id])
                     for p in self.local.worker_phases())

    def trace(self, keep: int | None) -> list[ProcessSpans] | None:
        """Open its local collector's trace window (its waits, its local workers' spans on its
        clock), keeping at most ``keep`` spans per thread, or close it (None): its spans."""
        window = self.local.tracing
        return window.open(keep) if keep is not None else window.take()

    def set_seed(self, seed: int) -> int:
        return self.local.set_seed(seed)

    def state_dict(self, skipped: int = 0) -> dict:
        """The local collector's state; ``traj_count`` bounds the local workers' trajectory counts.

        ``skipped``: the counts this node's ids start above the node's first ids (a replacement's,
        see ``traj_id_start``); they are added to every count, so a node resumed from its first
        ids continues above every id this one used."""
        self._pass_weights_on()
        local = self.local.state_dict()
        for worker in local["workers"]:
            worker["traj_count"] += skipped
        return {"local": local, "traj_count": skipped + max(self.local.roster.bounds()),
                "version": self._version}

    def load_state_dict(self, state: dict) -> None:
        self.local.load_state_dict(state["local"])
        # with inference="node" the version is the node's own (its local workers hold no weights)
        self._version = state.get("version",
                                  0) if self.inference is not None else self.local.pushed_version

    def interrupt(self) -> None:
        """The process is closing: the node shuts down, which ends its local workers' batches."""
        self.shutdown()

    def shutdown(self) -> None:
        self.local.shutdown()
        if self.inference is not None:
            self.inference.close()
