"""The data plane: how a batch gets from a collector server to the trainer's memory.

A worker's first batch travels as an RPC result. From its layout (keys, shapes, dtypes) the
trainer allocates a buffer of ``SLOTS`` slots for it. From then on the trainer asks for "your
next batch, into slot s" by the worker's doorbell (:mod:`rpc_collectors.transport.doorbell`); the worker
collects, and only once the batch is in slot s does the trainer's request complete:

* a worker on the trainer's host maps the buffer (shared memory), writes the batch there and
  answers with a small :class:`~rpc_collectors.core.protocol.Ready` through a pipe;
* a worker on another host writes into slots of its own and sends the slot's bytes after its
  "ready" over a TCP connection to the trainer, whose reader receives them straight into slot s.

A worker that dies while writing or sending never completes its request, so a partly written
slot is never read. A batch that does not fit the layout (an env whose keys change) comes back
pickled instead. Small batches take slots too: a slot's "ready" costs the trainer about half the
CPU of unpickling the same batch as an RPC result, even for one frame.

Sync collectors whose workers all share the trainer's host and one layout get one buffer
whose slots hold a whole round: worker i writes row i of every tensor, so the ``[N, (B,) T]``
batch is assembled where the workers wrote it. Otherwise each worker has its own buffer.

Ownership. A yielded batch belongs to the user and is never written behind their back:

* the trainer hands out the slot's memory (no copy) only while another slot of the same buffer
  is free for the worker's next batch. Each hand-out is a torch storage of its own over the
  slot, so what the user does to it (``share_memory_()`` moves it to new memory) never moves the
  trainer's view of the slot. A slot is free again when nothing references that storage any
  more (its use count is back to the trainer's own), or when it no longer uses the slot's
  memory; so a batch the user still holds, or any view of it, keeps its slot out of use;
* otherwise (the user keeps their batches: a list, a replay buffer storing references) it
  copies the slot into fresh tensors, at memory speed, and the slot is free at once.

So a loop that drops each batch before the next gets every batch without a copy, one that
keeps them gets copies, and the memory stays ``SLOTS`` x batch bytes per buffer either way
(one slot more for each extra request in flight, see :class:`BatchPlane`).

Device. Workers hand over batches in host memory; the trainer puts them on its storing device.
For a CUDA storing device the slots are page-locked (``cudaHostRegister`` for shared memory,
pinned allocations for slots that receive from the network), so a batch is copied from the
slot straight into GPU memory by DMA, with no stop in pageable memory; that copy is the user's
batch, so slots are never lent out to the user.

A shared buffer is a file in /dev/shm whose name is removed right after it is created: workers
map it through ``/proc/<trainer pid>/fd/<fd>`` while the trainer holds it open, and the memory
goes away with the last process that maps it, so no process killed at any moment leaves a file
behind. Its space is reserved up front (``posix_fallocate``): a batch larger than the free
space of /dev/shm is an ``OSError`` naming both sizes, never a SIGBUS in a worker later.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.core.protocol import Ready
from rpc_collectors.transport.doorbell import Doorbell, SocketDoorbell
from rpc_collectors.transport.layouts import BatchLayout
from rpc_collectors.transport.slots import SLOTS, SlotPool, SlotSpec

IN_FLIGHT = 2  # requests a pipelined worker on another host has at once: it collects one while it sends the other
CONNECT_TIMEOUT = 10.0  # seconds at most for a worker on another host to connect its doorbell
MIN_BYTES = 0  # smaller batches go as RPC results (0: none; raised to compare the two paths)


class BatchPlane:
    """Trainer side, all workers: which path each worker's batches take, and handing them out.

    ``local[i]`` says whether worker i shares the trainer's host; the others send their batches
    over TCP to ``address`` (the trainer's interface; None: as RPC results). ``join(i, spec)``
    asks worker i to map (or make) its slots and open its doorbell, and returns whether it
    could. ``sync`` collectors get one round buffer when every worker is local and their
    batches share one layout. A worker with slots is asked for batches through its doorbell
    (:meth:`ring`). Batches end up on ``device`` (:meth:`place`).

    ``pipelined`` (async collectors that do not wait for the trainer's weights after each batch):
    a worker on another host may have ``IN_FLIGHT`` requests at once (:meth:`depth`), so that it
    collects its next batch while the last one crosses the network.
    """

    def __init__(
        self, local: list[bool], join: Callable[[int, SlotSpec], bool], sync: bool, keep_fds: bool = False,
        device: torch.device | None = None, address: str | None = None, timeout: float = 60.0,
        pipelined: bool = False,
    ) -> None:
        """``keep_fds``: keep each buffer's descriptor, so that a replaced worker can map it
        (:meth:`rejoin`). ``timeout``: the RPC timeout, within which a worker on another host connects."""
        self.device = None if device is None or device.type == "cpu" else device
        self._no_device = device is None  # batches report device None, as TorchRL's do when none was given
        self._pinned = self.device is not None and self.device.type == "cuda"
        # the path each worker's first batch sets up
        self._pending = {i: "shm" if here else "tcp" for i, here in enumerate(local) if here or address is not None}
        self._join = join
        self._sync = sync
        self._keep_fds = keep_fds
        # a worker that cannot reach the trainer's port gives up well within its join call's
        # timeout, and its batches keep coming as RPC results
        self._address, self._connect_timeout = address, min(CONNECT_TIMEOUT, timeout / 2)
        self._in_flight = IN_FLIGHT if pipelined else 1  # per worker on another host
        self.pools: dict[int, SlotPool] = {}
        self._round: SlotPool | None = None
        self._rows: dict[int, int] = {}
        self._bells: dict[int, Doorbell] = {}

    @property
    def buffers(self) -> list[SlotPool]:
        """Each buffer once (a sync round buffer serves every worker)."""
        return list({id(pool): pool for pool in self.pools.values()}.values())

    @property
    def shared_bytes(self) -> int:
        """Total size of the shared-memory buffers (slots x workers x batch bytes, page-rounded)."""
        return sum(pool.nbytes for pool in self.buffers if pool.shared)

    def path_of(self, worker_id: int) -> str:
        """``"shm"``, ``"tcp"`` or ``"rpc"``: how worker ``worker_id``'s batches reach the trainer now."""
        pool = self.pools.get(worker_id)
        return "rpc" if pool is None else "shm" if pool.shared else "tcp"

    def depth(self, worker_id: int) -> int:
        """How many requests ``worker_id`` may have in flight."""
        return self._in_flight if self.path_of(worker_id) == "tcp" else 1

    def slot_for(self, worker_id: int, again: bool = False) -> int | None:
        """The slot to ask ``worker_id`` to write its next batch into (None: as an RPC result)."""
        pool = self.pools.get(worker_id)
        return None if pool is None else pool.slot_for(worker_id, again)

    def ring(self, worker_id: int, min_version: int, slot: int | None) -> torch.futures.Future | None:
        """Ask ``worker_id`` for its next batch in ``slot`` by its doorbell (None: ask by RPC)."""
        bell = self._bells.get(worker_id)
        return None if bell is None or slot is None else bell.ring(slot, min_version)

    def rejoin(self, worker_id: int) -> None:
        """Set up ``worker_id``'s slots in the process that replaced it."""
        pool = self.pools.get(worker_id)
        if pool is not None and not self._join_one(worker_id, pool, self._rows.get(worker_id, 0)):
            raise RuntimeError(f"the replacement of collector worker {worker_id} cannot take its batch slots")

    def admit(self, worker_id: int, local: bool) -> None:
        """A new process serves ``worker_id`` (an elastic newcomer, on any host): its predecessor's
        slots are let go, and its own first batch sets up slots for it, as for any worker."""
        bell = self._bells.pop(worker_id, None)
        if bell is not None:
            bell.close()
        pool = self.pools.pop(worker_id, None)
        if pool is not None:
            pool.close()
        self._pending.pop(worker_id, None)
        if local or self._address is not None:
            self._pending[worker_id] = "shm" if local else "tcp"

    def _join_one(self, worker_id: int, pool: SlotPool, row: int) -> bool:
        """Ask ``worker_id`` to take its slots in ``pool`` and open a new doorbell; whether it could."""
        bell = Doorbell() if pool.shared else SocketDoorbell(self._address, pool.memory, self._connect_timeout)
        try:
            joined = self._join(worker_id, pool.spec(row, bell.ends))
            if joined:
                bell.opened()
        except BaseException as err:
            bell.close()
            if isinstance(err, OSError):  # the worker's connection never came
                return False
            raise
        if not joined:
            bell.close()
            return False
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
        path = self._pending.pop(worker_id, None)  # one attempt per worker
        if path is not None:
            layout = BatchLayout.of(result)
            if layout is not None and layout.nbytes >= MIN_BYTES:
                slots = SLOTS if path == "shm" else SLOTS + self._in_flight - 1
                self._set_up(SlotPool(layout, 1, self._pinned, shared=path == "shm", slots=slots), [worker_id])
        return result

    def round(self, results: list) -> TensorDict | None:
        """A sync round ``[N, (B,) T]`` where the workers wrote it, or None if it is not in one buffer.

        The first round (RPC results) sets the round buffer up when it can; a single worker's
        batches take the per-worker path, whose slot holds one batch, not a row of a round.
        """
        if self._round is not None and all(isinstance(r, Ready) for r in results):
            return self._round.hand_out(results[0].slot)
        if self._sync and len(results) > 1 and [self._pending.get(i) for i in range(len(results))] == ["shm"] * len(results):
            self._sync = False  # one attempt
            layouts = {BatchLayout.of(r) if isinstance(r, TensorDictBase) else None for r in results}
            layout = layouts.pop() if len(layouts) == 1 else None
            if layout is not None and layout.nbytes >= MIN_BYTES:
                self._pending.clear()
                self._round = SlotPool(layout, len(results), self._pinned)
                self._set_up(self._round, list(range(len(results))))
        return None

    def place(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch`` on the trainer's storing device (a copy, read from pinned slots by DMA)."""
        if self.device is None:
            return batch.clear_device_() if self._no_device else batch
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
