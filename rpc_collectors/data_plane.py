"""The data plane: how a batch gets from a collector server on the trainer's host to the trainer.

A worker's first batch travels as an RPC result. From its layout (keys, shapes, dtypes) the
trainer allocates a shared-memory buffer of ``SLOTS`` slots and the worker maps it. From then
on the trainer asks for "your next batch, into slot s" by the worker's doorbell (a pipe, see
:mod:`rpc_collectors.doorbell`); the worker collects, copies the batch into the slot and
answers with a small :class:`Ready`, and only then does the trainer read the slot. A worker
that dies while writing never answers, so a partly written slot is never read. A batch that
does not fit the layout (an env whose keys change) comes back pickled instead, and all
batches of workers on other hosts travel as RPC results.

Sync collectors whose workers all share the trainer's host and one layout get one buffer
whose slots hold a whole round: worker i writes row i of every tensor, so the ``[N, (B,) T]``
batch is assembled where the workers wrote it. Otherwise each worker has its own buffer.

Ownership. A yielded batch belongs to the user and is never written behind their back:

* the trainer hands out the slot itself (no copy) only while another slot of the same buffer
  is free for the worker's next batch; a slot is free when nothing references its memory any
  more (the storage's use count is back to the trainer's own), so a batch the user still
  holds, or any view of it, keeps its slot out of use;
* otherwise (the user keeps their batches: a list, a replay buffer storing references) it
  copies the slot into fresh tensors, at memory speed, and the slot is free at once.

So a loop that drops each batch before the next gets every batch without a copy, one that
keeps them gets copies, and the memory stays ``SLOTS`` x batch bytes per buffer either way.

Device. Workers hand over batches in host memory; the trainer puts them on its storing device.
For a CUDA storing device the slots are page-locked (``cudaHostRegister``), so a batch is
copied from the slot the workers wrote straight into GPU memory by DMA, with no stop in
pageable memory; that copy is the user's batch, so slots are never lent out to the user. Batches
from other hosts arrive in TensorPipe's pageable buffers and are copied from there.

The buffer is a file in /dev/shm whose name is removed right after it is created: workers map
it through ``/proc/<trainer pid>/fd/<fd>`` while the trainer holds it open, and the memory goes
away with the last process that maps it, so no process killed at any moment leaves a file
behind. Its space is reserved up front (``posix_fallocate``): a batch larger than the free
space of /dev/shm is an ``OSError`` naming both sizes, never a SIGBUS in a worker later.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase

from . import shm
from .doorbell import Doorbell, Ends, Ready

SLOTS = 3  # the batch being written, the one handed out, and the user's previous one
ALIGN = 64  # bytes; every tensor starts on a cache line (and on its dtype's alignment)
MIN_BYTES = 64 * 1024  # smaller batches go as RPC results: a slot saves nothing at that size


def _aligned(nbytes: int, to: int = ALIGN) -> int:
    return -(-nbytes // to) * to


@dataclass(frozen=True)
class Leaf:
    """One tensor of a batch: its key, shape, dtype and size in bytes."""

    key: tuple
    shape: tuple
    dtype: torch.dtype
    nbytes: int


@dataclass(frozen=True)
class BatchLayout:
    """The tensors of one batch (keys, shapes, dtypes), and how ``rows`` batches lie in a flat buffer."""

    batch_size: tuple
    names: tuple
    leaves: tuple

    @classmethod
    def of(cls, batch: TensorDictBase) -> "BatchLayout | None":
        """The layout of ``batch``; None if it cannot go through shared memory."""
        leaves = []
        for key, value in batch.items(include_nested=True, leaves_only=True):
            if type(value) is not torch.Tensor or value.device.type != "cpu":
                return None
            key = key if isinstance(key, tuple) else (key,)
            if len(key) > 1 and batch.get(key[:-1]).batch_size != batch.batch_size:
                return None
            leaves.append(Leaf(key, tuple(value.shape), value.dtype, value.numel() * value.element_size()))
        names = tuple(batch.names) if batch._has_names() else ()
        return cls(tuple(batch.batch_size), names, tuple(leaves))

    @property
    def nbytes(self) -> int:
        """Bytes of one batch's tensors."""
        return sum(leaf.nbytes for leaf in self.leaves)

    def size(self, rows: int) -> int:
        """Bytes of a slot holding ``rows`` batches (each tensor's rows contiguous, aligned)."""
        return sum(_aligned(leaf.nbytes * rows) for leaf in self.leaves)

    def signature(self) -> dict:
        """``{key: (shape, dtype)}``, as :func:`signature_of` gives for a batch of this layout."""
        return {leaf.key: (leaf.shape, leaf.dtype) for leaf in self.leaves}

    def view(self, slot: torch.Tensor, rows: int | None) -> TensorDict:
        """A TensorDict of views into ``slot`` (flat uint8): ``[rows, *batch_size]``, or one batch if rows is None."""
        lead = () if rows is None else (rows,)
        td = TensorDict(batch_size=(*lead, *self.batch_size))
        offset = 0
        for leaf in self.leaves:
            nbytes = leaf.nbytes * (rows or 1)
            td.set(leaf.key, slot[offset:offset + nbytes].view(leaf.dtype).view(*lead, *leaf.shape))
            offset += _aligned(nbytes)
        if self.names:
            td.names = [None] * len(lead) + list(self.names)
        return td


