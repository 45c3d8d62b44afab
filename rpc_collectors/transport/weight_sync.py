"""The weight plane: moving a flat weight buffer from the trainer to collector servers.

Three transports, all separate from the default process group:

* ``"shm"``: a shared-memory file of two slots that workers on the trainer's host map. An
  update is one copy into a slot on the trainer; a worker told about it copies the slot
  straight into its policy when it next applies weights (between batches), so a push costs
  the trainer one copy and one small RPC per worker, however large the policy.
* ``"broadcast"``: a process group of its own (gloo for CPU, NCCL for CUDA tensors) among the
  trainer and all workers, built from a prefixed store; all workers get one ``broadcast``,
  a subset gets point-to-point sends.
* ``"rpc"``: the flat buffer travels as the argument of each worker's ``receive_weights`` call.
  It needs no group, so it is what elastic collectors use: their members change while the
  trainer runs, and a newcomer gets the latest version the same way.

The trainer side is :class:`WeightPlane` (which transport, each push, how far behind each
worker is) over a :class:`WeightSender`; each worker holds a :class:`WeightReceiver` that
stages incoming weights and applies them to its collector between batches.

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

import datetime
import os
import threading
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rpc_collectors.transport import shm
from rpc_collectors.transport.weights import FlatWeights

TRANSPORTS = ("auto", "shm", "broadcast", "rpc")


@dataclass(frozen=True)
class TransportSpec:
    """What a worker needs to join the weight plane."""

    kind: str  # "shm", "broadcast" or "rpc"
    nbytes: int
    path: str | None = None  # shm file
    addr: str | None = None  # broadcast: store address, port and key prefix
    port: int | None = None
    prefix: str | None = None
    world_size: int = 0
    backend: str = "gloo"
    interface: str | None = None
    timeout: float = 60.0
    signature: tuple = ()  # (key, dtype, shape) of every tensor, as the trainer lays them out


SHM_SLOTS = 2


def map_slots(path: str, nbytes: int) -> list[torch.Tensor]:
    """Map the shared-memory file at ``path``: its ``SHM_SLOTS`` slots of ``nbytes`` each."""
    whole = torch.from_file(path, shared=True, size=max(SHM_SLOTS * nbytes, 1), dtype=torch.uint8)
    return [whole[i * nbytes:(i + 1) * nbytes] for i in range(SHM_SLOTS)]


def shm_file(nbytes: int) -> tuple[str, int, torch.Tensor]:
    """Create a nameless shared-memory file for weights of ``nbytes`` (two slots); returns the path
    to open it by, its descriptor and slot 0 (see :mod:`rpc_collectors.transport.shm`).

    Close the descriptor once every worker mapped it. The pages are touched here, so the first
    update does not pay the page faults.
    """
    fd, path = shm.nameless_file(
        "weights", SHM_SLOTS * nbytes, "the shared-memory weights file",
        f": {SHM_SLOTS} copies of the policy's {nbytes} bytes", "use weight_transport='broadcast'",
    )
    slots = map_slots(path, nbytes)
    for slot in slots:
        slot.zero_()
    return path, fd, slots[0]


def _parse_mode(mode: str) -> tuple[str, int]:
    kind, _, slot = mode.partition(":")
    return kind, int(slot or 0)


def process_group(spec: TransportSpec, rank: int) -> dist.ProcessGroup:
    """Join the weight process group (never the default group) through a prefixed store."""
    timeout = datetime.timedelta(seconds=spec.timeout)
    store = dist.PrefixStore(spec.prefix, dist.TCPStore(spec.addr, spec.port, is_master=False, timeout=timeout))
    if spec.backend == "nccl":  # its waits bounded as gloo's (NCCL's own default: 10 minutes)
        nccl = dist.ProcessGroupNCCL.Options()
        nccl._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, spec.world_size, nccl)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    gloo = dist.ProcessGroupGloo
    device = gloo.create_device(interface=spec.interface) if spec.interface else gloo.create_default_device()
    options._devices = [device]
    return dist.ProcessGroupGloo(store, rank, spec.world_size, options)


class WeightReceiver:
    """Worker side: receive flat weights (or where they lie in shared memory); apply them between batches."""

    def __init__(self, spec: TransportSpec, flat: FlatWeights, rank: int) -> None:
        self.spec, self.flat = spec, flat
        device = torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else flat.device
        self._device = device
        self._staging: torch.Tensor | None = None  # allocated on first use (shm rarely needs it)
        self.slots = map_slots(spec.path, spec.nbytes) if spec.kind == "shm" else None
        self.group = process_group(spec, rank) if spec.kind == "broadcast" else None
        self.version = 0
        self.source: torch.Tensor | None = None  # where the newest received version lies
        self.unapplied = False  # a version was received since the last apply (read without the lock: see apply)
        self._cond = threading.Condition()

    @property
    def staging(self) -> torch.Tensor:
        if self._staging is None:
            self._staging = self.flat.new_buffer(self._device)
        return self._staging

    def receive(self, version: int, mode: str, payload: torch.Tensor | None = None) -> None:
        """Take version ``version``: from shared memory, the broadcast, a point-to-point send or ``payload``.

        Modes: ``"shm:<slot>"`` (read the slot when applying), ``"shm-copy:<slot>"`` (copy the
        slot now), ``"broadcast"``, ``"p2p"``, ``"rpc"`` (``payload``, a copy this worker owns).
        """
        kind, slot = _parse_mode(mode)
        with self._cond:  # an apply in progress finishes first
            if kind == "rpc":
                self.source = payload
            elif kind == "shm":
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
            self.version, self.unapplied = version, True
            self._cond.notify_all()

    def apply(self, collector: "object", min_version: int, timeout: float) -> None:
        """Bring ``collector``'s policy to the newest staged version, waiting for ``min_version`` unless
        the collector holds it already (loaded from a saved state); one received at the collector's
        own version is applied too (a newcomer's first weights, of a trainer that resumed at that
        version), one older than it (loaded since) is not. With nothing received since the last apply
        and ``min_version`` held already it does nothing: its server (between batches) skips it then,
        reading ``unapplied`` without the lock, as if a version received meanwhile came just after."""
        with self._cond:
            if not self._cond.wait_for(lambda: max(self.version, collector.policy_version) >= min_version, timeout):
                raise TimeoutError(f"weights version {min_version} did not arrive within {timeout} s")
            if self.unapplied and self.version >= collector.policy_version:
                self.flat.unpack(self.source)
                collector.policy_version = self.version
            self.unapplied = False

    def superseded(self) -> None:
        """The collector loaded a saved state: weights received before it are not applied after it."""
        with self._cond:
            self.unapplied = False

    def close(self) -> None:
        if self.group is not None:
            self.group.shutdown()
            self.group = None


class WeightSender:
    """Trainer side: pack the policy into the flat buffer and push it to workers."""

    def __init__(
        self, flat: FlatWeights, spec: TransportSpec, buffer: torch.Tensor, fd: int | None = None, keep_fd: bool = False
    ) -> None:
        """``fd``: the shared-memory file's descriptor (see :func:`shm_file`), closed by :meth:`joined`,
        or only by :meth:`close` with ``keep_fd`` (workers that join later open the file through it)."""
        self.flat, self.spec = flat, spec
        self.fd, self.keep_fd = fd, keep_fd
        self.latest: tuple[int, str] | None = None  # the latest version, and how a worker that joins now receives it
        self.slots = map_slots(spec.path, spec.nbytes) if spec.kind == "shm" else [buffer]
        self._next = 0  # the slot the next version is packed into
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
        if self.spec.kind == "shm":
            self.joined()
            slot = self._next
            self.latest = version, f"shm-copy:{slot}"  # the slot holds this version until the next pack
            if all_workers:  # workers read this slot lazily: the next version goes to the other
                self._next = (slot + 1) % SHM_SLOTS
                return f"shm:{slot}"
            return f"shm-copy:{slot}"  # the workers copy it now; the slot is free once they answered
        if self.spec.kind == "rpc":
            self.latest = version, "rpc"
            return "rpc"  # the caller sends the buffer with each worker's call
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
    requested: str, same_host: bool, backend: str, elastic: bool, in_process: bool, groups: bool = True,
) -> str:
    """The transport a collector's weights take: ``"auto"`` is shared memory when every worker
    shares the trainer's host (gloo), else the broadcast group; elastic collectors, and workers
    that cannot join a process group (``groups=False``: Ray actors), use ``"rpc"``."""
    kind = requested if requested != "auto" else ("shm" if same_host and backend == "gloo" else "broadcast")
    if elastic or (not groups and kind == "broadcast"):
        kind = "rpc"
    if kind != "shm" and in_process:  # in-process workers would share the trainer's buffer
        raise ValueError(f"weight_transport={kind!r} needs worker processes; the debug launcher uses 'shm'")
    if kind == "shm" and not same_host:
        raise ValueError("weight_transport='shm' needs every worker on the trainer's host")
    return kind


class WeightPlane:
    """Trainer side of the weight plane for one collector: its transport, each push, and which
    weights each worker's slot holds.

    ``refill``: a worker's slot may get a new process (a replacement, or a collector that joins);
    ``rdv`` (broadcast only): where the weight process group meets.
    """

    def __init__(
        self, module: "torch.nn.Module | object", kind: str, num_workers: int, timeout: float, refill: bool,
        backend: str = "gloo", rdv: "object | None" = None,
    ) -> None:
        """``module``: the trainer's policy, or a TensorDict of the weights its workers' policies hold."""
        flat = FlatWeights(module)
        fd = None
        if kind == "rpc":
            buffer = flat.new_buffer(None)
            spec = TransportSpec("rpc", flat.nbytes, timeout=timeout, signature=flat.signature)
        elif kind == "shm":
            path, fd, buffer = shm_file(flat.nbytes)
            spec = TransportSpec("shm", flat.nbytes, path=path, timeout=timeout, signature=flat.signature)
        else:
            spec = TransportSpec(
                "broadcast", flat.nbytes, addr=rdv.master_addr, port=rdv.master_port,
                prefix=f"rpc_collectors/weights/{uuid.uuid4().hex}", world_size=num_workers + 1,
                backend=backend, interface=rdv.interface, timeout=timeout, signature=flat.signature,
            )
            buffer = flat.new_buffer(torch.device("cuda") if backend == "nccl" else None)
        self.num_workers, self.refill = num_workers, refill
        self.sender = WeightSender(flat, spec, buffer, fd, keep_fd=refill)  # a new process opens the shm file
        self.own: dict[int, tuple[int, torch.Tensor]] = {}  # refill: slot i's own weights and their version

    @property
    def spec(self) -> TransportSpec:
        return self.sender.spec

    def push(
        self, worker_ids: list[int], source: "object | None", version: int, slots: list[int] | None = None,
    ) -> dict[int, tuple]:
        """Pack ``source`` (None: the module's tensors now) as ``version`` and start sending it to
        ``worker_ids``; ``slots`` (default: ``worker_ids``; an update names vacant ones too) hold
        these weights from now on. Returns the arguments of each one's ``receive_weights`` call."""
        self.sender.flat.pack(self.sender.buffer, source)
        mode = self.sender.push([i + 1 for i in worker_ids], version, all_workers=len(worker_ids) == self.num_workers)
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
