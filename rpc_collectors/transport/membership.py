"""How collector servers enter and leave a running RPC group (who serves each
slot: the trainer's roster).

Elastic collectors run a *dynamic* RPC group (``init_rpc`` with ``world_size=None``): the
trainer starts it, and each server joins it, then announces itself with :func:`arrive`.
Joins take turns (:func:`membership_lock`), and a joiner sees only the trainer as a member
(:func:`clear_for_join`), so servers that died or became unreachable never hold a join up; the
trainer forgets them (:func:`evict`). The warnings a collector gives when a worker is replaced or
leaves are here too (:class:`WorkerRestartWarning`, :class:`WorkerLeftWarning`).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch.distributed as dist
import torch.distributed.rpc as rpc

# ranks this trainer removed from its group
_evicted: set[int] = set()
# the elastic trainer's: gets every arrival
_listener: Callable[[int], None] | None = None


class WorkerRestartWarning(RuntimeWarning):
    """A collector worker failed and is being replaced (``max_worker_restarts``)."""


class WorkerLeftWarning(RuntimeWarning):
    """A collector of an elastic trainer left (died, became unreachable or
    raised); its slot is vacant."""


def arrive(rank: int) -> None:
    """RPC (served by the trainer): the server of ``rank`` joined the group and is ready."""
    listener = _listener
    # None: the trainer is closing, and stops every member it knows
    if listener is not None:
        listener(rank)


def listen(callback: Callable[[int], None] | None) -> None:
    """Hand every arrival to ``callback(rank)`` (the elastic trainer's pool); None: no longer. A new
    callback starts a new group, whose ranks count from 1 again: the ranks evicted
    before are forgotten."""
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
    """Before this server joins (holding :func:`membership_lock`): list only
    the trainer as a member.

    Servers only talk to the trainer, so a joiner needs no other member, and one that died or
    became unreachable (and is still listed) would fail the join and leave torch's token held.
    """
    rpc_store = dist.PrefixStore(f"rpc_prefix_{generation}", store)
    names = dist.PrefixStore("names", rpc_store)
    listed = names.get(_MEMBERS_KEY).decode() if names.check([_MEMBERS_KEY]) else ""
    names.set(_MEMBERS_KEY,
              "".join(
                  f"{entry}," for entry in listed.split(",") if entry.startswith(f"{trainer}-")))
    rpc_store.set(_TOKEN_KEY, "")


def evict(name: str) -> None:
    """Remove the dead server ``name`` from this trainer's map of its dynamic RPC group.

    Joiners no longer see it (:func:`clear_for_join`); the trainer forgets it here, as a
    graceful leave would have told it to.
    """
    agent = rpc.api._get_current_rpc_agent()
    try:
        info = agent.get_worker_info(name)
    except RuntimeError:
        # never joined, or already evicted
        return
    _evicted.add(info.id)
    agent._update_group_membership(info, [], {}, False)


def is_member(rank: int) -> bool:
    """Whether the server of ``rank`` still belongs to this trainer's group (it was not evicted)."""
    return rank not in _evicted


_LOCK_KEY = "rpc_collectors/membership_lock"
# seconds between tries
_LOCK_POLL = 0.005


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
        # an expired lease
        if held != mine and held and float(held.rpartition("@")[2]) < time.time():
            held = store.compare_set(_LOCK_KEY, held, mine).decode()
        if held == mine:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the RPC group's membership lock stayed held by {held} for "
                               f"{timeout} s")
        time.sleep(_LOCK_POLL)
    try:
        yield
    finally:
        store.compare_set(_LOCK_KEY, mine, "")