def signature_of(batch: TensorDictBase) -> dict:
    """``{key: (shape, dtype)}`` of every tensor of ``batch`` (empty if it holds non-tensors)."""
    out = {}
    for key, value in batch.items(include_nested=True, leaves_only=True):
        if type(value) is not torch.Tensor:
            return {}
        out[key if isinstance(key, tuple) else (key,)] = (tuple(value.shape), value.dtype)
    return out


@dataclass(frozen=True)
class SlotSpec:
    """What a worker needs to map its buffer, find its row in every slot and open its doorbell."""

    pid: int
    fd: int
    layout: BatchLayout
    rows: int
    row: int
    slot_bytes: int
    doorbell: Ends

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


class SlotWriter:
    """Worker side: copy each batch into its row of the slot the trainer named."""

    def __init__(self, spec: SlotSpec) -> None:
        size = SLOTS * spec.slot_bytes
        whole = torch.from_file(spec.path, shared=True, size=size, dtype=torch.uint8)
        self.targets = [
            spec.layout.view(whole[i * spec.slot_bytes:(i + 1) * spec.slot_bytes], spec.rows)[spec.row]
            for i in range(SLOTS)
        ]
        self.signature = spec.layout.signature()

    def write(self, slot: int, batch: TensorDictBase) -> bool:
        """Copy ``batch`` into ``slot``; False (nothing written) if it does not fit the layout."""
        if signature_of(batch) != self.signature:
            return False
        target = self.targets[slot]
        for key, value in batch.items(include_nested=True, leaves_only=True):
            dest = target.get(key)
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
    """Trainer side of one shared buffer: ``SLOTS`` slots of ``rows`` batches each."""

    def __init__(self, layout: BatchLayout, rows: int, pinned: bool = False) -> None:
        """``pinned``: page-lock the slots for copies to a CUDA device."""
        self.layout, self.rows, self.pinned = layout, rows, pinned
        self.slot_bytes = _aligned(layout.size(rows), mmap.PAGESIZE)
        self.nbytes = SLOTS * self.slot_bytes
        per = f"{rows} x {layout.nbytes} bytes" if rows > 1 else f"{layout.nbytes} bytes"
        fd, _ = shm.nameless_file(
            "batches", self.nbytes, "the shared-memory batch buffer", f": {SLOTS} slots of {per}",
            "lower frames_per_batch",
        )
        try:
            # one mapping (one torch storage) per slot, so each slot's users can be counted
            self.slots = [
                torch.frombuffer(mmap.mmap(fd, self.slot_bytes, offset=i * self.slot_bytes), dtype=torch.uint8)
                for i in range(SLOTS)
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
        self.fd: int | None = fd
        self._idle = [_use_count(slot) for slot in self.slots]  # the trainer's own references
        self._written: set[int] = set()  # asked for or written, not handed out yet
        self._round: set[int] = set()  # workers asked in the current round (rows > 1)
        self._slot: int | None = None
        self._last: dict[int, int | None] = {}  # worker id -> the slot it was last asked to write

    def spec(self, row: int, doorbell: Ends) -> SlotSpec:
        return SlotSpec(os.getpid(), self.fd, self.layout, self.rows, row, self.slot_bytes, doorbell)

    def release_fd(self) -> None:
        """Every worker has mapped the buffer: the trainer's fd is no longer needed."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Let go of the descriptor and of the page lock; the memory goes with the last view of it."""
        self.release_fd()
        if self.pinned:
            self.pinned = False
            for slot in self.slots:
                _unpin(slot)

    def _free(self, slot: int) -> bool:
        return slot not in self._written and _use_count(self.slots[slot]) == self._idle[slot]

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
            self._slot = next((s for s in range(SLOTS) if self._free(s)), None)
            if self._slot is not None:
                self._written.add(self._slot)
        self._round.add(worker_id)
        self._last[worker_id] = self._slot
        return self._slot

    def hand_out(self, slot: int) -> TensorDict:
        """The batch in ``slot`` for the user: the slot itself while another one stays free, else a copy."""
        self._written.discard(slot)
        batch = self.layout.view(self.slots[slot], None if self.rows == 1 else self.rows)
        if any(self._free(s) for s in range(SLOTS) if s != slot):
            return batch
        return batch.clone()


class BatchPlane:
    """Trainer side, all workers: which path each worker's batches take, and handing them out.

    ``local[i]`` says whether worker i shares the trainer's host; ``join(i, spec)`` asks worker
    i to map its buffer and returns whether it could. ``sync`` collectors get one round buffer
    when every worker is local and their batches share one layout. A worker with a buffer is
    asked for batches through its :class:`~rpc_collectors.doorbell.Doorbell` (:meth:`ring`).
    Batches end up on ``device`` (:meth:`place`).
    """

    def __init__(
        self, local: list[bool], join: Callable[[int, SlotSpec], bool], sync: bool, keep_fds: bool = False,
        device: torch.device | None = None,
    ) -> None:
        """``keep_fds``: keep each buffer's descriptor, so that a replaced worker can map it (:meth:`rejoin`)."""
        self.device = None if device is None or device.type == "cpu" else device
        self._pinned = self.device is not None and self.device.type == "cuda"
        self.local = list(local)
        self._join = join
        self._sync = sync
        self._keep_fds = keep_fds
        self.pools: dict[int, SlotPool] = {}
        self._round: SlotPool | None = None
        self._rows: dict[int, int] = {}
        self._bells: dict[int, Doorbell] = {}

    @property
    def buffers(self) -> list[SlotPool]:
        """Each shared-memory buffer once (a sync round buffer serves every worker)."""
        return list({id(pool): pool for pool in self.pools.values()}.values())

    @property
    def shared_bytes(self) -> int:
        """Total size of the shared-memory buffers (slots x workers x batch bytes, page-rounded)."""
        return sum(pool.nbytes for pool in self.buffers)

    def path_of(self, worker_id: int) -> str:
        """``"shm"`` or ``"rpc"``: how worker ``worker_id``'s batches reach the trainer now."""
        return "shm" if worker_id in self.pools else "rpc"

    def slot_for(self, worker_id: int, again: bool = False) -> int | None:
        """The slot to ask ``worker_id`` to write its next batch into (None: as an RPC result)."""
        pool = self.pools.get(worker_id)
        return None if pool is None else pool.slot_for(worker_id, again)

    def ring(self, worker_id: int, min_version: int, slot: int | None) -> torch.futures.Future | None:
        """Ask ``worker_id`` for its next batch in ``slot`` by its doorbell (None: ask by RPC)."""
        bell = self._bells.get(worker_id)
        return None if bell is None or slot is None else bell.ring(slot, min_version)

    def rejoin(self, worker_id: int) -> None:
        """Map ``worker_id``'s buffer in the process that replaced it."""
        pool = self.pools.get(worker_id)
        if pool is not None and not self._join_one(worker_id, pool, self._rows.get(worker_id, 0)):
            raise RuntimeError(f"the replacement of collector worker {worker_id} cannot map the shared batch buffer")

    def _join_one(self, worker_id: int, pool: SlotPool, row: int) -> bool:
        """Ask ``worker_id`` to map ``pool`` and open a new doorbell; whether it could."""
        bell = Doorbell()
        try:
            joined = self._join(worker_id, pool.spec(row, bell.ends))
        except BaseException:
            bell.close()
            raise
        if not joined:
            bell.close()
            return False
        bell.opened()
        old = self._bells.pop(worker_id, None)
        if old is not None:
            old.close()
        self._bells[worker_id] = bell
        return True

    def receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch a worker's answer stands for; a first local batch sets up the worker's buffer."""
        if isinstance(result, Ready):
            pool = self.pools[worker_id]
            if pool is self._round:  # a round with a batch that did not fit: this worker's row
                return pool.hand_out(result.slot)[self._rows[worker_id]]
            return pool.hand_out(result.slot)
        if self.local[worker_id]:
            self.local[worker_id] = False  # one attempt per worker
            layout = BatchLayout.of(result)
            if layout is not None and layout.nbytes >= MIN_BYTES:
                self._set_up(SlotPool(layout, 1, self._pinned), [worker_id])
        return result

    def round(self, results: list) -> TensorDict | None:
        """A sync round ``[N, (B,) T]`` where the workers wrote it, or None if it is not in one buffer.

        The first round (RPC results) sets the round buffer up when it can.
        """
        if self._round is not None and all(isinstance(r, Ready) for r in results):
            return self._round.hand_out(results[0].slot)
        if self._sync and all(self.local):
            self._sync = False  # one attempt
            layouts = {BatchLayout.of(r) if isinstance(r, TensorDictBase) else None for r in results}
            layout = layouts.pop() if len(layouts) == 1 else None
            if layout is not None and layout.nbytes >= MIN_BYTES:
                self.local = [False] * len(results)
                self._round = SlotPool(layout, len(results), self._pinned)
                self._set_up(self._round, list(range(len(results))))
        return None

    def place(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` on the trainer's storing device (a copy, read from pinned slots by DMA)."""
        if self.device is None:
            return batch
        placed = batch.to(self.device, non_blocking=True)
        if self.device.type == "cuda":  # the copies must be done before a worker rewrites the slot
            torch.cuda.current_stream(self.device).synchronize()
        return placed

    def _set_up(self, pool: SlotPool, worker_ids: list[int]) -> None:
        joined = [False]  # until every worker answered
        try:
            joined = [self._join_one(i, pool, row) for row, i in enumerate(worker_ids)]
        finally:
            if not all(joined):
                for i in worker_ids:
                    if i in self._bells:
                        self._bells.pop(i).close()
                pool.close()
                if pool is self._round:
                    self._round = None
            elif not self._keep_fds:
                pool.release_fd()
        if all(joined):
            self.pools.update({i: pool for i in worker_ids})
            self._rows.update({i: row for row, i in enumerate(worker_ids)})

    def close(self) -> None:
        """Forget the buffers; their memory goes with the last batch or view that uses it."""
        for bell in self._bells.values():
            bell.close()
        self._bells.clear()
        for pool in self.buffers:
            pool.close()
        self.pools.clear()
        self._round = None
