"""A node's local restarts and drops on their way to the trainer, with the node's next batch answer.

A node collector (:mod:`~rpc_collectors.worker.node`) replaces its own local workers
(``max_worker_restarts``) and drops its own stale local batches. Each replacement travels to the
trainer as a :class:`LocalRestart`, and the frames and batches dropped as :class:`Dropped`, with
the node's next answer: in :class:`~rpc_collectors.planes.doorbell.Ready` (a batch in its slot),
or around a batch returned directly (:class:`Noted`). :func:`unnote` takes them off again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rpc_collectors.planes.doorbell import Ready


@dataclass(frozen=True)
class LocalRestart:
    """The node replaced its local worker ``worker``, which ``reason``; the replacement's ``pid``."""

    worker: int
    reason: str
    pid: int | None


@dataclass(frozen=True)
class Dropped:
    """The frames and batches of its local workers a node dropped itself since its last answer."""

    frames: int = 0
    batches: int = 0


@dataclass(frozen=True)
class Noted:
    """A batch returned directly (not in a slot), with the node's restarts and drops since its last answer."""

    batch: Any
    restarts: tuple[LocalRestart, ...]
    dropped: Dropped = Dropped()


def note(result: Any, restarts: tuple[LocalRestart, ...], dropped: Dropped = Dropped()) -> Any:
    """``result`` (``Ready`` or a batch) carrying ``restarts`` and ``dropped``; as it is without any."""
    if not restarts and dropped == Dropped():
        return result
    if isinstance(result, Ready):
        return dataclasses.replace(result, restarts=restarts, dropped=dropped)
    return Noted(result, restarts, dropped)


def unnote(result: Any) -> tuple[Any, tuple[LocalRestart, ...], Dropped]:
    """The answer as the data plane takes it, and the restarts and drops it carried."""
    if isinstance(result, Noted):
        return result.batch, result.restarts, result.dropped
    if isinstance(result, Ready) and result.noted:
        return Ready(result.slot), result.restarts, result.dropped or Dropped()
    return result, (), Dropped()
