"""A node's local restarts and drops on their way to the trainer, with the node's next batch answer.

A node collector (:mod:`~rpc_collectors.worker.node`) replaces its own local workers
(``max_worker_restarts``) and drops local batches: under a sync trainer those begun before the
newest weights, and those asked before a cut of their worker's stream
(:mod:`~rpc_collectors.trainer.continuity`). Each replacement travels to the
trainer as a :class:`~rpc_collectors.core.protocol.LocalRestart`, and the frames and batches dropped
as :class:`~rpc_collectors.core.protocol.Dropped`, with the node's next answer (:func:`attach`):
around it, whether a :class:`~rpc_collectors.core.protocol.Ready` (a batch in its slot) or a batch
returned directly (:class:`~rpc_collectors.core.protocol.Noted`).
:func:`detach` takes them off again.
"""
from __future__ import annotations

from typing import Any

from rpc_collectors.core.protocol import Dropped, LocalRestart, Noted

NONE_DROPPED = Dropped()


def attach(result: Any, restarts: tuple[LocalRestart, ...], dropped: Dropped = NONE_DROPPED) -> Any:
    """``result`` (``Ready`` or a batch) carrying ``restarts`` and ``dropped``;
    as it is without any."""
    if not restarts and dropped == NONE_DROPPED:
        return result
    return Noted(result, restarts, dropped)


def detach(result: Any) -> tuple[Any, tuple[LocalRestart, ...], Dropped]:
    """The answer as the data plane takes it, and the restarts and drops it carried."""
    if isinstance(result, Noted):
        return result.answer, result.restarts, result.dropped
    return result, (), Dropped()
