"""Elastic membership: collector processes join and leave a running trainer (``elastic=True``).

The trainer serves a fixed number of collector *slots* (worker ids). Every collector process,
whether one of the trainer's own torchrun/SLURM ranks or one started later with
``RPC_COLLECTORS_JOIN=<host>:<port>`` set (a SLURM job of ``slurm/submit.py --join JOBID``),
draws a unique rank from a counter in the trainer's rendezvous store, joins the trainer's
dynamic RPC group and announces itself (:func:`membership.arrive`). The trainer gives it a
vacant slot, or keeps it as a spare until one falls vacant. A collector that dies, becomes
unreachable or raises is evicted from the group and its slot falls vacant.

:class:`~rpc_collectors.pools.elastic.ElasticPool` is the trainer's handle on those slots and
:mod:`rpc_collectors.recovery` what the collector does as collectors come and go; this module
is the collector process's side of the rendezvous (:func:`join_rendezvous`, :func:`member_rendezvous`).
"""
from __future__ import annotations

import dataclasses
import datetime
import os

import torch.distributed.rpc as rpc

from .rendezvous import Rendezvous, interface_for, store_client

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
    store = store_client(rdv, timeout)
    try:
        store.wait([TRAINER_KEY], datetime.timedelta(seconds=timeout))
    except RuntimeError as err:
        raise TimeoutError(
            f"no elastic trainer came up at {rdv.master_addr}:{rdv.master_port} within join_timeout={timeout} s"
        ) from err
    rpc._init_counter = int(store.get(TRAINER_KEY))  # the trainer's store prefix (init_rpc's counter, see pools.ranks)
    return dataclasses.replace(rdv, rank=int(store.add(RANKS_KEY, 1)), dynamic=True)
