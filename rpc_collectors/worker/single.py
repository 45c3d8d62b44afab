"""A plain worker's collector: the single-process ``Collector``, with what its server asks of it.

:class:`SingleCollector` meets :class:`~rpc_collectors.worker.served_collector.ServedCollector`
for a :class:`~rpc_collectors.single_process.collector.Collector`: its batches keep their weights
versions for the trainer to read, its steps go straight into the trainer's shared-memory slot,
its rollout's phase clock is the one the server marks and opens a trace window on, and its state
counts the trajectory ids a replacement starts above. A worker's batches, whatever its collector,
are written into the trainer's slot by :class:`SlotWriter`.
"""
from __future__ import annotations

import contextlib
import os
import socket
from collections import deque
from typing import Any

import torch
from tensordict import TensorDictBase

from rpc_collectors.core.protocol import ProcessSpans
from rpc_collectors.single_process import step_count
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.single_process.phase_clock import PhaseClock, StoppedClock
from rpc_collectors.single_process.preemption import Preemption
from rpc_collectors.transport.data import SlotSpec, tensors_by_key
from rpc_collectors.transport.factory_weights import signature_of

# the row of a worker's phases in the timeline
THREAD = "rollout"


class SlotWriter:
    """Worker side: copy each batch into its row of the slot the trainer named."""

    def __init__(self, spec: SlotSpec) -> None:
        size = spec.slots * spec.slot_bytes
        if spec.fd is None:
            whole = torch.empty(size, dtype=torch.uint8)
        else:
            whole = torch.from_file(f"/proc/{spec.pid}/fd/{spec.fd}", shared=True, size=size,
                                    dtype=torch.uint8)
        self.slots = [whole[i * spec.slot_bytes:(i + 1) * spec.slot_bytes]
                      for i in range(spec.slots)]
        self.targets = [spec.layout.view(slot, spec.rows)[spec.row] for slot in self.slots]
        self.tensors = [tensors_by_key(target) for target in self.targets]

    def memory(self, slot: int) -> memoryview:
        """The bytes of ``slot``, as sent to a trainer on another host."""
        return memoryview(self.slots[slot].numpy())

    def write(self, slot: int, batch: TensorDictBase) -> bool:
        """Copy ``batch`` into ``slot``; False (nothing written) if it does not fit the layout."""
        dests, pairs = self.tensors[slot], []
        for key, value in batch.items(include_nested=True, leaves_only=True):
            dest, _ = dests.get(key if isinstance(key, tuple) else (key,), (None, None))
            fits = dest is not None and type(value) is torch.Tensor
            if not fits or value.shape != dest.shape or value.dtype != dest.dtype:
                return False
            pairs.append((dest, value))
        if len(pairs) != len(dests):
            return False
        for dest, value in pairs:
            # not already written there by the rollout
            if dest.data_ptr() != value.data_ptr():
                dest.copy_(value)
        return True


class SingleCollector(Collector):
    """A plain worker's ``Collector``: worker ``worker_id`` of the trainer's;
    ``preemption`` (None: not preemptible) numbers the batches it is asked for and ends one
    early when the trainer says so."""

    # the trainer reads each batch's versions from it, counts and records its batches
    keep_version_key, counts_progress, records_batches = True, False, False
    # weights land between its batches: nothing to hold
    weights_lock = contextlib.nullcontext()
    # each request is its own (worker.node_credits)
    credits = None

    def __init__(self, create_env_fn: Any, policy: Any, worker_id: int,
                 preemption: Preemption | None, **kwargs: Any) -> None:
        super().__init__(create_env_fn, policy, **kwargs)
        # a local worker's steps count where its pool reads them
        shared = step_count.process_word()
        if shared is not None:
            self.rollout.counted = shared
        # TorchRL's attribute: which worker this is
        self.worker_idx = worker_id
        self.preemption = preemption

    @property
    def phase_clock(self) -> PhaseClock:
        """Its rollout's phase clock (a :class:`StoppedClock` with ``metrics=False``
        and no trace window)."""
        return self.rollout.clock

    def worker_info(self) -> dict:
        """Its number of envs."""
        return {"envs": int(torch.Size(self.env.batch_size).numel())}

    def weights_signature(self) -> tuple:
        """What its policy holds (empty: no weights)."""
        return signature_of(self.weights_holder(()))

    def weights_holder(self, signature: tuple) -> Any:
        """Its policy's module, whatever ``signature`` (None: no policy, or one without weights)."""
        return self.policy.module if self.policy is not None else None

    def write_into(self, tensors: dict) -> None:
        """The next batches' steps go straight into ``tensors`` (a slot's, by
        key; empty: their own)."""
        self.rollout.out = tensors

    def returned(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch``, as it is."""
        return batch

    def noted(self, answer: Any) -> Any:
        """``answer``, as it is: a single collector has nothing to tell with it."""
        return answer

    def trace(self, keep: int | None) -> list[ProcessSpans] | None:
        """Open a window on its phase clock keeping at most ``keep`` spans, or close
        it (None): its spans."""
        rollout = self.rollout
        if keep is not None:
            # metrics=False: a clock of the window's own
            if isinstance(rollout.clock, StoppedClock):
                rollout.clock = PhaseClock()
            rollout.clock.spans = deque(maxlen=keep)
            return None
        clock = rollout.clock
        spans, clock.spans = clock.spans, None
        if not self._meter.on:
            rollout.clock = StoppedClock()
        return [ProcessSpans((), socket.gethostname(), os.getpid(), {THREAD: list(spans or ())})]

    def state_dict(self, skipped: int = 0) -> dict:
        """``Collector.state_dict`` with ``skipped`` added to its trajectory count: a worker resumed
        from its first ids continues above every id this one used."""
        state = super().state_dict()
        state["traj_count"] += skipped
        return state

    def cut(self, batch: int | None = None) -> None:
        """``Collector.cut``: whichever of its batches the trainer dropped, its
        trajectories in progress end."""
        super().cut()
