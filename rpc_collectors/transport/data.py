"""The data plane: how a batch gets from a collector server to the trainer's memory.

A worker's first batch travels as an RPC result. From its layout (keys, shapes, dtypes) the trainer
allocates a buffer of ``SLOTS`` slots for it (a :class:`SlotPool`, which the worker maps from its
:class:`SlotSpec` and writes with a :class:`~rpc_collectors.worker.single.SlotWriter`). From then on
the trainer asks for "your next batch, into slot s" by the worker's doorbell
(:mod:`~rpc_collectors.transport.doorbell`), and only once the batch is in slot s does the request
complete: a worker on the trainer's host writes the batch into the shared buffer and answers with a
small :class:`~rpc_collectors.core.protocol.Ready` through a pipe; a worker on another host writes
into slots of its own and sends the slot's bytes after its "ready" over TCP, straight into slot s. A
worker that dies while writing or sending never completes its request, so a partly written slot is
never read. A batch that does not fit the layout (an env whose keys change) comes back pickled
instead. Small batches take slots too: a slot's "ready" costs the trainer about half the CPU of
unpickling the same batch as an RPC result, even for one frame. Sync collectors whose workers all
share the trainer's host and one layout get one buffer whose slots hold a whole round: worker i
writes row i of every tensor, so the ``[N, (B,) T]`` batch is assembled where the workers wrote it.
Otherwise each worker has its own buffer.

Ownership. A yielded batch belongs to the user and is never written behind their back:

* the trainer hands out the slot's memory (no copy) only while another slot of the same buffer is
  free for the worker's next batch. Each hand-out is a torch storage of its own over the slot, so
  what the user does to it (``share_memory_()`` moves it to new memory) never moves the trainer's
  view of the slot. A slot is free again when nothing references that storage any more (its use
  count is back to the trainer's own), or when it no longer uses the slot's memory; so a batch the
  user still holds, or any view of it, keeps its slot out of use;
* otherwise (the user keeps their batches: a list, a replay buffer storing references) it copies the
  slot into fresh tensors, at memory speed, and the slot is free at once.

So a loop that drops each batch before the next gets every batch without a copy, one that keeps them
gets copies, and the memory stays ``SLOTS`` x batch bytes per buffer either way (one slot more for
each extra request in flight, see :class:`BatchPlane`).

Device. Workers hand over batches in host memory; the trainer puts them on its storing device. For a
CUDA storing device the slots are page-locked, so a batch is copied from the slot straight into GPU
memory by DMA; that copy is the user's batch, so slots are never lent out to the user. A shared
buffer is a nameless file in /dev/shm (:mod:`~rpc_collectors.transport.shm`): no process killed at
any moment leaves a file behind, and a batch larger than the free space of /dev/shm is an
``OSError`` naming both sizes, never a SIGBUS in a worker later.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.core.protocol import Ready
from rpc_collectors.transport import shm
from rpc_collectors.transport.doorbell import Dial, Ends
from rpc_collectors.transport.layouts import BatchLayout, aligned
from rpc_collectors.transport.slot_joins import Joins

# requests a pipelined worker has at once: its next is asked for while the trainer takes in its last
IN_FLIGHT = 2
# seconds at most for a worker on another host to connect its doorbell
CONNECT_TIMEOUT = 10.0
# smaller batches go as RPC results (0: none; raised to compare the two paths)
MIN_BYTES = 0
# the batch being written, the one handed out, and the user's previous one
SLOTS = 3


@dataclass(frozen=True)
class SlotSpec:
    """What a worker needs to map its buffer (or make its own), find its row in every slot and open
    its doorbell. ``fd`` None: a worker on another host, whose slots are its own memory."""

    pid: int
    fd: int | None
    layout: BatchLayout
    rows: int
    row: int
    slot_bytes: int
    doorbell: Ends | Dial
    slots: int = SLOTS


def tensors_by_key(target: TensorDictBase) -> dict[tuple, tuple[torch.Tensor, np.ndarray | None]]:
    """``{key tuple: (tensor, its numpy view, or None where numpy has no such dtype)}`` of the
    tensors of ``target`` (a slot's TensorDict of views): where a batch's entries go."""
    out = {}
    for key, tensor in target.items(include_nested=True, leaves_only=True):
        try:
            array = tensor.numpy()
        except TypeError:
            # bfloat16 and the like
            array = None
        out[(key,) if isinstance(key, str) else key] = (tensor, array)
    return out


def _use_count(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


class SlotPool:
    """Trainer side of one buffer: ``slots`` slots of ``rows`` batches each.

    ``_registered``: page-locked with cudaHostRegister by this pool. ``_lent``: slot -> storage
    handed out, its idle use count. ``_written``: slots asked for or written, not handed out yet.
    ``_round``: workers asked in the current round (rows > 1). ``_asked``: worker id -> the slots
    of its requests not handed out, oldest first."""

    def __init__(
        self, layout: BatchLayout, rows: int, pinned: bool = False, shared: bool = True,
        slots: int = SLOTS,
    ) -> None:
        """``pinned``: page-locked for copies to a CUDA device. ``shared``: in shared memory, for
        workers on this host; else this process's own, filled from the network. ``slots``: one more
        per extra request in flight."""
        self.layout, self.rows, self.shared, self.num_slots = layout, rows, shared, slots
        self.slot_bytes = aligned(layout.size(rows), mmap.PAGESIZE)
        self.nbytes = slots * self.slot_bytes
        self.fd: int | None = None
        self._registered = False
        if not shared:
            self.slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, pin_memory=pinned)
                          for _ in range(slots)]
        else:
            self._map(pinned)
        self._lent: dict[int, tuple[torch.Tensor, int]] = {}
        self._written: set[int] = set()
        self._round: set[int] = set()
        self._slot: int | None = None
        self._asked: dict[int, list[int]] = {}

    def _map(self, pinned: bool) -> None:
        """Make the shared-memory file and map each slot of it."""
        rows, layout = self.rows, self.layout
        per = f"{rows} x {layout.nbytes} bytes" if rows > 1 else f"{layout.nbytes} bytes"
        fd, _ = shm.nameless_file(
            "batches", self.nbytes, "the shared-memory batch buffer",
            f": {self.num_slots} slots of {per}", "lower frames_per_batch",
        )
        try:
            self.slots = shm.mapped(fd, self.num_slots, self.slot_bytes, pinned)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self._registered = fd, pinned

    def spec(self, row: int, doorbell: Ends | Dial) -> SlotSpec:
        return SlotSpec(os.getpid(), self.fd, self.layout, self.rows, row, self.slot_bytes,
                        doorbell, self.num_slots)

    def memory(self, slot: int) -> memoryview:
        """The bytes of ``slot``, where a batch from another host is received."""
        return memoryview(self.slots[slot].numpy())

    def release_fd(self) -> None:
        """Every worker has mapped the buffer: the trainer's fd is no longer needed."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Let go of the descriptor and of the page lock; the memory goes
        with the last view of it."""
        self.release_fd()
        if self._registered:
            self._registered = False
            shm.unpin(self.slots)

    def _free(self, slot: int) -> bool:
        return slot not in self._written and not self._in_use(slot)

    def _in_use(self, slot: int) -> bool:
        """Whether the batch last handed out from ``slot`` is still referenced
        and still in its memory."""
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
        something took a slot's memory some other way. ``again``: for a replacement that redoes the
        requests of a worker that failed, the slots they were asked into, one each in turn."""
        asked = self._asked.setdefault(worker_id, [])
        # rotated: each redone request gets its own slot
        if again and asked:
            return asked.append(asked.pop(0)) or asked[-1]
        if self.rows == 1 or worker_id in self._round or not self._round:
            self._round.clear()
            self._slot = next((s for s in range(self.num_slots) if self._free(s)), None)
            if self._slot is not None:
                self._written.add(self._slot)
        self._round.add(worker_id)
        asked.extend([] if self._slot is None else [self._slot])
        return self._slot

    def returned(self, worker_id: int) -> None:
        """Its oldest request answered with the batch itself (it did not fit)."""
        oldest = self._asked.get(worker_id) and self.rows == 1
        self._written.discard(self._asked[worker_id].pop(0) if oldest else None)

    def hand_out(self, slot: int) -> TensorDict:
        """The batch in ``slot`` for the user: the slot's memory, under a storage of the user's
        own, while another slot stays free; else a copy."""
        self._written.discard(slot)
        self._asked = {w: [s for s in asked if s != slot] for w, asked in self._asked.items()}
        rows = None if self.rows == 1 else self.rows
        if not any(self._free(s) for s in range(self.num_slots) if s != slot):
            return self.layout.view(self.slots[slot], rows).clone()
        # else a round's rows, handed out one by one from one storage
        if not self._in_use(slot):
            # same memory, new storage
            lent = torch.frombuffer(self.slots[slot].numpy(), dtype=torch.uint8)
            self._lent[slot] = (lent, _use_count(lent))
        return self.layout.view(self._lent[slot][0], rows)


class BatchPlane:
    """Trainer side, all workers: which path each worker's batches take, and handing them out.

    ``local[i]`` says whether worker i shares the trainer's host; the others send their batches
    over TCP to ``address`` (the trainer's interface; None: as RPC results). ``join(i, spec)``
    asks worker i to map (or make) its slots and open its doorbell; whether it could. ``sync``
    collectors get one round buffer when every worker is local and their batches share one
    layout. Batches end up on ``device`` (:meth:`place`). ``pipelined`` (async, not waiting for
    weights after each batch): a worker on another host may have ``IN_FLIGHT`` requests at once
    (:meth:`depth`), so it collects its next batch while the last crosses the network;
    ``pipelined_here``: one on this host too, so it goes on as soon as it finished one (False where
    a bound on lag or on batches per weights would drop or break one asked ahead). ``depth``: the
    requests in flight of every worker with slots instead (an admitted async node: one per local
    worker).
    """

    def __init__(
        self, local: list[bool], join: Callable[[int, SlotSpec], bool], sync: bool,
        keep_fds: bool = False, device: torch.device | None = None, address: str | None = None,
        timeout: float = 60.0, pipelined: bool = False, pipelined_here: bool = False,
        depth: int | None = None) -> None:
        """``keep_fds``: keep each buffer's descriptor, so that a replaced worker can map it
        (:meth:`rejoin`). ``timeout``: the RPC timeout, within which a worker on another host
        connects."""
        self.device = None if device is None or device.type == "cpu" else device
        # batches report device None, as TorchRL's do when none was given
        self._no_device = device is None
        self._pinned = self.device is not None and self.device.type == "cuda"
        # the path each worker's first batch sets up
        self._pending = {i: "shm" if here else "tcp" for i, here in enumerate(local)
                         if here or address is not None}
        self._sync, self._keep_fds, self._address = sync, keep_fds, address
        # one that cannot reach the trainer's port gives up within its join call's timeout:
        # its batches come by RPC
        self._joins = Joins(join, address, min(CONNECT_TIMEOUT, timeout / 2))
        self._in_flight = {"tcp": depth or (IN_FLIGHT if pipelined else 1),
                           "shm": depth or (IN_FLIGHT if pipelined_here else 1), "rpc": 1}
        self.pools: dict[int, SlotPool] = {}
        self._round: SlotPool | None = None
        self._rows: dict[int, int] = {}
        self._bells = self._joins.bells

    @property
    def buffers(self) -> list[SlotPool]:
        """Each buffer once (a sync round buffer serves every worker)."""
        return list({id(pool): pool for pool in self.pools.values()}.values())

    @property
    def shared_bytes(self) -> int:
        """Total size of the shared-memory buffers (slots x workers x batch bytes, page-rounded)."""
        return sum(pool.nbytes for pool in self.buffers if pool.shared)

    def path_of(self, worker_id: int) -> str:
        """``"shm"``, ``"tcp"`` or ``"rpc"``: how worker ``worker_id``'s batches
        reach the trainer now."""
        pool = self.pools.get(worker_id)
        return "rpc" if pool is None else "shm" if pool.shared else "tcp"

    def depth(self, worker_id: int) -> int:
        """How many requests ``worker_id`` may have in flight."""
        return self._in_flight[self.path_of(worker_id)]

    def slot_for(self, worker_id: int, again: bool = False) -> int | None:
        """The slot to ask ``worker_id`` to write its next batch into (None: as an RPC result)."""
        pool = self.pools.get(worker_id)
        return None if pool is None else pool.slot_for(worker_id, again)

    def ring(self, worker_id: int, min_version: int,
             slot: int | None) -> torch.futures.Future | None:
        """Ask ``worker_id`` for its next batch in ``slot`` by its doorbell (None: ask by RPC)."""
        bell = self._bells.get(worker_id)
        return None if bell is None or slot is None else bell.ring(slot, min_version)

    def rejoin(self, worker_id: int) -> None:
        """Set up ``worker_id``'s slots in the process that replaced it."""
        pool = self.pools.get(worker_id)
        row = self._rows.get(worker_id, 0)
        if pool is not None and not self._joins.join_one(worker_id, pool, row):
            raise RuntimeError(f"the replacement of collector worker {worker_id} cannot take its "
                               "batch slots")

    def admit(self, worker_id: int, local: bool) -> None:
        """A new process serves ``worker_id`` (an elastic newcomer, on any host): its predecessor's
        slots are let go, and its own first batch sets up slots for it, as for any worker."""
        self._joins.drop(worker_id)
        pool = self.pools.pop(worker_id, None)
        if pool is not None:
            pool.close()
        self._pending.pop(worker_id, None)
        if local or self._address is not None:
            self._pending[worker_id] = "shm" if local else "tcp"

    def receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch a worker's answer stands for; a first local batch sets
        up the worker's buffer."""
        if isinstance(result, Ready):
            pool = self.pools[worker_id]
            # a round with a batch that did not fit: this worker's row
            if pool is self._round:
                return pool.hand_out(result.slot)[self._rows[worker_id]]
            return pool.hand_out(result.slot)
        if worker_id in self.pools:
            self.pools[worker_id].returned(worker_id)
        # one attempt per worker
        path = self._pending.pop(worker_id, None)
        if path is not None:
            layout = BatchLayout.of(result)
            if layout is not None and layout.nbytes >= MIN_BYTES:
                slots = SLOTS + self._in_flight[path] - 1
                self._set_up(SlotPool(layout, 1, self._pinned, shared=path == "shm", slots=slots),
                             [worker_id])
        return result

    def round(self, results: list) -> TensorDict | None:
        """A sync round ``[N, (B,) T]`` where the workers wrote it, or None if
        it is not in one buffer.

        The first round (RPC results) sets the round buffer up when it can (one attempt); a single
        worker's batches take the per-worker path, whose slot holds one batch, not a row of a round.
        """
        if self._round is not None and all(isinstance(r, Ready) for r in results):
            return self._round.hand_out(results[0].slot)
        all_local = [self._pending.get(i) for i in range(len(results))] == ["shm"] * len(results)
        if self._sync and len(results) > 1 and all_local:
            self._sync = False
            layouts = {BatchLayout.of(r) if isinstance(r, TensorDictBase) else None
                       for r in results}
            layout = layouts.pop() if len(layouts) == 1 else None
            if layout is not None and layout.nbytes >= MIN_BYTES:
                self._pending.clear()
                self._round = SlotPool(layout, len(results), self._pinned)
                self._set_up(self._round, list(range(len(results))))
        return None

    def to_storing_device(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` on the trainer's storing device (a copy, read from pinned slots by DMA)."""
        if self.device is None:
            return batch.clear_device_() if self._no_device else batch
        placed = batch.to(self.device, non_blocking=True)
        # the copies must be done before a worker rewrites the slot
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return placed

    def _set_up(self, pool: SlotPool, worker_ids: list[int]) -> None:
        joined = False
        try:
            joined = self._joins.join_all(pool, worker_ids)
        finally:
            if not joined:
                pool.close()
                if pool is self._round:
                    self._round = None
            elif not self._keep_fds:
                pool.release_fd()
        if joined:
            self.pools.update({i: pool for i in worker_ids})
            self._rows.update({i: row for row, i in enumerate(worker_ids)})

    def close(self) -> None:
        """Forget the buffers; their memory goes with the last batch or view that uses it."""
        self._joins.close()
        for pool in self.buffers:
            pool.close()
        self.pools.clear()
        self._round = None
