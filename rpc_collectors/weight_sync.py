"""The weight plane: moving a flat weight buffer from the trainer to collector servers.

Two transports, both separate from the default process group:

* ``"shm"``: a shared-memory file that workers on the trainer's host map; an update is one
  copy in on the trainer and one copy out on each worker.
* ``"broadcast"``: a process group of its own (gloo for CPU, NCCL for CUDA tensors) among the
  trainer and all workers, built from a prefixed store; all workers get one ``broadcast``,
  a subset gets point-to-point sends.

The trainer side is :class:`WeightSender`; each worker holds a :class:`WeightReceiver` that
stages incoming weights and applies them to its collector between batches.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .weights import FlatWeights

TRANSPORTS = ("auto", "shm", "broadcast")


@dataclass(frozen=True)
class TransportSpec:
    """What a worker needs to join the weight plane."""

    kind: str  # "shm" or "broadcast"
    nbytes: int
    path: str | None = None  # shm file
    addr: str | None = None  # broadcast: store address, port and key prefix
    port: int | None = None
    prefix: str | None = None
    world_size: int = 0
    backend: str = "gloo"
    interface: str | None = None
    timeout: float = 60.0


def shm_file(nbytes: int) -> tuple[str, torch.Tensor]:
    """Create a shared-memory file of ``nbytes`` and map it; returns its path and the mapping."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="rpc_collectors_weights_", dir=directory)
    os.ftruncate(fd, max(nbytes, 1))
    os.close(fd)
    return path, torch.from_file(path, shared=True, size=max(nbytes, 1), dtype=torch.uint8)[:nbytes]


def process_group(spec: TransportSpec, rank: int) -> dist.ProcessGroup:
    """Join the weight process group (never the default group) through a prefixed store."""
    timeout = datetime.timedelta(seconds=spec.timeout)
    store = dist.PrefixStore(spec.prefix, dist.TCPStore(spec.addr, spec.port, is_master=False, timeout=timeout))
    if spec.backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, spec.world_size, dist.ProcessGroupNCCL.Options())
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    device = dist.ProcessGroupGloo.create_device(interface=spec.interface) if spec.interface else dist.ProcessGroupGloo.create_default_device()
    options._devices = [device]
    return dist.ProcessGroupGloo(store, rank, spec.world_size, options)


class WeightReceiver:
    """Worker side: receive flat weights into a staging buffer; apply them between batches."""

    def __init__(self, spec: TransportSpec, flat: FlatWeights, rank: int) -> None:
        self.spec, self.flat = spec, flat
        device = torch.device("cuda", torch.cuda.current_device()) if spec.backend == "nccl" else flat.device
        self.staging = flat.new_buffer(device)
        self.shm = torch.from_file(spec.path, shared=True, size=max(spec.nbytes, 1), dtype=torch.uint8)[: spec.nbytes] if spec.kind == "shm" else None
        self.group = process_group(spec, rank) if spec.kind == "broadcast" else None
        self.version = 0
        self._cond = threading.Condition()

    def receive(self, version: int, mode: str) -> None:
        """Take version ``version``: from shared memory, the broadcast, or a point-to-point send."""
        with self._cond:
            if mode == "shm":
                self.staging.copy_(self.shm)
            elif mode == "broadcast":
                self.group.broadcast([self.staging], 0).wait()
            else:
                self.group.recv([self.staging], 0, version).wait()
            self.version = version
            self._cond.notify_all()

    def apply(self, collector: "object", min_version: int, timeout: float) -> None:
        """Bring ``collector``'s policy to the newest staged version, waiting for ``min_version``."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.version >= min_version, timeout):
                raise TimeoutError(f"weights version {min_version} did not arrive within {timeout} s")
            if self.version > collector.policy_version:
                self.flat.unpack(self.staging)
                collector.policy_version = self.version

    def close(self) -> None:
        if self.group is not None:
            self.group.shutdown() if hasattr(self.group, "shutdown") else None
            self.group = None


class WeightSender:
    """Trainer side: pack the policy into the flat buffer and push it to workers."""

    def __init__(self, flat: FlatWeights, spec: TransportSpec, buffer: torch.Tensor) -> None:
        self.flat, self.spec, self.buffer = flat, spec, buffer
        self.group: dist.ProcessGroup | None = None
        self.work: list = []

    def connect(self) -> None:
        """Join the process group (broadcast transport); workers join it at the same time."""
        if self.spec.kind == "broadcast" and self.group is None:
            self.group = process_group(self.spec, 0)

    def push(self, worker_ranks: list[int], version: int, all_workers: bool) -> str:
        """Start sending the packed buffer; returns the mode the workers must receive with."""
        if self.spec.kind == "shm":
            return "shm"
        if all_workers:
            self.work = [self.group.broadcast([self.buffer], 0)]
            return "broadcast"
        self.work = [self.group.send([self.buffer], rank, version) for rank in worker_ranks]
        return "p2p"

    def wait(self) -> None:
        """Wait until the last push left the trainer (bounded by the group's timeout)."""
        work, self.work = self.work, []
        for w in work:
            w.wait()

    def close(self) -> None:
        if self.spec.kind == "shm" and self.spec.path and os.path.exists(self.spec.path):
            os.unlink(self.spec.path)
        if self.group is not None:
            if hasattr(self.group, "shutdown"):
                self.group.shutdown()
            self.group = None
