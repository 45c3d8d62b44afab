"""Who serves each collector slot, and how servers enter and leave a running RPC group.

Elastic collectors run a *dynamic* RPC group (``init_rpc`` with ``world_size=None``): the
trainer starts it, and each server joins it, then announces itself with :func:`arrive`.
Joins take turns (:func:`membership_lock`), and a joiner sees only the trainer as a member
(:func:`clear_for_join`), so servers that died or became unreachable never hold a join up; the
trainer forgets them (:func:`evict`).

:class:`Restarts` is the trainer's budget of replacements and the count per worker.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Callable, Iterator

import numpy as np
import torch.distributed as dist
import torch.distributed.rpc as rpc

_evicted: set[int] = set()  # ranks this trainer removed from its group
_listener: Callable[[int], None] | None = None  # the elastic trainer's: gets every arrival


class WorkerRestartWarning(RuntimeWarning):
    """A collector worker failed and is being replaced (``max_worker_restarts``)."""


class WorkerLeftWarning(RuntimeWarning):
    """A collector of an elastic trainer left (died, became unreachable or raised); its slot is vacant."""


def arrive(rank: int) -> None:
    """RPC (served by the trainer): the server of ``rank`` joined the group and is ready."""
    listener = _listener
    if listener is not None:  # None: the trainer is closing, and stops every member it knows
        listener(rank)


def listen(callback: Callable[[int], None] | None) -> None:
    """Hand every arrival to ``callback(rank)`` (the elastic trainer's pool); None: no longer. A new
    callback starts a new group, whose ranks count from 1 again: the ranks evicted before are forgotten."""
    global _listener
    _listener = callback
    if callback is not None:
        _evicted.clear()


# Private torch details: TensorPipe's dynamic group lists its members in the store key
# "names/_ALL_WORKER_INFOS" ("name-rank," entries; agent_utils.cpp) under the prefix
# "rpc_prefix_<generation>" that init_rpc gives its store; a joiner calls every member listed
# there, under the token "RpcGroupManagementToken" (rpc/_utils.py), which a failed join never
# releases. _update_group_membership updates an agent's member map (what a graceful leave calls).
_MEMBERS_KEY = "_ALL_WORKER_INFOS"
_TOKEN_KEY = "RpcGroupManagementToken"


def clear_for_join(store: dist.Store, generation: int, trainer: str) -> None:
    """Before this server joins (holding :func:`membership_lock`): list only the trainer as a member.

    Servers only talk to the trainer, so a joiner needs no other member, and one that died or
    became unreachable (and is still listed) would fail the join and leave torch's token held.
    """
    rpc_store = dist.PrefixStore(f"rpc_prefix_{generation}", store)
    names = dist.PrefixStore("names", rpc_store)
    listed = names.get(_MEMBERS_KEY).decode() if names.check([_MEMBERS_KEY]) else ""
    names.set(_MEMBERS_KEY, "".join(f"{entry}," for entry in listed.split(",") if entry.startswith(f"{trainer}-")))
    rpc_store.set(_TOKEN_KEY, "")


def evict(name: str) -> None:
    """Remove the dead server ``name`` from this trainer's map of its dynamic RPC group.

    Joiners no longer see it (:func:`clear_for_join`); the trainer forgets it here, as a
    graceful leave would have told it to.
    """
    agent = rpc.api._get_current_rpc_agent()
    try:
        info = agent.get_worker_info(name)
    except RuntimeError:  # never joined, or already evicted
        return
    _evicted.add(info.id)
    agent._update_group_membership(info, [], {}, False)


def is_member(rank: int) -> bool:
    """Whether the server of ``rank`` still belongs to this trainer's group (it was not evicted)."""
    return rank not in _evicted


_LOCK_KEY = "rpc_collectors/membership_lock"
_LOCK_POLL = 0.005  # seconds between tries


@contextlib.contextmanager
def membership_lock(store: dist.Store, owner: str, timeout: float) -> Iterator[None]:
    """Hold the group's membership lock (in the rendezvous ``store``) for at most ``timeout`` s.

    torch's join reads, extends and writes the member list without a lock of its own, so
    concurrent joins can lose an entry. The lock is a lease: a holder that died is overtaken
    once ``timeout`` passed.
    """
    deadline = time.monotonic() + timeout
    while True:
        mine = f"{owner}@{time.time() + timeout}"
        held = store.compare_set(_LOCK_KEY, "", mine).decode()
        if held != mine and held and float(held.rpartition("@")[2]) < time.time():  # an expired lease
            held = store.compare_set(_LOCK_KEY, held, mine).decode()
        if held == mine:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the RPC group's membership lock stayed held by {held} for {timeout} s")
        time.sleep(_LOCK_POLL)
    try:
        yield
    finally:
        store.compare_set(_LOCK_KEY, mine, "")


class Restarts:
    """The run's budget of worker replacements (``budget`` in total, over all workers) and what a
    replacement must continue from.

    :meth:`take` spends one, warning with the worker, the reason and what is left, or says the
    budget is spent; ``counts[i]`` is how often worker i was replaced. A replacement gets
    trajectory ids above any its predecessors could have used (:meth:`traj_id_start`) and a
    seed from its worker's seed sequence (:meth:`seed`).
    """

    def __init__(self, budget: int, num_workers: int) -> None:
        self.budget, self.num_workers = budget, num_workers
        self.counts = [0] * num_workers
        self.name = "collector worker {}"  # how a warning names worker i (a node's local collector: its node too)
        self.taken: list[tuple[int, str]] = []  # (worker id, reason) of every replacement, in order
        self.seeds: list[int | None] = [None] * num_workers  # the seed each worker was last given
        self._ids = [0] * num_workers  # bound on the id counts worker i's incarnations may have used
        self.resumes = 0  # how many times the run was resumed from a saved state

    @property
    def left(self) -> int:
        return self.budget - sum(self.counts)

    def take(self, worker_id: int, reason: str) -> bool:
        if self.left <= 0:
            return False
        self.counts[worker_id] += 1
        self.taken.append((worker_id, reason))
        warnings.warn(
            f"{self.name.format(worker_id)} {reason}; replacing it ({self.left} of "
            f"max_worker_restarts={self.budget} restarts left)",
            WorkerRestartWarning, stacklevel=5,
        )
        return True

    def vacated(self, worker_id: int) -> None:
        """The collector serving ``worker_id`` left an elastic trainer (no budget: a newcomer takes the slot)."""
        self.counts[worker_id] += 1

    def bounds(self) -> list[int]:
        """What :meth:`traj_id_start` continues from, to save with the trainer's state."""
        return list(self._ids)

    def restore(self, bounds: list[int]) -> None:
        self._ids = [int(b) for b in bounds]

    def started(self, worker_id: int, envs: int) -> None:
        """Worker ``worker_id`` started its envs: one new trajectory each."""
        self._ids[worker_id] += envs

    def asked(self, worker_id: int, frames: int, envs: int) -> None:
        """Worker ``worker_id`` was asked for ``frames``: each may end a trajectory, each env may reset."""
        self._ids[worker_id] += frames + envs

    def loaded(self, worker_id: int, traj_count: int) -> None:
        """Worker ``worker_id`` resumed from a state that had started ``traj_count`` trajectories."""
        self._ids[worker_id] += traj_count

    def traj_id_start(self, worker_id: int) -> int:
        """First trajectory id of a replacement of ``worker_id``: ids ``start + k * num_workers``
        never meet those of its predecessors (same residue, higher counts)."""
        return worker_id + self.num_workers * self._ids[worker_id]

    def seed(self, worker_id: int) -> int | None:
        """The seed of ``worker_id``'s current replacement (or, after a resume, of the resumed worker),
        drawn from its seed's sequence."""
        seed = self.seeds[worker_id]
        if seed is None:
            return None
        key = (self.counts[worker_id],) if not self.resumes else (self.counts[worker_id], self.resumes)
        return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1)[0])
