"""A worker joining its batch slots, trainer side: a new doorbell for it (pipes on this host, a TCP
connection from another host), the worker asked to map (or make) its slots of a buffer (a
:class:`~rpc_collectors.transport.data.SlotPool`) and to open its ends, and the doorbell of each
worker that joined (:class:`Joins`). Only set-up runs here: a batch's request rings a doorbell
that :mod:`~rpc_collectors.transport.data` finds in :attr:`Joins.bells`.
"""
from __future__ import annotations

from typing import Any, Callable

from rpc_collectors.transport.doorbell import Doorbell
from rpc_collectors.transport.socket_doorbell import SocketDoorbell


class Joins:
    """The doorbells of the workers that joined their slots, by worker id (``bells``).

    ``join(i, spec)`` asks worker i to map (or make) its slots and open its doorbell; whether it
    could. A worker on another host connects to ``address`` (the trainer's interface) within
    ``connect_timeout`` s."""

    def __init__(self, join: Callable[[int, Any], bool], address: str | None,
                 connect_timeout: float) -> None:
        self._join, self._address, self._connect_timeout = join, address, connect_timeout
        self.bells: dict[int, Doorbell] = {}

    def join_one(self, worker_id: int, pool: Any, row: int) -> bool:
        """Ask ``worker_id`` to take its slots (row ``row``) in ``pool`` (a ``SlotPool``) and open
        a new doorbell; whether it could."""
        if pool.shared:
            bell = Doorbell()
        else:
            bell = SocketDoorbell(self._address, pool.memory, self._connect_timeout)
        try:
            joined = self._join(worker_id, pool.spec(row, bell.ends))
            if joined:
                bell.opened()
        except BaseException as err:
            bell.close()
            # the worker's connection never came
            if isinstance(err, OSError):
                return False
            raise
        if not joined:
            bell.close()
            return False
        self.drop(worker_id)
        self.bells[worker_id] = bell
        return True

    def join_all(self, pool: Any, worker_ids: list[int]) -> bool:
        """Worker ``worker_ids[r]`` joins row r of ``pool``, for each r; whether all did. Where one
        did not (or raised), none of them keeps a doorbell."""
        # until every worker answered
        joined = [False]
        try:
            joined = [self.join_one(i, pool, row) for row, i in enumerate(worker_ids)]
        finally:
            if not all(joined):
                for i in worker_ids:
                    self.drop(i)
        return all(joined)

    def drop(self, worker_id: int) -> None:
        """Close and forget ``worker_id``'s doorbell, if it has one."""
        bell = self.bells.pop(worker_id, None)
        if bell is not None:
            bell.close()

    def close(self) -> None:
        """Close every doorbell."""
        for bell in self.bells.values():
            bell.close()
        self.bells.clear()
