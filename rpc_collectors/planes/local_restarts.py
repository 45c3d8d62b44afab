"""A node's local restarts on their way to the trainer, with the node's next batch answer.

A node collector (:mod:`~rpc_collectors.worker.node`) replaces its own local workers
(``max_worker_restarts``). Each replacement travels to the trainer as a :class:`LocalRestart`
with the node's next answer: in :class:`~rpc_collectors.planes.doorbell.Ready` (a batch in its
slot), or around a batch returned directly (:class:`Noted`). :func:`unnote` takes them off again.
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
class Noted:
    """A batch returned directly (not in a slot), with the node's restarts since its last answer."""

    batch: Any
    restarts: tuple[LocalRestart, ...]


def note(result: Any, restarts: tuple[LocalRestart, ...]) -> Any:
    """``result`` (``Ready`` or a batch) carrying ``restarts``; as it is without any."""
    if not restarts:
        return result
    if isinstance(result, Ready):
        return dataclasses.replace(result, restarts=restarts)
    return Noted(result, restarts)


def unnote(result: Any) -> tuple[Any, tuple[LocalRestart, ...]]:
    """The answer as the data plane takes it, and the restarts it carried."""
    if isinstance(result, Noted):
        return result.batch, result.restarts
    if isinstance(result, Ready) and result.restarts:
        return Ready(result.slot), result.restarts
    return result, ()
