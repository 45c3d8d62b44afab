"""Worker pools: how a multi-worker collector's workers exist.

A pool starts its workers when it is built, and then answers a small surface that the
collector front (:mod:`rpc_collectors.trainer.collector_front`) drives, whatever the workers are:

* :meth:`WorkerPool.create` builds worker i's collector from its pickled
  :class:`~rpc_collectors.core.protocol.WorkerSpec`; :meth:`WorkerPool.call` carries one of the
  calls of :class:`~rpc_collectors.core.protocol.WorkerCalls` to it (``collect``, ``set_seed``,
  ``receive_weights`` ..., made through :attr:`WorkerPool.calls`). Both return a
  ``torch.futures.Future``; the front waits on it, bounded by ``rpc_timeout``.
* :meth:`WorkerPool.failure` tells what a failed call means (it raised, went away, timed out),
  and a pool reports a death it sees by itself through ``on_death(worker_id, reason)``.
* :meth:`WorkerPool.replace` puts a fresh process in a failed worker's place (pools whose
  ``replaceable`` is True), :meth:`WorkerPool.kill` ends a hung one, :meth:`WorkerPool.close`
  stops them all within a bounded time; :meth:`WorkerPool.stepped` reads what a worker stepped,
  where the pool can without a call.

The pools: :class:`~.local.LocalPool` (processes on this host, driven over pipes),
:class:`~.ranks.RankPool` (the other ranks of a torchrun/SLURM world, over RPC),
:class:`~.elastic.ElasticPool` (collector processes that join and leave a running trainer),
:class:`~.debug.DebugPool` (collectors inside the trainer's process) and :class:`~.ray.RayPool`
(Ray actors on the nodes of a Ray cluster; needs the ``ray`` extra).
"""
from __future__ import annotations

import re
from typing import Any, Callable

import torch

from rpc_collectors.core.errors import WorkerError
from rpc_collectors.core.protocol import WorkerCalls

OnDeath = Callable[[int, str], None]


class WorkerPool:
    """The surface every pool implements; see the module docstring."""

    num_workers: int
    # replace() works: the pool starts its workers itself
    replaceable = False
    # the workers share the trainer's process (and its memory)
    in_process = False
    # workers on other hosts can join a weight process group ("broadcast")
    process_groups = True
    # a torchrun/SLURM rendezvous: where other hosts reach the trainer
    rdv: Any = None

    def create(self, worker_id: int, spec: bytes,
               traj_id_start: int | None = None) -> torch.futures.Future:
        raise NotImplementedError

    def call(self, worker_id: int, method: str, *args: Any) -> torch.futures.Future:
        raise NotImplementedError

    @property
    def calls(self) -> WorkerCalls[torch.futures.Future]:
        """The workers' calls (:mod:`~rpc_collectors.core.protocol`), each sent at once: a
        future of its answer."""
        return WorkerCalls(self.call)

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        """``(reason, remote traceback)`` of a failed call; the traceback is
        empty unless it raised."""
        raise NotImplementedError

    def replace(self, worker_id: int) -> int | None:
        """Put a fresh process in failed ``worker_id``'s place; returns the frames the old one
        stepped (None: not known here)."""
        raise RuntimeError("only a collector's own local or debug workers can be replaced")

    def stepped(self, worker_id: int) -> int | None:
        """Frames the process serving ``worker_id`` stepped so far, where the pool reads them
        without a call (:mod:`~rpc_collectors.single_process.step_count`); None: it cannot."""
        return None

    def kill(self, worker_id: int) -> None:
        """End a failed worker at once, where the pool can (a remote one is
        left to :meth:`close`)."""

    def identity(self, worker_id: int) -> dict:
        """What is known of ``worker_id`` before it answered (rank, host, address, pid)."""
        return {}

    def error(self, worker_id: int, reason: str, remote: str = "") -> WorkerError:
        return WorkerError.from_info(worker_id, self.identity(worker_id), reason, remote)

    def join_advice(self) -> str:
        """Elastic pools: how the user gives the trainer collectors, when none joined in time."""
        return ""

    def weight_rendezvous(self) -> Any:
        """Where the weight process group meets (``weight_transport="broadcast"``)."""
        return self.rdv

    def close(self, timeout: float = 2.0) -> None:
        raise NotImplementedError


def traceback_failure(err: BaseException) -> tuple[str, str] | None:
    """``("raised an error", traceback)`` when ``err`` carries a worker's traceback; a node
    that lost a local worker (:class:`~rpc_collectors.core.errors.LocalWorkerError`) says which."""
    text = str(err)
    if "Traceback" not in text:
        return None
    local = _LOCAL_WORKER.search(text)
    return (local.group(1) if local else "raised an error"), text


_LOCAL_WORKER = re.compile(r"LocalWorkerError: (lost its local worker [^\n]*)")
