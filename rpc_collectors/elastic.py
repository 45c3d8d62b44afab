"""Elastic membership: collector processes join and leave a running trainer (``elastic=True``).

The trainer serves a fixed number of collector *slots* (worker ids). Every collector process,
whether one of the trainer's own torchrun/SLURM ranks or one started later with
``RPC_COLLECTORS_JOIN=<host>:<port>`` set (a SLURM job of ``slurm/submit.py --join JOBID``),
draws a unique rank from a counter in the trainer's rendezvous store, joins the trainer's
dynamic RPC group and announces itself (:func:`membership.arrive`). The trainer gives it a
vacant slot, or keeps it as a spare until one falls vacant. A collector that dies, becomes
unreachable or raises is evicted from the group and its slot falls vacant.

:class:`ElasticWorkers` is the trainer's handle on those slots, :class:`ElasticSlots` what the
collector does as collectors come and go; :func:`member_rendezvous` and :func:`join_rendezvous`
are the collector process's side of the rendezvous.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import threading
import time
import warnings
from typing import Callable

import torch.distributed.rpc as rpc

from . import membership, worker
from .errors import Failure, remote_summary
from .membership import WorkerLeftWarning
from .rendezvous import Rendezvous, interface_for, store_client
from .workers import RPCWorkers

JOIN_VARIABLE = "RPC_COLLECTORS_JOIN"  # <host>:<port> of a running elastic trainer's rendezvous store
TRAINER_KEY = "rpc_collectors/elastic/trainer"  # set once the trainer's agent runs: its RPC generation
RANKS_KEY = "rpc_collectors/elastic/ranks"  # counter: each collector process draws its rank from it


def join_rendezvous() -> Rendezvous | None:
    """The rendezvous of a process started to join a running trainer (``RPC_COLLECTORS_JOIN`` set), else None."""
    address = os.environ.get(JOIN_VARIABLE)
    if address is None:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{JOIN_VARIABLE}={address!r} is invalid; accepted: <host>:<port> of the trainer's rendezvous")
    return Rendezvous("join", -1, 0, host, int(port), interface_for(host), dynamic=True)


def member_rendezvous(rdv: Rendezvous, timeout: float) -> Rendezvous:
    """Wait up to ``timeout`` s for the trainer's group, then draw this collector's unique rank in it."""
    deadline = time.monotonic() + timeout
    try:
        store = store_client(rdv, timeout)
    except ConnectionError as err:
        raise _no_trainer(rdv, timeout, "nothing there answered as a rendezvous store") from err
    try:
        store.wait([TRAINER_KEY], datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
    except RuntimeError as err:
        raise _no_trainer(rdv, timeout, "a rendezvous store answered, but no elastic trainer started in it") from err
    rpc._init_counter = int(store.get(TRAINER_KEY))  # the trainer's store prefix (workers.rpc_api_generation)
    return dataclasses.replace(rdv, rank=int(store.add(RANKS_KEY, 1)), dynamic=True)


def _no_trainer(rdv: Rendezvous, timeout: float, what: str) -> TimeoutError:
    """The error of a collector that found no elastic trainer at ``rdv``'s address within ``timeout`` s."""
    address = f"{rdv.master_addr}:{rdv.master_port}"
    source = f"{JOIN_VARIABLE}={address}" if rdv.launcher == "join" else f"MASTER_ADDR:MASTER_PORT={address}"
    return TimeoutError(
        f"this collector found no elastic trainer at {source} within join_timeout={timeout:g} s: {what}. "
        f"Check that the trainer runs, with RPCCollector(..., elastic=True); that {address} is its rendezvous "
        f"address, the MASTER_ADDR:MASTER_PORT of the trainer (a SLURM trainer job writes it to "
        f"<log-dir>/<job id>_rendezvous.json), not another of its ports; and that this host can reach that "
        f"port (a firewall, the network interface)"
    )


