"""What a collector server asks of the collector it serves: :class:`ServedCollector`.

A plain worker serves a :class:`~rpc_collectors.worker.single.SingleCollector` (the single-process
``Collector``), a node a :class:`~rpc_collectors.worker.node.NodeCollector` (W local workers);
each answers every member in its own way, so the server
(:class:`~rpc_collectors.worker.server.WorkerState`) never asks which one it holds.

A :class:`typing.Protocol` rather than an ABC: the interface is met by members alone, so an
implementation needs neither this module nor a base of it (the single-process ``Collector``, a
layer below, has a metaclass of its own); ``runtime_checkable``, so a test holds both to it.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from tensordict import TensorDictBase

from rpc_collectors.core.metrics import WorkerPhases
from rpc_collectors.core.protocol import ProcessSpans
from rpc_collectors.single_process.phase_clock import PhaseClock
from rpc_collectors.worker.node_credits import Credits


@runtime_checkable
class ServedCollector(Protocol):
    """The members a worker's server uses of its collector."""

    policy_version: int
    """The version of the weights its policy holds; a weight receiver sets it as it applies them."""
    worker_idx: int | None
    """TorchRL's: which of the trainer's workers this is."""
    env: Any
    """The env it steps (an ``AsyncBatchedCollector``'s env worker's); a node's: None, its
    local workers step theirs."""
    weights_lock: AbstractContextManager
    """Held while pushed weights land in its policy."""
    credits: Credits | None
    """An async node's under the trainer's admission: the requests it holds
    (:mod:`~rpc_collectors.worker.node_credits`); None: each request is its own."""

    @property
    def phase_clock(self) -> PhaseClock:
        """The phase clock the server marks around its batches
        (:mod:`~rpc_collectors.single_process.phase_clock`)."""
        ...

    def worker_info(self) -> dict:
        """Its part of the server's :class:`~rpc_collectors.core.protocol.WorkerInfo`: ``envs`` (a
        node's also ``local_pids`` and ``inference``)."""
        ...

    def weights_signature(self) -> tuple | None:
        """What its policy holds
        (:func:`~rpc_collectors.transport.factory_weights.signature_of`); None: it takes any."""
        ...

    def weights_holder(self, signature: tuple) -> Any:
        """Where pushed weights laid out as ``signature`` land; None: it has
        no weights to update."""
        ...

    def write_into(self, tensors: dict) -> None:
        """The next batches' steps go straight into ``tensors`` (a shared-memory
        slot's; empty: their own)."""
        ...

    def next(self) -> TensorDictBase:
        """Its next batch."""
        ...

    def returned(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` as an answer that returns it carries it."""
        ...

    def noted(self, answer: Any) -> Any:
        """The answer to ``collect`` (``Ready`` or the batch returned) with what the
        trainer is told alongside."""
        ...

    def phases(self) -> tuple[WorkerPhases, ...]:
        """Its frames, batches and phases: one ``WorkerPhases`` per process."""
        ...

    def trace(self, keep: int | None) -> list[ProcessSpans] | None:
        """Open a trace window keeping at most ``keep`` spans per thread, or close
        it (None): its spans."""
        ...

    def set_seed(self, seed: int) -> int:
        """Seed its envs; the next seed."""
        ...

    def state_dict(self, skipped: int = 0) -> dict:
        """Its state; ``skipped``: the trajectory counts its ids start above its first
        ids (a replacement's)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Resume from what :meth:`state_dict` gave."""
        ...

    def cut(self, batch: int | None = None) -> None:
        """The trainer dropped its ``batch``-th batch: the trajectories in progress in it end."""
        ...

    def interrupt(self) -> None:
        """Its process is closing: the batch in progress ends at its next step."""
        ...

    def shutdown(self) -> None:
        """Release its envs and processes."""
        ...
