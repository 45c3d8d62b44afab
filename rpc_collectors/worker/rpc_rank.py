"""A torchrun/SLURM rank serving a collector over ``torch.distributed.rpc``.

:func:`serve_rank` starts this process's RPC agent, joins the trainer's group and pings the trainer
until it stops the server or goes away. The trainer calls the RPC entry points :func:`create`
(build the :class:`~rpc_collectors.worker.server.WorkerState`), :func:`call` (serve one call of
:mod:`~rpc_collectors.core.protocol`) and :func:`stop`; the server calls the trainer's :func:`ping`.
One server per process: the module keeps its state, its rendezvous and its stop.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import warnings
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.distributed.rpc.constants as rpc_constants

from rpc_collectors.core import protocol
from rpc_collectors.core.protocol import WorkerInfo
from rpc_collectors.transport import membership, rendezvous
from rpc_collectors.transport.rendezvous import Rendezvous, interface_address, socket_interface
from rpc_collectors.worker import cpp_log, spawner
from rpc_collectors.worker.server import WorkerState
from rpc_collectors.worker.spawner import name_process

TRAINER = "trainer"
# seconds between a server's checks that its trainer is still there
PING_EVERY = 5.0
# at most this many seconds from stop() to the end of the server
STOP_GRACE = 5.0

_state: WorkerState | None = None
_rdv: Rendezvous | None = None
_stop = threading.Event()
# whether this process started an RPC agent
_agent_started = False
# the address its first one bound to its interface (None: TensorPipe's own pick)
_listening_on: str | None = None
# set while this process's agent runs: a call to the trainer from another thread waits for it
_agent_up = threading.Event()


def worker_name(rank: int, session: str = "") -> str:
    """RPC name of the server on ``rank``; ``session`` keeps names unique per collector.

    No ``-``: a dynamic RPC group lists its members as ``name-rank`` (see :mod:`membership`).
    """
    return f"collector{rank}_{session}" if session else f"collector{rank}"


def create(spec: bytes, worker_id: int, num_workers: int,
           traj_id_start: int | None = None) -> WorkerInfo:
    """RPC: build this server's collector (:data:`~rpc_collectors.core.protocol.CREATE`)."""
    global _state
    interface = _rdv.interface if _rdv is not None else None
    address = interface_address(interface) if interface else None
    _state = WorkerState(spec, worker_id, num_workers, rpc.get_worker_info().id, traj_id_start,
                         address, interface=interface)
    return _state.info()


def call(method: str, *args: Any) -> Any:
    """RPC: serve the call ``method``
    (:class:`~rpc_collectors.core.protocol.WorkerCalls`) with ``args``."""
    if _state is None:
        raise RuntimeError(f"{rpc.get_worker_info().name} has no collector yet")
    return protocol.serve(_state, method, args)


def stop() -> None:
    """RPC: close this server's collector, then end the server once the trainer's agent stopped.

    From here on the server drops torch's C++ warnings: its agent would otherwise log every
    connection that its peers close as they stop, though nothing went wrong.
    """
    global _state
    state, _state = _state, None
    if state is not None:
        state.close()
    cpp_log.level().value = cpp_log.ERROR
    _stop.set()


def ping(rank: int) -> bool:
    """RPC (served by the trainer): the trainer is alive; False if it evicted
    the server of ``rank``."""
    return membership.is_member(rank)


