"""The data plane: how a batch gets from a collector server on the trainer's host to the trainer.

A worker's first batch travels as an RPC result. From its layout (keys, shapes, dtypes) the
trainer then allocates that worker's shared-memory buffer of ``SLOTS`` slots, each one batch,
and the worker maps it. From then on the trainer asks for "your next batch, into slot s"; the
worker collects, copies the batch into the slot and answers with a small :class:`Ready`, and
only then does the trainer read the slot. A worker that dies while writing never answers, so
a partly written slot is never read. A batch that does not fit the layout (an env whose keys
change, tensors on a GPU) travels as an RPC result, as do all batches of workers on other hosts.

Ownership: the trainer copies a slot into fresh tensors (one copy at memory speed; a sync
``stack`` copies every worker's slot straight into its row of the stacked batch) before it
asks the worker for anything that could overwrite it. So a yielded batch belongs to the user:
kept in a list or a replay buffer, it is never written behind their back. Two slots per worker
let a worker write its next batch while the trainer still copies the previous one.

The buffer is a file in /dev/shm whose name is removed right after it is created: workers map
it through ``/proc/<trainer pid>/fd/<fd>`` while the trainer holds it open, and the memory goes
away with the last process that maps it, so no process killed at any moment leaves a file
behind. Its space is reserved up front (``posix_fallocate``): a batch larger than the free
space of /dev/shm is an ``OSError`` naming both sizes, never a SIGBUS in a worker later.
"""
from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase

SLOTS = 2
ALIGN = 64  # bytes; every leaf starts on a cache line (and on its dtype's alignment)
MIN_BYTES = 64 * 1024  # smaller batches go as RPC results: a slot saves nothing at that size


@dataclass(frozen=True)
class Ready:
    """A worker's answer: its batch is in ``slot`` of its shared buffer."""

    slot: int


