"""The one exception a collector raises when a worker fails, and the internal one it starts from."""
from __future__ import annotations

from rpc_collectors.core import tracebacks


class WorkerError(RuntimeError):
    """A collector worker died, became unreachable or raised.

    Attributes: ``worker_id`` (0-based), ``rank``, ``host``, ``pid``, ``reason`` and
    ``remote_traceback`` (the worker's traceback text, when it raised).
    """

    def __init__(self, worker_id: int, rank: int, host: str, pid: int | None, reason: str,
                 remote_traceback: str = "") -> None:
        self.worker_id, self.rank, self.host, self.pid = worker_id, rank, host, pid
        self.reason = reason
        self.remote_traceback = remote_traceback
        where = f"collector worker {worker_id} (rank {rank} on host {host}" + (
            f", pid {pid})" if pid else ")"
        )
        message = f"{where} {reason}"
        if remote_traceback:
            shown, shortened = tracebacks.for_user(remote_traceback)
            note = (" (without the frames in rpc_collectors: see .remote_traceback)" if shortened
                    else "")
            message += f"\n--- remote traceback{note} ---\n{shown}"
        super().__init__(message)

    @classmethod
    def from_info(cls, worker_id: int, info: dict, reason: str,
                  remote_traceback: str = "") -> "WorkerError":
        """From what the worker reported of itself (``host``, ``address``,
        ``pid``), or what is known of it."""
        host = info.get("host", "?") + (f" ({info['address']})" if info.get("address") else "")
        return cls(worker_id, info.get("rank", worker_id + 1), host, info.get("pid"), reason,
                   remote_traceback)


class LocalWorkerError(RuntimeError):
    """Raised by a node collector (:mod:`rpc_collectors.worker.node`) whose local worker failed; the
    trainer's :class:`WorkerError` for the node takes its first line as the reason."""


class Failure(Exception):
    """Internal: a worker failed. It is replaced while the restart budget lasts (or, elastic,
    leaves its slot vacant); otherwise the collector raises it as a :class:`WorkerError`."""

    def __init__(self, worker_id: int, reason: str, remote: str = "") -> None:
        super().__init__(worker_id, reason)
        self.worker_id, self.reason, self.remote = worker_id, reason, remote


def remote_summary(remote: str) -> str:
    """The exception line of a remote traceback (after its frames), for a one-line warning."""
    lines = remote.splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.startswith("Traceback (most recent call last)")]
    after = lines[starts[-1] + 1:] if starts else []
    return next((f": {line.strip()}" for line in after if line.strip() and not line[0].isspace()),
                "")
