"""The weight plane: moving a flat weight buffer from the trainer to collector servers.

Four transports, all separate from the default process group:

* ``"shm"``: a shared-memory file of two slots that workers on the trainer's host map. An
  update is one copy into a slot on the trainer; a worker told about it copies the slot
  straight into its policy when it next applies weights (between batches), so a push costs
  the trainer one copy and one small RPC per worker, however large the policy.
* ``"shared"`` (TorchRL's ``SharedMemWeightSyncScheme``): one slot that *is* the trainer's policy
  and every worker's (CPU, one host). A change the trainer makes in place reaches the workers at
  once, mid-batch too; a push copies given weights in (none: nothing to copy) and raises the
  version, so a frame's ``policy_version`` counts pushes but no longer pins its weights.
* ``"broadcast"``: a process group of its own (gloo for CPU, NCCL for CUDA tensors) among the
  trainer and all workers, built from a prefixed store; all workers get one ``broadcast``,
  a subset gets point-to-point sends.
* ``"rpc"``: the flat buffer travels as the argument of each worker's ``receive_weights`` call.
  It needs no group, so it is what elastic collectors use: their members change while the
  trainer runs, and a newcomer gets the latest version the same way.

The trainer side is :class:`WeightPlane` (which transport, each push, how far behind each
worker is) over a :class:`WeightSender`; each worker holds a :class:`WeightReceiver` that
stages incoming weights and applies them to its collector between batches, and answers each
receipt with a :data:`Receipt`: how long it took the bytes in, and how long its last apply took
(the pushes' phases of ``metrics()``). What both ends share (the spec, the shared-memory slots,
the process group) is in :mod:`.weight_channels`.

Shared-memory slots: the trainer packs every version into the slot that the latest push to
*all* workers did not use, and only after the previous push was acknowledged. A push to all
workers (mode ``"shm:<slot>"``) is read lazily by each worker from its slot; a push to a
subset (``"shm-copy:<slot>"``) is copied into the worker's staging buffer on receipt. So the
only slot a worker may still read later is the slot of the latest all-workers push, which the
trainer never writes next; and a worker applying weights holds its lock, which the receipt of
the next version waits for, so no worker ever reads a slot while the trainer writes it.

Weights of one worker's own (TorchRL's per-worker ``{worker_id: weights}``) never enter the
shared buffers, which so always hold the trainer's latest pushed weights: each is packed into
a copy of its own that travels in the worker's ``receive_weights`` call, as with ``"rpc"``.
Where a worker's process may be replaced or a collector may join its slot, the slot keeps that
copy until the trainer's weights reach it (one flat copy per slot at most), so the new process
gets what its slot holds (:meth:`WeightPlane.rejoin`).
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque

import torch
import torch.distributed as dist

from rpc_collectors.transport.weight_channels import (
    SHM_SLOTS,
    SLOTS,
    TransportSpec,
    map_slots,
    parse_mode,
    process_group,
    shm_file,
)
from rpc_collectors.transport.weights import FlatWeights

Receipt = tuple[int, "int | None", int]
"""A worker's answer to ``receive_weights``, of its own clock: the nanoseconds it took the bytes in
(a broadcast, a point-to-point receive, a copy out of a shared-memory slot; 0 where they came
with the call or are read when applied), then the version its last apply brought in and the
nanoseconds that copy into its policy took (None, 0: none since its last answer)."""


class WeightReceiver:
    """Worker side: receive flat weights (or where they lie in shared memory); apply
    them between batches."""

    def __init__(self, spec: TransportSpec, flat: FlatWeights, rank: int) -> None:
        self.spec, self.flat = spec, flat
        nccl = spec.backend == "nccl"
        self._device = torch.device("cuda", torch.cuda.current_device()) if nccl else flat.device
        # allocated on first use (shm rarely needs it)
        self._staging: torch.Tensor | None = None
        self.slots = map_slots(spec.path, spec.nbytes, spec.kind) if spec.kind in SLOTS else None
        self.group = process_group(spec, rank) if spec.kind == "broadcast" else None
        if spec.kind == "shared":
            flat.share(self.slots[0])
        self.version = 0
        # where the newest received version lies
        self.source: torch.Tensor | None = None
        # a version was received since the last apply (read without the lock: see apply)
        self.unapplied = False
        # the last apply not told yet: its version and nanoseconds (see Receipt)
        self.applied: tuple[int | None, int] = (None, 0)
        self._cond = threading.Condition()
        # a trace window's apply spans (start, end): a deque while one is open
        self.spans: deque | None = None

    @property
    def staging(self) -> torch.Tensor:
        if self._staging is None:
            self._staging = self.flat.new_buffer(self._device)
        return self._staging

    def receive(self, version: int, mode: str, payload: torch.Tensor | None = None) -> Receipt:
        """Take version ``version``: from shared memory, the broadcast, a
        point-to-point send or ``payload``; answers its :data:`Receipt`.

        Modes: ``"shm:<slot>"`` (read the slot when applying), ``"shm-copy:<slot>"`` (copy the
        slot now), ``"shared"`` (the policy is the slot: only the version is new),
        ``"broadcast"``, ``"p2p"``, ``"rpc"`` (``payload``, a copy this worker owns).
        """
        kind, slot = parse_mode(mode)
        # an apply in progress finishes first
        with self._cond:
            began = time.monotonic_ns()
            if kind == "rpc":
                self.source = payload
            elif kind in SLOTS:
                self.source = self.slots[slot]
            elif kind == "shm-copy":
                self.staging.copy_(self.slots[slot])
                self.source = self.staging
            elif kind == "broadcast":
                self.group.broadcast(self.staging, 0).wait()
                self.source = self.staging
            else:
                self.group.recv([self.staging], 0, version).wait()
                self.source = self.staging
            took = time.monotonic_ns() - began if kind != "rpc" and kind not in SLOTS else 0
            self.version, self.unapplied = version, True
            applied, self.applied = self.applied, (None, 0)
            self._cond.notify_all()
        return took, *applied

    def apply(self, collector: "object", min_version: int, timeout: float) -> None:
        """Bring ``collector``'s policy to the newest staged version, waiting for ``min_version``
        unless the collector holds it already (loaded from a saved state); one received at the
        collector's own version is applied too (a newcomer's first weights, of a trainer that
        resumed at that version), one older than it (loaded since) is not. With nothing received
        since the last apply and ``min_version`` held already it does nothing: its server (between
        batches) skips it then, reading ``unapplied`` without the lock, as if a version received
        meanwhile came just after."""
        with self._cond:
            if not self._cond.wait_for(
                    lambda: max(self.version, collector.policy_version) >= min_version, timeout):
                raise TimeoutError(f"weights version {min_version} did not arrive within {timeout} "
                                   "s")
            if self.unapplied and self.version >= collector.policy_version:
                began = time.monotonic_ns()
                if self.spec.kind == "shared":
                    # the policy is the slot (again, if its tensors were replaced since)
                    self.flat.share(self.source)
                else:
                    self.flat.unpack(self.source)
                ended = time.monotonic_ns()
                self.applied = (self.version, ended - began)
                spans = self.spans
                if spans is not None:
                    spans.append(("apply", began, ended, {"version": self.version}))
                collector.policy_version = self.version
            self.unapplied = False

    def superseded(self) -> None:
        """The collector loaded a saved state: weights received before it are
        not applied after it."""
        with self._cond:
            self.unapplied = False

    def close(self) -> None:
        if self.group is not None:
            self.group.shutdown()
            self.group = None


class WeightSender:
    """Trainer side: pack the policy into the flat buffer and push it to workers."""

    def __init__(
        self, flat: FlatWeights, spec: TransportSpec, buffer: torch.Tensor, fd: int | None = None,
        keep_fd: bool = False
    ) -> None:
        """``fd``: the shared-memory file's descriptor (see :func:`shm_file`), closed by
        :meth:`joined`, or only by :meth:`close` with ``keep_fd`` (workers that join later open
        the file through it)."""
        self.flat, self.spec = flat, spec
        self.fd, self.keep_fd = fd, keep_fd
        # the latest version, and how a worker that joins now receives it
        self.latest: tuple[int, str] | None = None
        in_file = spec.kind in SLOTS
        self.slots = map_slots(spec.path, spec.nbytes, spec.kind) if in_file else [buffer]
        # the slot the next version is packed into
        self._next = 0
        self.group: dist.ProcessGroup | None = None
        self.work: list = []

    @property
    def buffer(self) -> torch.Tensor:
        """Where to pack the next version (call only after the previous push was acknowledged)."""
        return self.slots[self._next]

    def connect(self) -> None:
        """Join the process group (broadcast transport); workers join it at the same time."""
        if self.spec.kind == "broadcast" and self.group is None:
            self.group = process_group(self.spec, 0)

    def joined(self) -> None:
        """Every worker has mapped the shared-memory file: close its descriptor (the mappings stay).

        The memory then goes away with the last process that maps it. Called by the first push too.
        """
        if self.keep_fd:
            return
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def push(self, worker_ranks: list[int], version: int, all_workers: bool) -> str:
        """Start sending the packed buffer; returns the mode the workers must receive with."""
        if self.spec.kind == "shared":
            self.joined()
            self.latest = version, "shared"
            return "shared"
        if self.spec.kind == "shm":
            self.joined()
            slot = self._next
            # the slot holds this version until the next pack
            self.latest = version, f"shm-copy:{slot}"
            # workers read this slot lazily: the next version goes to the other
            if all_workers:
                self._next = (slot + 1) % SHM_SLOTS
                return f"shm:{slot}"
            # the workers copy it now; the slot is free once they answered
            return f"shm-copy:{slot}"
        if self.spec.kind == "rpc":
            self.latest = version, "rpc"
            # the caller sends the buffer with each worker's call
            return "rpc"
        if all_workers:
            self.work = [self.group.broadcast(self.buffer, 0)]
            return "broadcast"
        self.work = [self.group.send([self.buffer], rank, version) for rank in worker_ranks]
        return "p2p"

    def wait(self) -> None:
        """Wait until the last push left the trainer (bounded by the group's timeout)."""
        work, self.work = self.work, []
        for w in work:
            w.wait()

    def close(self) -> None:
        self.keep_fd = False
        self.joined()
        if self.group is not None:
            self.group.shutdown()
            self.group = None


def choose_transport(
    requested: str, same_host: bool, backend: str, elastic: bool, in_process: bool,
    groups: bool = True,
) -> str:
    """The transport a collector's weights take: ``"auto"`` is shared memory when every worker
    shares the trainer's host (gloo), else the broadcast group; elastic collectors, and workers
    that cannot join a process group (``groups=False``: Ray actors), use ``"rpc"``."""
    kind = requested if requested != "auto" else ("shm" if same_host and backend == "gloo"
                                                  else "broadcast")
    if elastic or (not groups and kind == "broadcast"):
        kind = "rpc"
    # in-process workers would share the trainer's buffer
    if kind not in SLOTS and in_process:
        raise ValueError(f"weight_transport={kind!r} needs worker processes; the debug launcher "
                         "uses 'shm' or 'shared'")
    if kind in SLOTS and not same_host:
        raise ValueError(f"weight_transport={kind!r} needs every worker on the trainer's host")
    return kind


class WeightPlane:
    """Trainer side of the weight plane for one collector: its transport, each push, and which
    weights each worker's slot holds.

    ``refill``: a worker's slot may get a new process (a replacement, or a collector that joins);
    ``rdv`` (broadcast only): where the weight process group meets.
    """

    def __init__(
        self, module: "torch.nn.Module | object", kind: str, num_workers: int, timeout: float,
        refill: bool, backend: str = "gloo", rdv: "object | None" = None,
    ) -> None:
        """``module``: the trainer's policy, or a TensorDict of the weights its
        workers' policies hold."""
        flat = FlatWeights(module)
        fd = None
        if kind == "rpc":
            buffer = flat.new_buffer(None)
            spec = TransportSpec("rpc", flat.nbytes, timeout=timeout, signature=flat.signature)
        elif kind in SLOTS:
            path, fd, buffer = shm_file(flat.nbytes, kind)
            spec = TransportSpec(kind, flat.nbytes, path=path, timeout=timeout,
                                 signature=flat.signature)
            if kind == "shared":
                # the trainer's policy lives in the slot from now on
                flat.pack(buffer)
                flat.share(buffer)
        else:
            spec = TransportSpec(
                "broadcast", flat.nbytes, addr=rdv.master_addr, port=rdv.master_port,
                prefix=f"rpc_collectors/weights/{uuid.uuid4().hex}", world_size=num_workers + 1,
                backend=backend, interface=rdv.interface, timeout=timeout, signature=flat.signature,
            )
            buffer = flat.new_buffer(torch.device("cuda") if backend == "nccl" else None)
        self.num_workers, self.refill = num_workers, refill
        # a new process opens the shm file
        self.sender = WeightSender(flat, spec, buffer, fd, keep_fd=refill)
        # refill: slot i's own weights and their version
        self.own: dict[int, tuple[int, torch.Tensor]] = {}

    @property
    def spec(self) -> TransportSpec:
        return self.sender.spec

    def push(
        self, worker_ids: list[int], source: "object | None", version: int,
        slots: list[int] | None = None,
    ) -> dict[int, tuple]:
        """Pack ``source`` (None: the module's tensors now) as ``version`` and start sending it to
        ``worker_ids``; ``slots`` (default: ``worker_ids``; an update names vacant ones too) hold
        these weights from now on. Returns the arguments of each one's ``receive_weights`` call.
        It is :meth:`pack` then :meth:`send`."""
        self.pack(source)
        return self.send(worker_ids, version, slots)

    @property
    def packs_in_place(self) -> bool:
        """Whether packing is the transfer itself: a copy into the memory workers read."""
        return self.spec.kind in SLOTS

    def tensors(self, source: "object | None") -> list[torch.Tensor]:
        """``source``'s tensors (None: the module's now), checked against the layout."""
        return self.sender.flat.tensors(source)

    def pack(self, source: "object | None", tensors: list[torch.Tensor] | None = None) -> None:
        """Copy ``source`` (None: the module's tensors now; ``tensors``: its :meth:`tensors`)
        into the buffer the next push sends. With "shared", the trainer's policy is that buffer:
        nothing to copy, unless its tensors were replaced since (they are then shared again)."""
        flat, buffer = self.sender.flat, self.sender.buffer
        if self.spec.kind == "shared" and source is None and flat.shares(buffer):
            return
        flat.pack(buffer, source, tensors)
        if self.spec.kind == "shared":
            flat.share(buffer)

    def send(self, worker_ids: list[int], version: int,
             slots: list[int] | None = None) -> dict[int, tuple]:
        """Start sending what :meth:`pack` packed as ``version`` (see :meth:`push`)."""
        mode = self.sender.push([i + 1 for i in worker_ids], version,
                                all_workers=len(worker_ids) == self.num_workers)
        for worker_id in worker_ids if slots is None else slots:
            self.own.pop(worker_id, None)
        return {worker_id: self._receive_args(version, mode) for worker_id in worker_ids}

    def push_own(self, weights: dict, version: int, serving: list[int]) -> dict[int, tuple]:
        """TorchRL's per-worker form: pack each ``{worker_id: weights}`` entry as ``version`` into a
        copy of its own and start sending it to those of the workers ``serving``; with ``refill``
        each slot keeps its copy until the trainer's weights reach it. Returns the arguments of
        each one's ``receive_weights`` call."""
        receive = {}
        for worker_id, source in weights.items():
            copy = self.sender.flat.new_buffer(torch.device("cpu"))
            self.sender.flat.pack(copy, source)
            if self.refill:
                self.own[worker_id] = version, copy
            if worker_id in serving:
                receive[worker_id] = version, "rpc", copy
        return receive

    def _receive_args(self, version: int, mode: str) -> tuple:
        return (version, mode, self.sender.buffer) if mode == "rpc" else (version, mode)

    def rejoin(self, worker_id: int) -> tuple | None:
        """``receive_weights`` arguments that give the new process serving ``worker_id`` what its
        slot holds, under the version they were pushed with: its own weights if they reached it
        last, else the trainer's latest (None: nothing was pushed yet; it keeps its policy's own,
        version 0)."""
        if worker_id in self.own:
            version, copy = self.own[worker_id]
            return version, "rpc", copy
        return None if self.sender.latest is None else self._receive_args(*self.sender.latest)

    def close(self) -> None:
        self.sender.close()
