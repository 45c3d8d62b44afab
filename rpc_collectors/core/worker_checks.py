"""Checks of a multi-worker collector's own arguments, run before any process starts: the
workers' devices and ids, frames per worker, restarts, elastic runs and ports."""
from __future__ import annotations

from typing import Any

import torch

from rpc_collectors.core import options
from rpc_collectors.core.checks import (
    _is_int,
    boolean,
    device,
    devices,
    interruptor,
)


def worker_devices_of(device_: Any, storing_device: Any, env_device: Any, policy_device: Any,
                      num_workers: int) -> dict:
    """The four device arguments of a multi-worker collector, each one device or TorchRL's list of
    one per worker: ``policy_device`` per worker (a list if they differ), and the trainer's
    ``storing_device`` (the workers' common one; the CPU if they differ, as TorchRL gathers them
    there)."""
    def per_worker(value: Any) -> list:
        return list(value) if isinstance(value, (list, tuple)) else [value] * num_workers

    given = (device_, storing_device, env_device, policy_device)
    resolved = [devices(*values) for values in zip(*map(per_worker, given))]
    storing = {d["storing_device"] for d in resolved}
    policy = [d["policy_device"] for d in resolved]
    return {
        "storing_device": storing.pop() if len(storing) == 1 else torch.device("cpu"),
        "policy_device": policy[0] if len(set(policy)) == 1 else policy,
    }


def frames_per_worker(value: Any, num_workers: int, sync: bool, cat_results: Any) -> list[int]:
    """TorchRL's ``frames_per_batch`` list: one positive int per worker; in sync mode batches of
    different lengths cannot be stacked (TorchRL's cannot either): concatenated along time only."""
    # each an int > 0 (the options table checked them)
    frames = list(value)
    if len(frames) != num_workers:
        raise ValueError(
            f"frames_per_batch has {len(frames)} entries for {num_workers} workers. If "
            "`frames_per_batch` is provided as a sequence, it should "
            "contain exactly one value per worker."
        )
    if sync and len(set(frames)) > 1 and cat_results != -1:
        raise ValueError(
            f"frames_per_batch={frames} gives the workers batches of different lengths, which "
            f"cat_results={cat_results!r} cannot combine; accepted: cat_results=-1 "
            "(concatenated along time), or equal frames"
        )
    return frames


def _canonical(d: torch.device) -> torch.device:
    return torch.device(d.type, 0) if d.type == "cuda" and d.index is None else d


def worker_devices(worker_ids: Any, devices: list[torch.device]) -> list[int] | None:
    """TorchRL's device form of ``worker_ids`` (a ``torch.device`` or a list of them): the ids of
    the workers whose policy runs on one of them; None when ``worker_ids`` is not in that form."""
    items = list(worker_ids) if isinstance(worker_ids, (list, tuple)) else [worker_ids]
    if not items or not all(isinstance(d, torch.device) for d in items):
        return None
    wanted = {_canonical(d) for d in items}
    return [i for i, d in enumerate(devices) if _canonical(d) in wanted]


def worker_ids(value: Any, num_workers: int, device: torch.device | list) -> list[int]:
    """``worker_ids`` of ``update_policy_weights_``: None (all), ids in ``0..num_workers - 1``, or
    TorchRL's form, the ``torch.device`` where the workers' policy runs (``device``: every worker's,
    or a list of one per worker)."""
    if value is None:
        return list(range(num_workers))
    on_device = worker_devices(value,
                               device if isinstance(device, list) else [device] * num_workers)
    if on_device is not None:
        if not on_device:
            raise ValueError(f"worker_ids={value!r}: no worker runs its policy there; the "
                             f"workers' policy device is {device}")
        return on_device
    ids = [value] if isinstance(value, int) else list(value)
    bad = [i for i in ids
           if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_workers]
    if bad or not ids:
        raise ValueError(f"worker_ids={value!r} is invalid; accepted: None or "
                         f"ids in 0..{num_workers - 1}")
    return sorted(set(ids))


def per_worker_weights(value: Any, worker_ids: Any) -> bool:
    """Whether ``update_policy_weights_`` was given TorchRL's per-worker form ``{worker_id:
    weights}`` (int keys; a state dict has str keys); with ``worker_ids`` too, a ``ValueError``."""
    if not isinstance(value, dict) or not value or not all(type(key) is int for key in value):
        return False
    if worker_ids is not None:
        raise ValueError(f"worker_ids={worker_ids!r} with weights per worker ({sorted(value)}): "
                         "the keys name the workers; accepted with them: worker_ids=None")
    return True


