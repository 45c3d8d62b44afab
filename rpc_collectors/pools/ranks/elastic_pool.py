"""Collector slots of an elastic trainer (``elastic=True``): processes join and leave while it runs.

The trainer serves a fixed number of collector *slots* (worker ids). Every collector process
(one of the trainer's own torchrun/SLURM ranks, or one started later with
``RPC_COLLECTORS_JOIN`` set, see :mod:`rpc_collectors.cluster.elastic`) joins the trainer's dynamic
RPC group and announces itself (:func:`membership.arrive`); the pool hands it to the
collector's recovery (:mod:`rpc_collectors.trainer.recovery`), which gives it a vacant slot or
keeps it as a spare. A collector that dies, becomes unreachable or raises is evicted from the group
and its slot falls vacant.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Callable

from rpc_collectors.cluster.elastic import JOIN_VARIABLE, TRAINER_KEY
from rpc_collectors.pools.ranks.static import RankPool
from rpc_collectors.transport import membership
from rpc_collectors.transport.rendezvous import Rendezvous
from rpc_collectors.worker import rpc_rank


class ElasticPool(RankPool):
    """The trainer's slots, each held by whichever collector process serves it now, or vacant.

    ``on_arrival(rank)`` is called (from an RPC thread) for every collector that joins;
    :meth:`assign` gives it a slot or keeps it as a spare, :meth:`vacate` evicts the one in a
    slot. :meth:`close` stops every collector that joined, spares included.
    """

    def __init__(self, rdv: Rendezvous, num_workers: int, rpc_timeout: float,
                 on_arrival: Callable[[int], None]) -> None:
        # ranks that joined and were not evicted
        self.members: set[int] = set()
        self.spares: list[int] = []
        self._on_arrival = on_arrival
        self._members_lock = threading.Lock()
        membership.listen(self._arrived)
        try:
            super().__init__(dataclasses.replace(rdv, dynamic=True), num_workers, rpc_timeout)
            self.ranks = [None] * num_workers
            # collectors may join from here on
            self._client.set(TRAINER_KEY, str(self._generation))
        except BaseException:
            membership.listen(None)
            raise

    def _arrived(self, rank: int) -> None:
        with self._members_lock:
            self.members.add(rank)
        self._on_arrival(rank)

    def assign(self, rank: int) -> int | None:
        """Put collector ``rank`` in the first vacant slot and return it; None: no slot is
        vacant, it waits as a spare."""
        vacant = [i for i, r in enumerate(self.ranks) if r is None]
        if not vacant:
            self.spares.append(rank)
            return None
        self.ranks[vacant[0]] = rank
        return vacant[0]

    def vacate(self, worker_id: int) -> None:
        """Evict the collector serving ``worker_id`` from the group; the slot is vacant."""
        rank = self.ranks[worker_id]
        if rank is None:
            return
        membership.evict(self._name(worker_id))
        with self._members_lock:
            self.members.discard(rank)
        self.ranks[worker_id] = None

    def spare(self) -> int | None:
        """A spare collector's rank, to fill a vacant slot (None: there is none)."""
        return self.spares.pop(0) if self.spares else None

    def identity(self, worker_id: int) -> dict:
        return {"rank": self.ranks[worker_id] if self.ranks[worker_id] is not None else "(vacant)"}

    def join_advice(self) -> str:
        """How a user gives the trainer collectors (the end of its error when
        none joined in time)."""
        return ("start collectors with "
                f"{JOIN_VARIABLE}={self.rdv.master_addr}:{self.rdv.master_port} (slurm/submit.py "
                "--join JOBID)")

    def _server_names(self) -> list[str]:
        with self._members_lock:
            return [rpc_rank.worker_name(rank, self.rdv.session) for rank in sorted(self.members)]

    def close(self, timeout: float = 2.0) -> None:
        membership.listen(None)
        super().close(timeout)