@dataclass(frozen=True)
class Leaf:
    key: tuple
    shape: tuple
    dtype: torch.dtype
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BatchLayout:
    """Where every tensor of a batch lies in one slot of a flat byte buffer."""

    batch_size: tuple
    names: tuple
    leaves: tuple
    nbytes: int

    @classmethod
    def of(cls, batch: TensorDictBase) -> "BatchLayout | None":
        """The layout of ``batch``; None if it cannot go through shared memory."""
        leaves, offset = [], 0
        for key, value in batch.items(include_nested=True, leaves_only=True):
            if type(value) is not torch.Tensor or value.device.type != "cpu":
                return None
            key = key if isinstance(key, tuple) else (key,)
            parent = batch.get(key[:-1]) if len(key) > 1 else batch
            if parent.batch_size != batch.batch_size:
                return None
            nbytes = value.numel() * value.element_size()
            leaves.append(Leaf(key, tuple(value.shape), value.dtype, offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        names = tuple(batch.names) if batch._has_names() else ()
        return cls(tuple(batch.batch_size), names, tuple(leaves), offset)

    def signature(self) -> dict:
        return {leaf.key: (leaf.shape, leaf.dtype) for leaf in self.leaves}

    def view(self, slot: torch.Tensor) -> TensorDict:
        """A TensorDict whose tensors are views into ``slot`` (a flat uint8 tensor)."""
        td = TensorDict(batch_size=self.batch_size)
        for leaf in self.leaves:
            flat = slot[leaf.offset:leaf.offset + leaf.nbytes]
            td.set(leaf.key, flat.view(leaf.dtype).view(leaf.shape))
        if self.names:
            td.names = list(self.names)
        return td


def signature_of(batch: TensorDictBase) -> dict:
    out = {}
    for key, value in batch.items(include_nested=True, leaves_only=True):
        if type(value) is not torch.Tensor:
            return {}
        out[key if isinstance(key, tuple) else (key,)] = (tuple(value.shape), value.dtype)
    return out


@dataclass(frozen=True)
class SlotSpec:
    """What a worker needs to map its buffer: the trainer's pid and fd, and the layout."""

    pid: int
    fd: int
    layout: BatchLayout

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


def shm_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _map(path: str, layout: BatchLayout) -> list[TensorDict]:
    whole = torch.from_file(path, shared=True, size=SLOTS * layout.nbytes, dtype=torch.uint8)
    return [layout.view(whole[i * layout.nbytes:(i + 1) * layout.nbytes]) for i in range(SLOTS)]


class SlotWriter:
    """Worker side: copy each batch into the slot the trainer named."""

    def __init__(self, spec: SlotSpec) -> None:
        self.slots = _map(spec.path, spec.layout)
        self.signature = spec.layout.signature()

    def write(self, slot: int, batch: TensorDictBase) -> bool:
        """Copy ``batch`` into ``slot``; False (nothing written) if it does not fit the layout."""
        if signature_of(batch) != self.signature:
            return False
        target = self.slots[slot]
        for key, value in batch.items(include_nested=True, leaves_only=True):
            target.get(key).copy_(value)
        return True


class WorkerSlots:
    """Trainer side, one worker: its mapped buffer and the next slot to ask for."""

    def __init__(self, layout: BatchLayout, directory: str) -> None:
        need = SLOTS * layout.nbytes
        free = _free_bytes(directory)
        if need > free:
            raise _no_space(need, free, layout, directory)
        fd, path = tempfile.mkstemp(prefix="rpc_collectors_batches_", dir=directory)
        os.unlink(path)  # the memory lives on through the fd and the mappings
        try:
            try:
                os.posix_fallocate(fd, 0, need)
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                raise _no_space(need, _free_bytes(directory), layout, directory) from err
            self.fd: int | None = fd
            self.layout = layout
            self.nbytes = need
            self.slots = _map(f"/proc/self/fd/{fd}", layout)
        except BaseException:
            os.close(fd)
            raise
        self.spec = SlotSpec(os.getpid(), fd, layout)
        self.next = 0

    def take(self) -> int:
        """The slot for the next request (alternating, so the previous one can still be read)."""
        slot, self.next = self.next, (self.next + 1) % SLOTS
        return slot

    def read(self, slot: int) -> TensorDict:
        """A copy of the batch in ``slot``: fresh tensors the user owns."""
        return self.slots[slot].clone()

    def release_fd(self) -> None:
        """The worker has mapped the buffer: the trainer's fd is no longer needed."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _no_space(need: int, free: int, layout: BatchLayout, directory: str) -> OSError:
    return OSError(
        errno.ENOSPC,
        f"the shared-memory batch buffer of one worker needs {_mib(need)} ({need} bytes: {SLOTS} slots x "
        f"{layout.nbytes} bytes per batch) but {directory} has only {_mib(free)} ({free} bytes) free; "
        "lower frames_per_batch, or give the machine more shared memory (docker: --shm-size)",
    )


class BatchPlane:
    """Trainer side, all workers: which path each worker's batches take, and reading them back.

    ``local[i]`` says whether worker i shares the trainer's host; ``join(i, spec)`` asks worker
    i to map its buffer and returns whether it could.
    """

    def __init__(self, local: list[bool], join: Callable[[int, SlotSpec], bool]) -> None:
        self.local = list(local)
        self._join = join
        self.buffers: dict[int, WorkerSlots] = {}
        self.directory = shm_directory()

    @property
    def shared_bytes(self) -> int:
        """Total size of the shared-memory buffers (slots x workers x batch bytes at most)."""
        return sum(b.nbytes for b in self.buffers.values())

    def path_of(self, worker_id: int) -> str:
        """``"shm"`` or ``"rpc"``: how worker ``worker_id``'s batches reach the trainer now."""
        return "shm" if worker_id in self.buffers else "rpc"

    def slot_for(self, worker_id: int) -> int | None:
        """The slot to ask worker ``worker_id`` to write its next batch into (None: as an RPC result)."""
        buffers = self.buffers.get(worker_id)
        return None if buffers is None else buffers.take()

    def receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch a worker's answer stands for; a first local batch sets the worker's buffer up."""
        if isinstance(result, Ready):
            return self.buffers[worker_id].read(result.slot)
        if self.local[worker_id]:
            self.local[worker_id] = False  # one attempt per worker
            self._set_up(worker_id, result)
        return result

    def stack(self, results: list) -> TensorDict | None:
        """Every worker's slot copied straight into its row of one stacked batch, or None if
        the results are not all in shared memory with one layout."""
        if not all(isinstance(r, Ready) for r in results):
            return None
        buffers = [self.buffers[i] for i in range(len(results))]
        if any(b.layout != buffers[0].layout for b in buffers[1:]):
            return None
        return torch.stack([b.slots[r.slot] for b, r in zip(buffers, results)], 0)

    def _set_up(self, worker_id: int, batch: TensorDictBase) -> None:
        layout = BatchLayout.of(batch)
        if layout is None or layout.nbytes < MIN_BYTES:
            return
        buffers = WorkerSlots(layout, self.directory)
        try:
            if self._join(worker_id, buffers.spec):
                self.buffers[worker_id] = buffers
        finally:
            buffers.release_fd()

    def close(self) -> None:
        self.buffers.clear()