# the options of a worker's Collector checked here when collector_kwargs sets
# them (the others in the worker)
_COLLECTOR_KWARGS_CHECKED = ("init_random_frames", "exploration_type", "max_frames_per_traj",
                             "reset_at_each_iter", "track_policy_version", "set_truncated",
                             "track_traj_ids", "compact_obs", "reset_when_done", "compile_policy",
                             "pre_collect_hook", "auto_register_policy_transforms", "use_buffers",
                             "post_collect_hook", "trust_policy", "cudagraph_policy")
_DEVICES = ("device", "storing_device", "env_device", "policy_device")


def collector_kwargs(kwargs: dict) -> None:
    """Check the values of a multi-worker collector's ``collector_kwargs`` here,
    before any worker starts."""
    for key, value in kwargs.items():
        if key in _DEVICES:
            device(f"collector_kwargs[{key!r}]", value)
        elif key in _COLLECTOR_KWARGS_CHECKED:
            options.check(key, value, f"collector_kwargs[{key!r}]")
        elif key == "no_cuda_sync":
            # Collector's own arguments, outside the table
            boolean(f"collector_kwargs[{key!r}]", value)
        elif key == "interruptor":
            interruptor(value, f"collector_kwargs[{key!r}]")


def max_worker_restarts(count: int, launcher: str, weight_transport: str, backend: str) -> int:
    """A restart budget >= 0; above 0 only where the collector starts its workers itself and a
    newcomer can get the weights (shared memory; the broadcast group is fixed): local, debug and Ray
    workers, and collector jobs the trainer submits (``launcher="submitit"``) with RPC weights.
    ``count`` as the options table checked it (an int >= 0)."""
    # a job submitted in a failed one's place, on any node: weights by RPC
    if count and launcher == "submitit":
        if weight_transport != "rpc":
            raise ValueError(
                f"max_worker_restarts={count!r} with launcher='submitit' needs "
                "weight_transport='rpc' (the job that replaces a failed one may run on any node); "
                f"accepted with weight_transport={weight_transport!r}: 0"
            )
        return count
    if count and launcher not in ("local", "debug", "ray"):
        raise ValueError(
            f"max_worker_restarts={count!r} needs a launcher that starts the workers itself; "
            f"accepted with launcher={launcher!r}: 0 (launchers that restart "
            "workers: 'local', 'debug'; RayCollector)"
        )
    if count and (weight_transport == "broadcast" or backend == "nccl"):
        raise ValueError(
            f"max_worker_restarts={count!r} needs the shared-memory weight transport; accepted "
            f"with weight_transport={weight_transport!r}, backend={backend!r}: 0"
        )
    return count


def elastic(weight_transport: str, backend: str) -> None:
    """Elastic membership moves weights as RPC arguments: no fixed group, no shared file."""
    if weight_transport not in ("auto", "rpc"):
        raise ValueError(
            f"weight_transport={weight_transport!r} does not work with elastic=True (collectors "
            "join and leave); accepted: 'auto' or 'rpc'"
        )
    if backend != "gloo":
        raise ValueError(f"backend={backend!r} does not work with elastic=True (no fixed "
                         "weight group); accepted: 'gloo'")


def shared_weights(weight_transport: str, collector_class: Any, node: bool,
                   policy_device: Any) -> None:
    """``"shared"`` weights (SharedMemWeightSyncScheme) make each worker's policy the trainer's
    memory: CPU policies only, and no node collectors (their local workers hold copies of the
    node's policy)."""
    if weight_transport != "shared":
        return
    if node:
        raise ValueError(
            f"weight_transport='shared' (SharedMemWeightSyncScheme) does not work with node "
            f"collectors (collector_class={collector_class!r}), whose local workers hold copies "
            "of their node's policy; accepted: weight_transport='shm', or collector_class='single'")
    places = policy_device if isinstance(policy_device, list) else [policy_device]
    if any(d is not None and d.type != "cpu" for d in places):
        raise ValueError(
            f"weight_transport='shared' (SharedMemWeightSyncScheme) needs the workers' policies on "
            f"the CPU, not {policy_device}; accepted: weight_transport='shm', or CPU devices")


def tcp_port(value: Any, launcher: str) -> int | None:
    """TorchRL's ``tcp_port``: where this process listens (local workers: the weight group's store;
    submitit: the rendezvous its jobs join); None: a free port. Torchrun/SLURM use
    ``MASTER_PORT``."""
    if value is None:
        return None
    port = int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else value
    if not _is_int(port) or not 0 < port < 65536:
        raise ValueError(
            f"tcp_port={value!r} is invalid; accepted: None (a free port) or a port number in "
            "1..65535, as an int or a string of digits"
        )
    if launcher not in ("local", "submitit"):
        raise ValueError(
            f"tcp_port={value!r} does not apply to launcher={launcher!r} (torchrun and SLURM ranks "
            "meet at MASTER_PORT, debug workers need no port); accepted: None, or "
            "launcher 'mp', 'local' or 'submitit'"
        )
    return int(port)
