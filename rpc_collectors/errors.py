"""The one exception a collector raises when a worker fails."""
from __future__ import annotations


class WorkerError(RuntimeError):
    """A collector worker died, became unreachable or raised.

    Attributes: ``worker_id`` (0-based), ``rank``, ``host``, ``pid``, ``reason`` and ``remote_traceback``
    (the worker's traceback text, when it raised).
    """

    def __init__(self, worker_id: int, rank: int, host: str, pid: int | None, reason: str, remote_traceback: str = "") -> None:
        self.worker_id, self.rank, self.host, self.pid = worker_id, rank, host, pid
        self.reason = reason
        self.remote_traceback = remote_traceback
        where = f"collector worker {worker_id} (rank {rank} on host {host}" + (f", pid {pid})" if pid else ")")
        message = f"{where} {reason}"
        if remote_traceback:
            message += f"\n--- remote traceback ---\n{remote_traceback}"
        super().__init__(message)

    @classmethod
    def from_info(cls, worker_id: int, info: dict, reason: str, remote_traceback: str = "") -> "WorkerError":
        """From what the worker reported of itself (``host``, ``address``, ``pid``), or what is known of it."""
        host = info.get("host", "?") + (f" ({info['address']})" if info.get("address") else "")
        return cls(worker_id, info.get("rank", worker_id + 1), host, info.get("pid"), reason, remote_traceback)
