"""What TorchRL's multi-worker collectors show of themselves, computed from what the front does:
``stats()`` with its worker views, the scheme that describes how weights travel here
(``_weight_sync_schemes``), the collect hooks carried in the workers' specs, and whether a dotted
path of ``get_distant_attr``/``map_fn`` is the trainer's (a worker's ``replay_buffer`` is the
trainer's). The front's public methods of those names call these."""
from __future__ import annotations

import dataclasses
from typing import Any

from rpc_collectors.core import pickling, torchrl_args
from rpc_collectors.core.protocol import WorkerSpec

HOOKS = ("pre_collect_hook", "post_collect_hook")

WORKER_VIEWS = ("aggregate", "per_worker", "both")


def in_trainer(path: str, replay_buffer: Any) -> bool:
    """Whether ``path`` is the replay buffer's: the workers' frames go into the one buffer the
    trainer writes, so each worker's ``replay_buffer`` is that buffer (TorchRL's workers share
    theirs)."""
    buffer_path = isinstance(path, str) and path.split(".")[0] == "replay_buffer"
    return buffer_path and replay_buffer is not None


def with_hook(specs: list[bytes], name: str, hook: Any) -> tuple[list[bytes], bytes]:
    """``specs`` with collect hook ``name`` set to ``hook`` (checked; a replaced worker is built
    with it too), and ``hook`` pickled as the worker's options are (a closure travels too)."""
    changed = []
    for spec in specs:
        loaded = WorkerSpec.loads(spec)
        changed.append(dataclasses.replace(loaded, options={**loaded.options, name: hook}).dumps())
    return changed, pickling.dumps(hook)


def weight_schemes(given: Any, no_push: bool, plane: Any, requested: str, ray: bool) -> dict:
    """``{"policy": scheme}``: the TorchRL scheme ``given`` to the constructor, or TorchRL's scheme
    for the transport the weights take (the ``plane``'s; shared memory by default on one host:
    ``SharedMemWeightSyncScheme``, as TorchRL's default; before a ``policy_factory``'s first push,
    the ``requested`` one); empty without torchrl."""
    if no_push:
        transport = torchrl_args.NO_PUSH
    elif plane is not None:
        # "shm-copy" is shared memory too
        transport = plane.spec.kind.split("-")[0]
    else:
        # policy_factory before the first push: the transport asked for ("auto": none chosen yet)
        transport = requested
    return torchrl_args.scheme_objects(given, transport, ray=ray)


def worker_stats(stats: dict, workers: str, alive: int, totals: dict[int, Any],
                 num_workers: int) -> dict:
    """``stats`` (the aggregate entries, or none for ``"per_worker"``) with ``"workers"``,
    ``"workers_alive"`` and, unless ``workers="aggregate"``, each worker's
    ``"worker_<i>/frames"`` and ``"worker_<i>/batches"`` from ``totals`` (what each delivered)."""
    stats["workers"] = int(num_workers)
    stats["workers_alive"] = alive
    if workers != "aggregate":
        for i in range(num_workers):
            frames, batches = totals.get(i, (0, 0))
            stats[f"worker_{i}/frames"], stats[f"worker_{i}/batches"] = int(frames), int(batches)
    return stats


def check_workers_view(workers: Any) -> None:
    if workers not in WORKER_VIEWS:
        raise ValueError(f"workers={workers!r} is invalid: workers must be one of 'aggregate', "
                         "'per_worker' or 'both'")
