"""What the trainer hears of the local workers its node collectors replaced, and of their drops.

A node replaces its own local workers (``max_worker_restarts``) and tells the trainer with its
next batch answer (:mod:`~rpc_collectors.transport.local_restarts`), as it tells the frames it
dropped itself (which the trainer counts in ``dropped_frames``, :mod:`.continuity`): the trainer
warns, counts them for the node (``worker_restarts``; not in the trajectory-id bounds of
:class:`~rpc_collectors.trainer.roster.Roster`, which only the trainer's own replacements move)
and lists the replacement's pid in the node's ``info["local_pids"]``.
"""
from __future__ import annotations

import warnings
from typing import Any

from rpc_collectors.core.protocol import Dropped
from rpc_collectors.trainer.roster import WorkerRecord
from rpc_collectors.transport.local_restarts import detach
from rpc_collectors.transport.membership import WorkerRestartWarning


def answer_of(record: WorkerRecord, node: int, result: Any) -> tuple[Any, Dropped]:
    """The answer of ``node`` (``record``) as the data plane takes it, and the node's drops it
    carried; the restarts it carried are told."""
    result, restarts, dropped = detach(result)
    for restart in restarts:
        record.local_restarts += 1
        info = record.info
        if info is not None and "local_pids" in info:
            pids = list(info["local_pids"])
            pids[restart.worker] = restart.pid
            info["local_pids"] = pids
        warnings.warn(
            f"node {node}'s local worker {restart.worker} {restart.reason}; node {node} "
            f"replaced it (pid {restart.pid}; {record.local_restarts} of its local workers "
            "replaced so far)",
            WorkerRestartWarning, stacklevel=5,
        )
    return result, dropped