class ElasticWorkers(RPCWorkers):
    """The trainer's slots, each held by whichever collector process serves it now, or vacant.

    ``on_arrival(rank)`` is called (from an RPC thread) for every collector that joins;
    :meth:`assign` gives it a slot or keeps it as a spare, :meth:`vacate` evicts the one
    in a slot. :meth:`close` stops every collector that joined, spares included.
    """

    def __init__(self, rdv: Rendezvous, num_workers: int, rpc_timeout: float, on_arrival: Callable[[int], None]) -> None:
        self.members: set[int] = set()  # ranks that joined and were not evicted
        self.spares: list[int] = []
        self._on_arrival = on_arrival
        self._members_lock = threading.Lock()
        membership.listen(self._arrived)
        try:
            super().__init__(dataclasses.replace(rdv, dynamic=True), num_workers, rpc_timeout, lambda *_: None)
            self.ranks: list[int | None] = [None] * num_workers  # type: ignore[assignment]
            self._client.set(TRAINER_KEY, str(self._generation))  # collectors may join from here on
        except BaseException:
            membership.listen(None)
            raise

    def _arrived(self, rank: int) -> None:
        with self._members_lock:
            self.members.add(rank)
        self._on_arrival(rank)

    def serves(self, worker_id: int) -> bool:
        return self.ranks[worker_id] is not None

    def assign(self, rank: int) -> int | None:
        """Put collector ``rank`` in the first vacant slot and return it; None: no slot is vacant, it waits as a spare."""
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

    def _server_names(self) -> list[str]:
        with self._members_lock:
            return [worker.worker_name(rank, self.rdv.session) for rank in sorted(self.members)]

    def close(self, timeout: float = 2.0) -> None:
        membership.listen(None)
        super().close(timeout)


class ElasticSlots:
    """``RPCCollector``'s side of elastic membership: collectors that join are admitted to vacant
    slots (or kept as spares) by the collecting thread, and one that fails leaves its slot vacant.

    Mixed into ``RPCCollector``; it uses the collector's requests, set-up and waits.
    """

    def _on_arrival(self, rank: int) -> None:
        """A collector joined (elastic; called from an RPC thread): the collecting thread admits it."""
        self._events.put(("joined", rank, None))

    def _admit(self, rank: int) -> None:
        """Give collector ``rank`` a vacant slot (or keep it as a spare) and set it up; one that
        fails meanwhile leaves the slot vacant again. A slot the trainer waits for is asked at once."""
        worker_id = self.workers.assign(rank)
        if worker_id is None:
            return
        self._generation[worker_id] += 1
        try:
            self._set_up(worker_id)
        except Failure as failed:
            self._leave(worker_id, f"failed while it joined: {failed.reason}{remote_summary(failed.remote)}")
            return
        if self._round is not None and worker_id not in self._round:  # a sync round waits for this slot
            self._request(worker_id, again=True)
        elif self._round is None and not self.sync:
            self._request(worker_id)

    def _leave(self, worker_id: int, reason: str) -> None:
        """The collector in ``worker_id``'s slot failed: evict it; a spare, if any, takes the slot."""
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} was shut down")
        rank = self.workers.ranks[worker_id]
        self._generation[worker_id] += 1
        del self._outstanding[worker_id]
        if self._last_async == worker_id:
            self._last_async = None
        self.workers.vacate(worker_id)
        self.infos[worker_id] = None
        self.restarts.vacated(worker_id)
        warnings.warn(
            f"collector worker {worker_id} (rank {rank}) {reason}; its slot is vacant until a collector joins "
            f"(join_timeout={self.join_timeout} s)",
            WorkerLeftWarning, stacklevel=4,
        )
        spare = self.workers.spare()
        if spare is not None:
            self._admit(spare)

    def _serving(self) -> list[int]:
        return [i for i in range(self.num_workers) if self.workers.serves(i)]

    def _no_collector(self) -> BaseException:
        vacant = [i for i in range(self.num_workers) if not self.workers.serves(i)]
        return self._fail(TimeoutError(
            f"no collector joined within join_timeout={self.join_timeout} s while the trainer waited "
            f"(vacant collector slots: {vacant}); start collectors with {JOIN_VARIABLE}="
            f"{self.workers.rdv.master_addr}:{self.workers.rdv.master_port} (slurm/submit.py --join JOBID)"
        ))

    def _load_elastic_state(self, state: dict) -> None:
        if state.get("traj_id_bounds") is None or len(state["traj_id_bounds"]) != self.num_workers:
            raise ValueError(f"the state is not that of an elastic collector with {self.num_workers} slots")
        if self._serving():
            raise RuntimeError("load_state_dict on an elastic collector must come before its first batch")
        self._load_base_state(state)
        self.policy_version = int(state["policy_version"])
        self.restarts.restore(state["traj_id_bounds"])
