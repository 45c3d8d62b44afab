"""The collector server: the state a worker process keeps, serving the calls
the trainer makes to it.

A server holds one :class:`WorkerState`: the collector it serves (a
:class:`~rpc_collectors.worker.single.SingleCollector`, or a node's
:class:`~rpc_collectors.worker.node.NodeCollector`: each a
:class:`~rpc_collectors.worker.served_collector.ServedCollector`) and its
:class:`WeightReceiver`. It serves the calls of :mod:`~rpc_collectors.core.protocol` over whichever
transport carries them: RPC on torchrun/SLURM ranks (:mod:`~rpc_collectors.worker.rpc_rank`), the
pipes of a local worker process (:mod:`~rpc_collectors.worker.local_worker`), Ray actors, or plain
calls in the debug launcher.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import socket
import warnings
from typing import Any

import torch
from tensordict import TensorDictBase

from rpc_collectors.core import pickling, worker_warnings
from rpc_collectors.core.protocol import Noted, Ready, WorkerInfo, WorkerSpec
from rpc_collectors.single_process import remote_calls
from rpc_collectors.single_process.preemption import Preemption
from rpc_collectors.transport import doorbell
from rpc_collectors.transport.data import SlotSpec
from rpc_collectors.transport.rendezvous import host_id
from rpc_collectors.transport.weight_sync import Receipt, TransportSpec, WeightReceiver
from rpc_collectors.transport.weights import FlatWeights
from rpc_collectors.worker.env_steps import EnvSteps, StepGroup, step_row
from rpc_collectors.worker.evaluations import Evaluations
from rpc_collectors.worker.node import NodeCollector
from rpc_collectors.worker.node_inference import NodePolicy
from rpc_collectors.worker.observing import ObservingCalls
from rpc_collectors.worker.served_collector import ServedCollector
from rpc_collectors.worker.single import SingleCollector, SlotWriter


class WorkerState(ObservingCalls):
    """One collector server: its collector, its weights, its identity (and its trace calls)."""

    def __init__(
        self, spec: bytes, worker_id: int, num_workers: int, rank: int,
        traj_id_start: int | None = None,
        address: str | None = None, in_process: bool = False, interface: str | None = None,
    ) -> None:
        """Trajectory ids are ``traj_id_start + k * num_workers`` (default start: ``worker_id``);
        ``address``: where the trainer reaches this process, for error messages; ``interface``: the
        network interface this host's broadcast weights arrive on (a rank's, from its rendezvous). A
        spec with a :class:`~rpc_collectors.worker.node.NodeSpec` makes this server a node of local
        workers. A server with a process of its own (not ``in_process``: in the debug launcher's
        trainer) runs under the warning filters the trainer sent
        (:mod:`~rpc_collectors.core.worker_warnings`), and ignores the warnings of the modules that
        loading the spec imports."""
        with warnings.catch_warnings():
            if not in_process:
                warnings.simplefilter("ignore")
            loaded = WorkerSpec.loads(spec)
        create_env_fn, policy, node = loaded.create_env_fn, loaded.policy, loaded.node
        kwargs = dict(loaded.options)
        filters = kwargs.pop(worker_warnings.KEY)
        if not in_process:
            worker_warnings.apply(filters)
        init_fn = kwargs.pop("init_fn", None)
        preemptible = kwargs.pop("preemptible", False)
        # TorchRL's init_fn: run in the worker before its env and policy are built
        if init_fn is not None:
            init_fn()
        self.rank, self.address, self.interface = rank, address, interface
        start = worker_id if traj_id_start is None else traj_id_start
        # id counts a replacement starts above its predecessors'
        self.skipped = (start - worker_id) // num_workers
        self.preemption = Preemption() if preemptible else None
        if node is None:
            self.collector: ServedCollector = SingleCollector(
                create_env_fn, policy, worker_id, self.preemption, traj_id_start=start,
                traj_id_stride=num_workers, **kwargs,
            )
        else:
            self.collector = NodeCollector(create_env_fn, policy, node, start, num_workers,
                                           node_id=worker_id, **kwargs)
        # a local worker of a node with inference="node": each batch takes the version
        # its policy calls answer
        self.node_policy = policy if isinstance(policy, NodePolicy) else None
        if self.node_policy is not None:
            self.node_policy.collector = self.collector
        self.receiver: WeightReceiver | None = None
        self.writer: SlotWriter | None = None
        self.steps: EnvSteps | None = None
        self.timeout = 60.0
        # an Evaluator's (backend="worker"), beside this collector
        self.evaluations = Evaluations()

    def info(self) -> WorkerInfo:
        """Who serves this collector: rank, host name, address, pid, machine id; its number of envs
        and torch threads (a node's: also its local workers' pids and its inference)."""
        info: WorkerInfo = {"rank": self.rank, "host": socket.gethostname(),
                            "address": self.address, "pid": os.getpid(),
                            "host_id": host_id(), "threads": torch.get_num_threads()}
        info.update(self.collector.worker_info())
        return info

    def weights_signature(self) -> tuple | None:
        """What this worker's policy holds (:mod:`~rpc_collectors.transport.factory_weights`);
        None: a node taking any."""
        return self.collector.weights_signature()

    def join_weights(self, spec: TransportSpec) -> None:
        module = self.collector.weights_holder(spec.signature)
        if module is None:
            raise TypeError("the policy has no weights to update")
        self.timeout = spec.timeout
        # this host's, not the trainer's
        if spec.kind == "broadcast" and self.interface:
            spec = dataclasses.replace(spec, interface=self.interface)
        if self.receiver is not None:
            self.receiver.close()
        self.receiver = WeightReceiver(spec, FlatWeights(module), self.rank)

    def receive_weights(self, version: int, mode: str,
                        payload: torch.Tensor | None = None) -> Receipt:
        """Take version ``version`` (:meth:`WeightReceiver.receive`); answers how long its bytes
        and its last apply took (:data:`~rpc_collectors.transport.weight_sync.Receipt`)."""
        return self.receiver.receive(version, mode, payload)

    def join_batches(self, spec: SlotSpec) -> bool:
        """Map the trainer's batch slots (another host: make its own), answer its
        doorbell; False if it cannot."""
        try:
            self.writer = SlotWriter(spec)
            credits = self.collector.credits
            # a node's requests are announced as they arrive (worker.node_credits)
            doorbell.answer(spec.doorbell, functools.partial(self._collect, announced=True),
                            self.writer.memory if spec.fd is None else None,
                            announce=None if credits is None else credits.announce)
        except (OSError, RuntimeError):
            self.writer = None
            return False
        return True

    def collect(self, min_version: int, slot: int | None = None) -> TensorDictBase | Ready | Noted:
        """The next batch: written into shared-memory ``slot`` (answering :class:`Ready`), or
        returned; a node's answer carries its local restarts and own drops since its last
        (:mod:`~rpc_collectors.transport.local_restarts`)."""
        return self._collect(min_version, slot)

    def _collect(self, min_version: int, slot: int | None,
                 announced: bool = False) -> TensorDictBase | Ready | Noted:
        """:meth:`collect`. A node that holds credits applies the weights of every request
        announced so far (``announced``: this one was, by the doorbell), which it then asks of its
        local workers."""
        credits = self.collector.credits
        if credits is not None:
            if not announced:
                credits.announce(min_version)
            min_version = max(min_version, credits.take() or 0)
        # a node's counts nothing: its local workers keep theirs
        clock = self.collector.phase_clock
        # since its last batch: waiting for this request
        clock.mark("idle")
        if self.preemption is not None:
            self.preemption.begin()
        # none received since the last apply and min_version held: nothing to apply
        receiver = self.receiver
        due = receiver is not None and (
            receiver.unapplied or self.collector.policy_version < min_version)
        if due:
            with self.collector.weights_lock:
                receiver.apply(self.collector, min_version, self.timeout)
            clock.mark("weights")
        if self.node_policy is not None:
            self.node_policy.begin()
        # observations go straight into the slot
        if self.writer is not None:
            self.collector.write_into({} if slot is None else self.writer.tensors[slot])
        batch = self.collector.next()
        if slot is not None and self.writer is not None:
            # a batch that does not fit the slot is returned; its observations may lie there already
            result = Ready(slot) if self.writer.write(slot, batch) else batch.clone()
        else:
            result = self.collector.returned(batch)
        # the batch built and in its slot
        clock.mark("write")
        return self.collector.noted(result)

    def step_row(self) -> TensorDictBase:
        """This env's row of a step plane (:mod:`~rpc_collectors.worker.env_steps`), for
        the trainer to lay out."""
        return step_row(self.collector.env)

    def join_steps(self, group: StepGroup) -> None:
        """Step this env, and the group's others, with the actions the trainer writes into their
        rows of the step plane."""
        self.steps = EnvSteps(self.collector, group)

    def evaluate(self, recipe: bytes, weights: Any,
                 dump_step: int | None) -> tuple[TensorDictBase, float]:
        """An ``Evaluator``'s evaluation (:mod:`~rpc_collectors.worker.evaluations`), in this call's
        thread."""
        return self.evaluations.run(recipe, weights, dump_step)

    def stop_evaluation(self) -> None:
        """The ``Evaluator`` shut down: its evaluation in progress here ends at its next step."""
        self.evaluations.stop()

    def get_distant_attr(self, attr: str) -> Any:
        """TorchRL's ``get_distant_attr``: this worker's collector's attribute at the
        dotted path ``attr``."""
        return remote_calls.attribute(self.collector, attr)

    def map_fn(self, method: str, args: tuple, kwargs: dict) -> Any:
        """TorchRL's ``map_fn``: this worker's collector's ``method`` (a dotted path) called with
        ``args``, ``kwargs``."""
        return remote_calls.attribute(self.collector, method)(*args, **kwargs)

    def set_hook(self, name: str, hook: bytes) -> None:
        """Set the collector's ``pre_collect_hook`` or ``post_collect_hook``
        (cloudpickled; TorchRL's setters)."""
        setattr(self.collector, name, pickling.loads(hook))

    def preempt(self, batch: int) -> None:
        """End the ``batch``-th batch asked of this worker at its next step
        (TorchRL's preemption)."""
        self.preemption.stop(batch)

    def set_seed(self, seed: int) -> int:
        torch.manual_seed(seed)
        # an AsyncBatchedCollector's env worker: its group's other envs
        if self.steps is not None:
            self.steps.set_seed(seed)
        return self.collector.set_seed(seed)

    def state_dict(self) -> dict:
        """Its state, with the trajectory count from ``worker_id``: a resumed worker continues above
        every id used."""
        # the state holds the newest weights pushed to this worker
        if self.receiver is not None:
            with self.collector.weights_lock:
                self.receiver.apply(self.collector, 0, self.timeout)
        return self.collector.state_dict(self.skipped)

    def load_state_dict(self, state: dict) -> None:
        if self.receiver is not None:
            with self.collector.weights_lock:
                self.receiver.superseded()
        self.collector.load_state_dict(state)

    def cut(self, batch: int) -> None:
        """The trainer dropped this worker's ``batch``-th batch: its trajectories in progress end (a
        node's: those of the local workers in that batch)."""
        self.collector.cut(batch)

    def interrupt(self) -> None:
        """The process is closing: the batch in progress ends at its next step (a node's: its local
        collector shuts down, which ends its local workers' batches likewise), and so does an
        evaluation in progress."""
        self.evaluations.interrupt()
        self.collector.interrupt()

    def close(self) -> None:
        self.evaluations.close()
        if self.receiver is not None:
            self.receiver.close()
        self.collector.shutdown()
