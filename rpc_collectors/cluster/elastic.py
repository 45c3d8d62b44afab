"""Elastic membership: collector processes join and leave a running trainer (``elastic=True``).

The trainer serves a fixed number of collector *slots* (worker ids). Every collector process,
whether one of the trainer's own torchrun/SLURM ranks or one started later with
``RPC_COLLECTORS_JOIN=<host>:<port>`` set (a SLURM job of ``slurm/submit.py --join JOBID``),
draws a unique rank from a counter in the trainer's rendezvous store, joins the trainer's
dynamic RPC group and announces itself (:func:`membership.arrive`). The trainer gives it a
vacant slot, or keeps it as a spare until one falls vacant. A collector that dies, becomes
unreachable or raises is evicted from the group and its slot falls vacant.

:class:`~rpc_collectors.pools.ranks.elastic_pool.ElasticPool` is the trainer's handle on those slots
and :mod:`rpc_collectors.trainer.recovery` what the collector does as collectors come and go; this
module is the collector process's side of the rendezvous (:func:`join_rendezvous`,
:func:`member_rendezvous`).
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import time

import torch.distributed.rpc as rpc

from rpc_collectors.transport.rendezvous import Rendezvous, interface_for, store_client

# <host>:<port> of a running elastic trainer's rendezvous store
JOIN_VARIABLE = "RPC_COLLECTORS_JOIN"
# set once the trainer's agent runs: its RPC generation
TRAINER_KEY = "rpc_collectors/elastic/trainer"
# counter: each collector process draws its rank from it
RANKS_KEY = "rpc_collectors/elastic/ranks"


def join_rendezvous() -> Rendezvous | None:
    """The rendezvous of a process started to join a running trainer
    (``RPC_COLLECTORS_JOIN`` set), else None."""
    address = os.environ.get(JOIN_VARIABLE)
    if address is None:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{JOIN_VARIABLE}={address!r} is invalid; accepted: <host>:<port> of the "
                         "trainer's rendezvous")
    return Rendezvous("join", -1, 0, host, int(port), interface_for(host), dynamic=True)


def member_rendezvous(rdv: Rendezvous, timeout: float) -> Rendezvous:
    """Wait up to ``timeout`` s for the trainer's group, then draw this
    collector's unique rank in it."""
    deadline = time.monotonic() + timeout
    try:
        store = store_client(rdv, timeout)
    except ConnectionError as err:
        raise _no_trainer(rdv, timeout, "nothing there answered as a rendezvous store") from err
    try:
        store.wait([TRAINER_KEY],
                   datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
    except RuntimeError as err:
        what = "a rendezvous store answered, but no elastic trainer started in it"
        raise _no_trainer(rdv, timeout, what) from err
    # the trainer's store prefix (init_rpc's counter, see pools.ranks)
    rpc._init_counter = int(store.get(TRAINER_KEY))
    # this process is a member now: what it builds (a node's local workers) does not join again
    os.environ.pop(JOIN_VARIABLE, None)
    return dataclasses.replace(rdv, rank=int(store.add(RANKS_KEY, 1)), dynamic=True)


def _no_trainer(rdv: Rendezvous, timeout: float, what: str) -> TimeoutError:
    """The error of a collector that found no elastic trainer at ``rdv``'s address
    within ``timeout`` s."""
    address = f"{rdv.master_addr}:{rdv.master_port}"
    joined = rdv.launcher == "join"
    source = f"{JOIN_VARIABLE}={address}" if joined else f"MASTER_ADDR:MASTER_PORT={address}"
    return TimeoutError(
        f"this collector found no elastic trainer at {source} within join_timeout={timeout:g} s: "
        f"{what}. Check that the trainer runs, with RPCCollector(..., elastic=True); that "
        f"{address} is its rendezvous address, the MASTER_ADDR:MASTER_PORT of the trainer (a SLURM "
        "trainer job writes it to <log-dir>/<job id>_rendezvous.json), not another of its ports; "
        f"and that this host can reach that port (a firewall, the network interface)"
    )
