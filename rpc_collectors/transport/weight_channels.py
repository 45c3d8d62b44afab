"""What both ends of the weight plane (:mod:`.weight_sync`) share: the :class:`TransportSpec` a
worker joins with, the shared-memory file of two slots, the weights' own process group, and the
receive modes a push names.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rpc_collectors.transport import shm


@dataclass(frozen=True)
class TransportSpec:
    """What a worker needs to join the weight plane: ``kind`` "shm", "shared", "broadcast" or "rpc";
    ``path`` the shared-memory file; ``addr``, ``port``, ``prefix``: the broadcast's store address,
    port and key prefix; ``signature``: (key, dtype, shape) of every tensor, as the trainer lays
    them out."""

    kind: str
    nbytes: int
    path: str | None = None
    addr: str | None = None
    port: int | None = None
    prefix: str | None = None
    world_size: int = 0
    backend: str = "gloo"
    interface: str | None = None
    timeout: float = 60.0
    signature: tuple = ()


SHM_SLOTS = 2
# the kinds whose weights lie in a shared-memory file (one host), and the slots of that file: "shm"
# packs each version into the one not read last; "shared" is the one memory of the trainer's
# policy and every worker's
SLOTS = {"shm": SHM_SLOTS, "shared": 1}


def map_slots(path: str, nbytes: int, kind: str = "shm") -> list[torch.Tensor]:
    """Map the shared-memory file at ``path``: its ``SLOTS[kind]`` slots of ``nbytes`` each."""
    count = SLOTS[kind]
    whole = torch.from_file(path, shared=True, size=max(count * nbytes, 1), dtype=torch.uint8)
    return [whole[i * nbytes:(i + 1) * nbytes] for i in range(count)]


def shm_file(nbytes: int, kind: str = "shm") -> tuple[str, int, torch.Tensor]:
    """Create a nameless shared-memory file for weights of ``nbytes`` (``SLOTS[kind]`` slots);
    returns the path to open it by, its descriptor and slot 0 (see
    :mod:`rpc_collectors.transport.shm`).

    Close the descriptor once every worker mapped it. The pages are touched here, so the first
    update does not pay the page faults.
    """
    count = SLOTS[kind]
    fd, path = shm.nameless_file(
        "weights", count * nbytes, "the shared-memory weights file",
        f": {count} copies of the policy's {nbytes} bytes", "use weight_transport='broadcast'",
    )
    slots = map_slots(path, nbytes, kind)
    for slot in slots:
        slot.zero_()
    return path, fd, slots[0]


def parse_mode(mode: str) -> tuple[str, int]:
    """A receive mode's kind and slot: ``"shm:1"`` is ``("shm", 1)``, ``"rpc"`` ``("rpc", 0)``."""
    kind, _, slot = mode.partition(":")
    return kind, int(slot or 0)


def process_group(spec: TransportSpec, rank: int) -> dist.ProcessGroup:
    """Join the weight process group (never the default group) through a prefixed store."""
    timeout = datetime.timedelta(seconds=spec.timeout)
    store = dist.PrefixStore(spec.prefix,
                             dist.TCPStore(spec.addr, spec.port, is_master=False, timeout=timeout))
    # its waits bounded as gloo's (NCCL's own default: 10 minutes)
    if spec.backend == "nccl":
        nccl = dist.ProcessGroupNCCL.Options()
        nccl._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, spec.world_size, nccl)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    gloo = dist.ProcessGroupGloo
    if spec.interface:
        device = gloo.create_device(interface=spec.interface)
    else:
        device = gloo.create_default_device()
    options._devices = [device]
    return dist.ProcessGroupGloo(store, rank, spec.world_size, options)