def start_agent(name: str, rdv: Rendezvous, rpc_timeout: float) -> None:
    """Start this process's RPC agent as ``name``, bound to the rendezvous's interface. TensorPipe
    keeps the first agent's address for the whole process: one asked to listen
    elsewhere is refused."""
    global _agent_started, _listening_on
    address = rdv.address() if rdv.interface else None
    if address and _listening_on and address != _listening_on:
        raise RuntimeError(
            f"this process's first RPC agent listened on {_listening_on}, and torch's TensorPipe "
            "keeps that address for every later agent of the process; this one's peers reach it "
            f"on {address} (interface {rdv.interface!r}): run this collector in a new process"
        )
    # TCP ("uv") only: TensorPipe's shared-memory transport busy-polls a core in every process
    options = rpc.TensorPipeRpcBackendOptions(
        init_method=rdv.init_method(rpc_timeout), rpc_timeout=rpc_timeout, _transports=["uv"]
    )
    # init_rpc builds a gloo group of its own with a 24-day timeout: bound it by rpc_timeout
    default_timeout = rpc_constants.DEFAULT_PROCESS_GROUP_TIMEOUT
    rpc_constants.DEFAULT_PROCESS_GROUP_TIMEOUT = datetime.timedelta(seconds=rpc_timeout)
    try:
        with socket_interface(rdv.interface), warnings.catch_warnings():
            # that group also trips a deprecation warning inside torch
            warnings.filterwarnings("ignore", message="You are using a Backend")
            # None: members may join and leave
            world_size = None if rdv.dynamic else rdv.world_size
            rpc.init_rpc(name, rank=rdv.rank, world_size=world_size, rpc_backend_options=options)
    finally:
        rpc_constants.DEFAULT_PROCESS_GROUP_TIMEOUT = default_timeout
    if not _agent_started:
        _agent_started, _listening_on = True, address


def serve_rank(rdv: Rendezvous, rpc_timeout: float) -> int:
    """Run a collector server until the trainer stops it or goes away; returns an exit code."""
    global _rdv
    _rdv = rdv
    # one torch thread, as local workers (torchrun sets 1 too; srun does not)
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    name_process(f"rpc-worker{rdv.rank - 1}")
    # a node collector's local workers must not inherit the agent
    spawner.rpc_starts_here(fork_now=False)
    # its peers may die and be replaced: TensorPipe would log each of their connections
    if rdv.dynamic:
        cpp_log.level().value = cpp_log.ERROR
    name = worker_name(rdv.rank, rdv.session)
    store = rendezvous.store_client(rdv, rpc_timeout)
    # one join at a time (see membership.membership_lock)
    if rdv.dynamic:
        with membership.membership_lock(store, name, rpc_timeout):
            membership.clear_for_join(store, rpc._init_counter, TRAINER)
            start_agent(name, rdv, rpc_timeout)
            rpc.rpc_sync(TRAINER, membership.arrive, args=(rdv.rank,), timeout=rpc_timeout)
    else:
        start_agent(name, rdv, rpc_timeout)
    _agent_up.set()
    code = watch_trainer(name, rdv.rank, rpc_timeout)
    # stopped by the trainer: let its agent stop first (see stop())
    if _stop.is_set():
        with contextlib.suppress(RuntimeError):
            store.wait([rendezvous.stopped_key(rdv)],
                       datetime.timedelta(seconds=min(rpc_timeout, STOP_GRACE)))
    if _state is not None:
        _state.close()
    _agent_up.clear()
    rpc.shutdown(graceful=False)
    return code


def tell_trainer(fn: Any, args: tuple, timeout: float) -> None:
    """Call ``fn(*args)`` on the trainer, once this process's agent runs (waiting up to ``timeout``
    seconds for it, and as long again for the answer)."""
    if not _agent_up.wait(timeout):
        raise TimeoutError(f"this collector's RPC agent did not start within {timeout:.0f} s")
    rpc.rpc_sync(TRAINER, fn, args=args, timeout=timeout)


def watch_trainer(name: str, rank: int, rpc_timeout: float) -> int:
    """Ping the trainer until it stops this server (exit code 0) or is gone (1, said on stderr)."""
    while not _stop.wait(min(PING_EVERY, rpc_timeout)):
        try:
            if rpc.rpc_sync(TRAINER, ping, args=(rank,), timeout=max(rpc_timeout, PING_EVERY)):
                continue
            gone = ("the trainer evicted this collector (it did not answer within "
                    f"rpc_timeout={rpc_timeout} s)")
        except RuntimeError as err:
            gone = f"the trainer is unreachable ({err})"
        # the trainer stopped us, then its agent, while the ping was on its way
        if _stop.is_set():
            return 0
        print(f"{name}: {gone}; exiting", file=sys.stderr)
        return 1
    return 0
