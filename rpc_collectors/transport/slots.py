"""Slots: the preallocated buffers a worker writes its batches into and the trainer hands out.

A :class:`SlotPool` is one buffer of ``slots`` slots for one batch layout: in shared memory on
the trainer's host (a nameless file, see :mod:`rpc_collectors.transport.shm`; page-locked for a CUDA
storing device), or pinned memory that receives batches from other hosts. A worker maps it from
its :class:`SlotSpec` and writes with a :class:`SlotWriter`. Which slot is free, and when a
handed-out batch gives its slot back, is the pool's business; the module docstring of
:mod:`rpc_collectors.transport.data` tells the ownership rules.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.transport import shm
from rpc_collectors.transport.doorbell import Dial, Ends
from rpc_collectors.transport.layouts import BatchLayout, aligned

SLOTS = 3  # the batch being written, the one handed out, and the user's previous one


@dataclass(frozen=True)
class SlotSpec:
    """What a worker needs to map its buffer (or make its own), find its row in every slot and
    open its doorbell. ``fd`` None: a worker on another host, whose slots are its own memory."""

    pid: int
    fd: int | None
    layout: BatchLayout
    rows: int
    row: int
    slot_bytes: int
    doorbell: Ends | Dial
    slots: int = SLOTS

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


def tensors_by_key(target: TensorDictBase) -> dict[tuple, tuple[torch.Tensor, np.ndarray | None]]:
    """``{key tuple: (tensor, its numpy view, or None where numpy has no such dtype)}`` of the
    tensors of ``target`` (a slot's TensorDict of views): where a batch's entries go."""
    out = {}
    for key, tensor in target.items(include_nested=True, leaves_only=True):
        try:
            array = tensor.numpy()
        except TypeError:  # bfloat16 and the like
            array = None
        out[(key,) if isinstance(key, str) else key] = (tensor, array)
    return out


class SlotWriter:
    """Worker side: copy each batch into its row of the slot the trainer named."""

    def __init__(self, spec: SlotSpec) -> None:
        size = spec.slots * spec.slot_bytes
        if spec.fd is None:
            whole = torch.empty(size, dtype=torch.uint8)
        else:
            whole = torch.from_file(spec.path, shared=True, size=size, dtype=torch.uint8)
        self.slots = [whole[i * spec.slot_bytes:(i + 1) * spec.slot_bytes] for i in range(spec.slots)]
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
            if dest is None or type(value) is not torch.Tensor or value.shape != dest.shape or value.dtype != dest.dtype:
                return False
            pairs.append((dest, value))
        if len(pairs) != len(dests):
            return False
        for dest, value in pairs:
            if dest.data_ptr() != value.data_ptr():  # not already written there by the rollout
                dest.copy_(value)
        return True


def _pin(slot: torch.Tensor) -> None:
    """Page-lock ``slot``'s memory for CUDA, so that copies to a GPU read it by DMA."""
    error = int(torch.cuda.cudart().cudaHostRegister(slot.data_ptr(), slot.numel(), 0))
    if error != 0:
        raise RuntimeError(f"cudaHostRegister of a {slot.numel()}-byte batch slot failed with CUDA error {error}")


def _unpin(slot: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(slot.data_ptr())


def _use_count(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


class SlotPool:
    """Trainer side of one buffer: ``slots`` slots of ``rows`` batches each."""

    def __init__(
        self, layout: BatchLayout, rows: int, pinned: bool = False, shared: bool = True, slots: int = SLOTS,
    ) -> None:
        """``pinned``: page-lock the slots for copies to a CUDA device. ``shared``: in shared
        memory, for workers on this host; else this process's own, filled from the network.
        ``slots``: one more than ``SLOTS`` for each extra request in flight."""
        self.layout, self.rows, self.shared, self.num_slots = layout, rows, shared, slots
        self.slot_bytes = aligned(layout.size(rows), mmap.PAGESIZE)
        self.nbytes = slots * self.slot_bytes
        self.fd: int | None = None
        self._registered = False  # page-locked with cudaHostRegister by this pool
        if not shared:
            self.slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(slots)]
        else:
            self._map(pinned)
        self._lent: dict[int, tuple[torch.Tensor, int]] = {}  # slot -> storage handed out, its idle use count
        self._written: set[int] = set()  # asked for or written, not handed out yet
        self._round: set[int] = set()  # workers asked in the current round (rows > 1)
        self._slot: int | None = None
        self._last: dict[int, int | None] = {}  # worker id -> the slot it was last asked to write

    def _map(self, pinned: bool) -> None:
        """Make the shared-memory file and map each slot of it."""
        rows, layout = self.rows, self.layout
        per = f"{rows} x {layout.nbytes} bytes" if rows > 1 else f"{layout.nbytes} bytes"
        fd, _ = shm.nameless_file(
            "batches", self.nbytes, "the shared-memory batch buffer", f": {self.num_slots} slots of {per}",
            "lower frames_per_batch",
        )
        try:
            # one mapping (one torch storage) per slot, so each slot's users can be counted
            self.slots = [
                torch.frombuffer(mmap.mmap(fd, self.slot_bytes, offset=i * self.slot_bytes), dtype=torch.uint8)
                for i in range(self.num_slots)
            ]
            for i, slot in enumerate(self.slots if pinned else []):
                try:
                    _pin(slot)
                except BaseException:
                    for done in self.slots[:i]:
                        _unpin(done)
                    raise
        except BaseException:
            os.close(fd)
            raise
        self.fd, self._registered = fd, pinned

    def spec(self, row: int, doorbell: Ends | Dial) -> SlotSpec:
        return SlotSpec(os.getpid(), self.fd, self.layout, self.rows, row, self.slot_bytes, doorbell, self.num_slots)

    def memory(self, slot: int) -> memoryview:
        """The bytes of ``slot``, where a batch from another host is received."""
        return memoryview(self.slots[slot].numpy())

    def release_fd(self) -> None:
        """Every worker has mapped the buffer: the trainer's fd is no longer needed."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Let go of the descriptor and of the page lock; the memory goes with the last view of it."""
        self.release_fd()
        if self._registered:
            self._registered = False
            for slot in self.slots:
                _unpin(slot)

    def _free(self, slot: int) -> bool:
        return slot not in self._written and not self._in_use(slot)

    def _in_use(self, slot: int) -> bool:
        """Whether the batch last handed out from ``slot`` is still referenced and still in its memory."""
        if slot not in self._lent:
            return False
        lent, idle = self._lent[slot]
        if lent.data_ptr() == self.slots[slot].data_ptr() and _use_count(lent) > idle:
            return True
        del self._lent[slot]
        return False

    def slot_for(self, worker_id: int, again: bool = False) -> int | None:
        """The slot ``worker_id`` writes its next batch into; a round's workers share one.

        ``hand_out`` always leaves a slot free; None (the batch comes as an RPC result) only if
        something took a slot's memory some other way. ``again``: the slot of the last request,
        for a replacement that redoes the batch of a worker that failed.
        """
        if again and worker_id in self._last:
            return self._last[worker_id]
        if self.rows == 1 or worker_id in self._round or not self._round:
            self._round.clear()
            self._slot = next((s for s in range(self.num_slots) if self._free(s)), None)
            if self._slot is not None:
                self._written.add(self._slot)
        self._round.add(worker_id)
        self._last[worker_id] = self._slot
        return self._slot

    def hand_out(self, slot: int) -> TensorDict:
        """The batch in ``slot`` for the user: the slot's memory, under a storage of the user's
        own, while another slot stays free; else a copy."""
        self._written.discard(slot)
        rows = None if self.rows == 1 else self.rows
        if not any(self._free(s) for s in range(self.num_slots) if s != slot):
            return self.layout.view(self.slots[slot], rows).clone()
        if not self._in_use(slot):  # else a round's rows, handed out one by one from one storage
            lent = torch.frombuffer(self.slots[slot].numpy(), dtype=torch.uint8)  # same memory, new storage
            self._lent[slot] = (lent, _use_count(lent))
        return self.layout.view(self._lent[slot][0], rows)
