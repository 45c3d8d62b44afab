"""The collector server: what runs in a worker process, and the calls the trainer makes to it.

A server holds one :class:`WorkerState` (a single-process :class:`Collector` and its
:class:`WeightReceiver`), which serves the calls of :mod:`~rpc_collectors.core.protocol`: over RPC on
torchrun/SLURM ranks (:func:`create`, :func:`call`), over the pipes of a
:mod:`~rpc_collectors.worker.channel` in a local worker process (:func:`local_main`), or directly in
the debug launcher.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import socket
import sys
import threading
import warnings
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.distributed.rpc.constants as rpc_constants
from tensordict import TensorDictBase

from rpc_collectors.core import pickling, protocol, worker_warnings
from rpc_collectors.core.protocol import Noted, Ready, WorkerInfo, WorkerSpec
from rpc_collectors.single_process import remote_calls
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.single_process.phase_clock import StoppedClock
from rpc_collectors.single_process.preemption import Preemption
from rpc_collectors.transport import doorbell, local_restarts, membership, rendezvous
from rpc_collectors.transport.data import SlotSpec, SlotWriter
from rpc_collectors.transport.factory_weights import signature_of
from rpc_collectors.transport.rendezvous import Rendezvous, host_id, interface_address, socket_interface
from rpc_collectors.transport.shm import SharedBytes
from rpc_collectors.transport.weight_sync import TransportSpec, WeightReceiver
from rpc_collectors.transport.weights import FlatWeights, holder_of
from rpc_collectors.worker import channel, cpp_log, spawner
from rpc_collectors.worker.env_steps import EnvSteps, StepGroup, step_row
from rpc_collectors.worker.node import NodeCollector
from rpc_collectors.worker.node_inference import NodePolicy
from rpc_collectors.worker.observing import ObservingCalls
from rpc_collectors.worker.spawner import name_process

TRAINER = "trainer"
PING_EVERY = 5.0  # seconds between a server's checks that its trainer is still there
STOP_GRACE = 5.0  # at most this many seconds from stop() to the end of the server


def worker_name(rank: int, session: str = "") -> str:
    """RPC name of the server on ``rank``; ``session`` keeps names unique per collector.

    No ``-``: a dynamic RPC group lists its members as ``name-rank`` (see :mod:`membership`).
    """
    return f"collector{rank}_{session}" if session else f"collector{rank}"


class WorkerState(ObservingCalls):
    """One collector server: its collector, its weights, its identity (and its trace calls)."""

    def __init__(
        self, spec: bytes, worker_id: int, num_workers: int, rank: int, traj_id_start: int | None = None,
        address: str | None = None, in_process: bool = False,
    ) -> None:
        """Trajectory ids are ``traj_id_start + k * num_workers`` (default start: ``worker_id``);
        ``address``: where the trainer reaches this process, for error messages. A spec with a
        :class:`~rpc_collectors.worker.node.NodeSpec` makes this server a node of local workers.
        A server with a process of its own (not ``in_process``: in the debug launcher's trainer)
        runs under the warning filters the trainer sent (:mod:`~rpc_collectors.core.worker_warnings`),
        and ignores the warnings of the modules that loading the spec imports."""
        with warnings.catch_warnings():
            if not in_process:
                warnings.simplefilter("ignore")
            loaded = WorkerSpec.loads(spec)
        create_env_fn, policy, kwargs, node = loaded.create_env_fn, loaded.policy, dict(loaded.options), loaded.node
        filters = kwargs.pop(worker_warnings.KEY)
        if not in_process:
            worker_warnings.apply(filters)
        init_fn = kwargs.pop("init_fn", None)
        preemptible = kwargs.pop("preemptible", False)
        if init_fn is not None:  # TorchRL's init_fn: run in the worker before its env and policy are built
            init_fn()
        self.rank, self.address = rank, address
        start = worker_id if traj_id_start is None else traj_id_start
        self.skipped = (start - worker_id) // num_workers  # id counts a replacement starts above its predecessors'
        if node is None:
            self.collector: Collector | NodeCollector = Collector(
                create_env_fn, policy, traj_id_start=start, traj_id_stride=num_workers, **kwargs
            )
        else:
            self.collector = NodeCollector(create_env_fn, policy, node, start, num_workers, node_id=worker_id, **kwargs)
        self.collector.keep_version_key = True  # the trainer reads each batch's versions from it
        self.collector.worker_idx = worker_id  # TorchRL's attribute: which worker this is
        # a local worker of a node with inference="node": each batch takes the version its policy calls answer
        self.node_policy = policy if isinstance(policy, NodePolicy) else None
        if self.node_policy is not None:
            self.node_policy.collector = self.collector
        self.preemption = Preemption() if preemptible else None
        if self.preemption is not None:
            self.collector.preemption = self.preemption
        self.receiver: WeightReceiver | None = None
        self.writer: SlotWriter | None = None
        self.timeout = 60.0

    def _weights_lock(self) -> Any:
        """Held while pushed weights are applied: a node's inference waits meanwhile."""
        return self.collector.weights_lock if isinstance(self.collector, NodeCollector) else contextlib.nullcontext()

    def info(self) -> WorkerInfo:
        """Who serves this collector: rank, host name, address, pid, machine id; its number of envs and torch threads."""
        node = isinstance(self.collector, NodeCollector)
        envs = self.collector.num_envs if node else int(torch.Size(self.collector.env.batch_size).numel())
        info: WorkerInfo = {"rank": self.rank, "host": socket.gethostname(), "address": self.address, "pid": os.getpid(),
                            "host_id": host_id(), "envs": envs, "threads": torch.get_num_threads()}
        if node:
            info["local_pids"], info["inference"] = self.collector.pids, self.collector.node.inference
        return info

    def _module(self) -> Any:
        if isinstance(self.collector, NodeCollector):
            return self.collector.module
        return self.collector.policy.module if self.collector.policy is not None else None

    def weights_signature(self) -> tuple | None:
        """What this worker's policy holds (:mod:`~rpc_collectors.transport.factory_weights`); None: a node taking any."""
        if isinstance(self.collector, NodeCollector) and self.collector.module is None:
            return None
        return signature_of(self._module())

    def join_weights(self, spec: TransportSpec) -> None:
        if isinstance(self.collector, NodeCollector) and self.collector.module is None and spec.signature:
            self.collector.hold_weights(holder_of(spec.signature))  # passed on to its local workers
        module = self._module()
        if module is None:
            raise TypeError("the policy has no weights to update")
        self.timeout = spec.timeout
        if spec.kind == "broadcast" and _rdv is not None and _rdv.interface:  # this host's, not the trainer's
            spec = dataclasses.replace(spec, interface=_rdv.interface)
        if self.receiver is not None:
            self.receiver.close()
        self.receiver = WeightReceiver(spec, FlatWeights(module), self.rank)

    def receive_weights(self, version: int, mode: str, payload: torch.Tensor | None = None) -> None:
        self.receiver.receive(version, mode, payload)

    def join_batches(self, spec: SlotSpec) -> bool:
        """Map the trainer's batch slots (another host: make its own), answer its doorbell; False if it cannot."""
        try:
            self.writer = SlotWriter(spec)
            doorbell.answer(spec.doorbell, self.collect, self.writer.memory if spec.fd is None else None)
        except (OSError, RuntimeError):
            self.writer = None
            return False
        return True

    def collect(self, min_version: int, slot: int | None = None) -> TensorDictBase | Ready | Noted:
        """The next batch: written into shared-memory ``slot`` (answering :class:`Ready`), or returned; a node's
        answer carries its local restarts and own drops since its last (:mod:`~rpc_collectors.transport.local_restarts`)."""
        clock = self.collector.rollout.clock if isinstance(self.collector, Collector) else StoppedClock()  # a node's: its workers
        clock.mark("idle")  # since its last batch: waiting for this request
        if self.preemption is not None:
            self.preemption.begin()
        receiver = self.receiver  # none received since the last apply and min_version held: nothing to apply
        if receiver is not None and (receiver.unapplied or self.collector.policy_version < min_version):
            with self._weights_lock():
                receiver.apply(self.collector, min_version, self.timeout)
            clock.mark("weights")
        if self.node_policy is not None:
            self.node_policy.begin()
        if self.writer is not None and isinstance(self.collector, Collector):  # observations go straight into the slot
            self.collector.rollout.out = {} if slot is None else self.writer.tensors[slot]
        batch = self.collector.next()
        node = isinstance(self.collector, NodeCollector)
        if slot is not None and self.writer is not None:
            # a batch that does not fit the slot is returned; its observations may lie there already
            result = Ready(slot) if self.writer.write(slot, batch) else batch.clone()
        elif node:  # its tensors are views of the local workers' shared slots, which an RPC result would carry whole
            result = batch.clone()
        else:
            result = batch
        clock.mark("write")  # the batch built and in its slot
        return local_restarts.attach(result, self.collector.new_restarts(), self.collector.new_drops()) if node else result

    def step_row(self) -> TensorDictBase:
        """This env's row of a step plane (:mod:`~rpc_collectors.worker.env_steps`), for the trainer to lay out."""
        return step_row(self.collector.env)

    def join_steps(self, group: StepGroup) -> None:
        """Step this env, and the group's others, with the actions the trainer writes into their rows of the step plane."""
        self.steps = EnvSteps(self.collector.env, group, self.collector.rollout)

    def get_distant_attr(self, attr: str) -> Any:
        """TorchRL's ``get_distant_attr``: this worker's collector's attribute at the dotted path ``attr``."""
        return remote_calls.attribute(self.collector, attr)

    def map_fn(self, method: str, args: tuple, kwargs: dict) -> Any:
        """TorchRL's ``map_fn``: this worker's collector's ``method`` (a dotted path) called with ``args``, ``kwargs``."""
        return remote_calls.attribute(self.collector, method)(*args, **kwargs)

    def set_hook(self, name: str, hook: bytes) -> None:
        """Set the collector's ``pre_collect_hook`` or ``post_collect_hook`` (cloudpickled; TorchRL's setters)."""
        setattr(self.collector, name, pickling.loads(hook))

    def preempt(self, batch: int) -> None:
        """End the ``batch``-th batch asked of this worker at its next step (TorchRL's preemption)."""
        self.preemption.stop(batch)

    def set_seed(self, seed: int) -> int:
        torch.manual_seed(seed)
        if getattr(self, "steps", None) is not None:  # an AsyncBatchedCollector's env worker: its group's other envs
            self.steps.set_seed(seed)
        return self.collector.set_seed(seed)

    def state_dict(self) -> dict:  # trajectory count from worker_id: a resumed worker continues above every id used
        if self.receiver is not None:  # the state holds the newest weights pushed to this worker
            with self._weights_lock():
                self.receiver.apply(self.collector, 0, self.timeout)
        if isinstance(self.collector, NodeCollector):
            return self.collector.state_dict(self.skipped)
        state = self.collector.state_dict()
        state["traj_count"] += self.skipped
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.receiver is not None:
            with self._weights_lock():
                self.receiver.superseded()
        self.collector.load_state_dict(state)

    def cut(self, batch: int) -> None:
        """The trainer dropped this worker's ``batch``-th batch: its trajectories in progress end (a node's: those of the local
        workers in that batch)."""
        self.collector.cut(batch) if isinstance(self.collector, NodeCollector) else self.collector.cut()

    def interrupt(self) -> None:
        """The process is closing: the batch in progress ends at its next step (a node's: its local
        collector shuts down, which ends its local workers' batches likewise)."""
        self.collector.shutdown() if isinstance(self.collector, NodeCollector) else self.collector.interrupt()

    def close(self) -> None:
        if self.receiver is not None:
            self.receiver.close()
        self.collector.shutdown()


# ---------------------------------------------------------------- RPC entry points
_state: WorkerState | None = None
_rdv: Rendezvous | None = None
_stop = threading.Event()


def create(spec: bytes, worker_id: int, num_workers: int, traj_id_start: int | None = None) -> WorkerInfo:
    """RPC: build this server's collector (:data:`~rpc_collectors.core.protocol.CREATE`)."""
    global _state
    address = interface_address(_rdv.interface) if _rdv is not None and _rdv.interface else None
    _state = WorkerState(spec, worker_id, num_workers, rpc.get_worker_info().id, traj_id_start, address)
    return _state.info()


def call(method: str, *args: Any) -> Any:
    """RPC: serve the call ``method`` (:class:`~rpc_collectors.core.protocol.WorkerCalls`) with ``args``."""
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
    """RPC (served by the trainer): the trainer is alive; False if it evicted the server of ``rank``."""
    return membership.is_member(rank)


_agent_started = False  # whether this process started an RPC agent
_listening_on: str | None = None  # the address its first one bound to its interface (None: TensorPipe's own pick)


def start_agent(name: str, rdv: Rendezvous, rpc_timeout: float) -> None:
    """Start this process's RPC agent as ``name``, bound to the rendezvous's interface. TensorPipe
    keeps the first agent's address for the whole process: one asked to listen elsewhere is refused."""
    global _agent_started, _listening_on
    address = rdv.address() if rdv.interface else None
    if address and _listening_on and address != _listening_on:
        raise RuntimeError(
            f"this process's first RPC agent listened on {_listening_on}, and torch's TensorPipe keeps that address "
            f"for every later agent of the process; this one's peers reach it on {address} (interface "
            f"{rdv.interface!r}): run this collector in a new process"
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
            world_size = None if rdv.dynamic else rdv.world_size  # None: members may join and leave
            rpc.init_rpc(name, rank=rdv.rank, world_size=world_size, rpc_backend_options=options)
    finally:
        rpc_constants.DEFAULT_PROCESS_GROUP_TIMEOUT = default_timeout
    if not _agent_started:
        _agent_started, _listening_on = True, address


def serve(rdv: Rendezvous, rpc_timeout: float) -> int:
    """Run a collector server until the trainer stops it or goes away; returns an exit code."""
    global _rdv
    _rdv = rdv
    if "OMP_NUM_THREADS" not in os.environ:  # one torch thread, as local workers (torchrun sets 1 too; srun does not)
        torch.set_num_threads(1)
    name_process(f"rpc-worker{rdv.rank - 1}")
    spawner.rpc_starts_here(fork_now=False)  # a node collector's local workers must not inherit the agent
    if rdv.dynamic:  # its peers may die and be replaced: TensorPipe would log each of their connections
        cpp_log.level().value = cpp_log.ERROR
    name = worker_name(rdv.rank, rdv.session)
    store = rendezvous.store_client(rdv, rpc_timeout)
    if rdv.dynamic:  # one join at a time (see membership.membership_lock)
        with membership.membership_lock(store, name, rpc_timeout):
            membership.clear_for_join(store, rpc._init_counter, TRAINER)
            start_agent(name, rdv, rpc_timeout)
            rpc.rpc_sync(TRAINER, membership.arrive, args=(rdv.rank,), timeout=rpc_timeout)
    else:
        start_agent(name, rdv, rpc_timeout)
    code = watch_trainer(name, rdv.rank, rpc_timeout)
    if _stop.is_set():  # stopped by the trainer: let its agent stop first (see stop())
        with contextlib.suppress(RuntimeError):
            store.wait([rendezvous.stopped_key(rdv)], datetime.timedelta(seconds=min(rpc_timeout, STOP_GRACE)))
    if _state is not None:
        _state.close()
    rpc.shutdown(graceful=False)
    return code


def watch_trainer(name: str, rank: int, rpc_timeout: float) -> int:
    """Ping the trainer until it stops this server (exit code 0) or is gone (1, said on stderr)."""
    while not _stop.wait(min(PING_EVERY, rpc_timeout)):
        try:
            if rpc.rpc_sync(TRAINER, ping, args=(rank,), timeout=max(rpc_timeout, PING_EVERY)):
                continue
            gone = f"the trainer evicted this collector (it did not answer within rpc_timeout={rpc_timeout} s)"
        except RuntimeError as err:
            gone = f"the trainer is unreachable ({err})"
        if _stop.is_set():  # the trainer stopped us, then its agent, while the ping was on its way
            return 0
        print(f"{name}: {gone}; exiting", file=sys.stderr)
        return 1
    return 0


class LocalServer:
    """A local worker process's calls, as its channel delivers them: ``create`` builds its state."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state: WorkerState | None = None

    def handle(self, method: str, args: tuple) -> Any:
        if method == protocol.CREATE:
            spec, worker_id, num_workers, traj_id_start = args
            spec = spec.read() if isinstance(spec, SharedBytes) else spec
            self.state = WorkerState(spec, worker_id, num_workers, self.rank, traj_id_start, "127.0.0.1")
            return self.state.info()
        if self.state is None:
            raise RuntimeError(f"collector worker {self.rank - 1} has no collector yet")
        return protocol.serve(self.state, method, args)

    def interrupt(self) -> None:
        if self.state is not None:
            self.state.interrupt()

    def close(self) -> None:
        if self.state is not None:
            self.state.close()


def local_main(rank: int, *ends: Any) -> int:
    """Entry point of a local worker process started by the spawner: serve the trainer's channel
    (``ends``: the fields of its :class:`~rpc_collectors.transport.doorbell.Ends`) until it closes."""
    torch.set_num_threads(1)
    name_process(f"rpc-worker{rank - 1}")
    server = LocalServer(rank)
    channel.serve(doorbell.Ends(*ends), server.handle, server.close, server.interrupt)
    return 0
