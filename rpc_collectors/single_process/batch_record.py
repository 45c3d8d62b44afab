"""What a collector knows of each batch it hands out, kept outside the batch.

Workers mark every step with the weights version that chose its action,
``("collector", "policy_version")``, and a multi-worker collector marks it with the worker that
collected it, ``("collector", "worker_id")``. The collector the user iterates reads both into a
:class:`BatchRecord` (``collector.last_batch``) and removes the keys, so a batch has TorchRL's
key set; with ``track_policy_version=True`` the keys stay in the batch too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

# the entry holding the keys below
MARKS = "collector"
VERSION = (MARKS, "policy_version")
WORKER_ID = (MARKS, "worker_id")
# steps a preempted worker did not collect are False
MASK = (MARKS, "mask")


@dataclass(frozen=True)
class BatchRecord:
    """One batch as the collector handed it out.

    Attributes:
        iteration: the batch's number in the run, from 1.
        frames: the frames it holds (steps a preempted worker did not collect not counted).
        oldest_version, newest_version: the oldest and newest weights versions that chose an
            action in it (``policy_version`` counts ``update_policy_weights_`` calls).
        trainer_version: the newest weights version pushed when the collector handed the batch out
            (a multi-worker collector's ``pushed_version``; ``policy_version`` is the acknowledged
            one).
        worker_frames: the frames each worker (by id) collected in it; None for a single-process
            collector. An async batch is one worker's.
    """

    iteration: int
    frames: int
    oldest_version: int
    newest_version: int
    trainer_version: int
    worker_frames: dict[int, int] | None = None

    @property
    def lag(self) -> int:
        """How many weight versions the oldest frame of the batch is behind the trainer's."""
        return self.trainer_version - self.oldest_version

    @property
    def min_lag(self) -> int:
        """How many weight versions the newest frame of the batch is behind the trainer's."""
        return self.trainer_version - self.newest_version


def take(batch: TensorDictBase, keep: bool) -> tuple[tuple[int, int] | None, torch.Tensor | None]:
    """The oldest and newest version in ``batch`` (None: it has no versions) and its worker ids
    (None: it has none); the keys are removed from ``batch`` unless ``keep``, and so is an empty
    ``"collector"`` entry."""
    if not isinstance(batch, TensorDictBase):
        return None, None
    # the entry is read once: each nested get walks the batch again
    marks = batch.get(MARKS, None)
    if marks is None:
        return None, None
    ids = marks.get(WORKER_ID[1], None)
    found = marks.get(VERSION[1], None)
    versions = None
    # meta: placed where nothing can be read
    if found is not None and not found.is_meta:
        mask = marks.get(MASK[1], None)
        if mask is not None:
            found = found[mask]
        versions = _low_high(found) if found.numel() else (0, 0)
    if not keep:
        marks.pop(VERSION[1], None)
        marks.pop(WORKER_ID[1], None)
        if not marks.keys():
            batch.del_(MARKS)
    return versions, ids


def _low_high(values: torch.Tensor) -> tuple[int, int]:
    low, high = torch.aminmax(values)
    return int(low), int(high)


def oldest_version(batch: TensorDictBase) -> int | None:
    """The weights version of ``batch``'s oldest step (None: it names no version)."""
    if VERSION not in batch.keys(include_nested=True):
        return None
    return int(batch.get(VERSION).min())


def workers_in(batch: TensorDictBase) -> list[int]:
    """The ids of the workers whose steps ``batch`` holds, ascending."""
    return sorted(frames_per_worker(batch.get(WORKER_ID), None))


def frames_per_worker(ids: torch.Tensor | None, mask: torch.Tensor | None) -> dict[int, int] | None:
    """Frames per worker id of a batch whose steps carry ``ids`` (its collected steps: ``mask``)."""
    if ids is None or ids.is_meta:
        return None
    if mask is not None:
        ids = ids[mask]
    if not ids.numel():
        return {}
    low, high = _low_high(ids)
    # one worker's batch (async collectors): no need to count
    if low == high:
        return {low: ids.numel()}
    workers, counts = torch.unique(ids, return_counts=True)
    return dict(zip(workers.tolist(), counts.tolist()))


def record(collector: Any, batch: TensorDictBase, frames: int) -> None:
    """Read the versions and worker ids of ``batch`` (of ``frames`` frames) into ``collector``: its
    ``last_batch`` (where the batch has versions), ``_worker_ids`` (those of its steps) and
    ``_worker_totals`` (the frames and batches each worker delivered)."""
    mask = batch.get(MASK, None) if isinstance(batch, TensorDictBase) else None
    versions, collector._worker_ids = take(batch, collector.track_policy_version
                                           or collector.keep_version_key)
    if versions is None:
        return
    workers = frames_per_worker(collector._worker_ids, mask)
    collector.last_batch = BatchRecord(collector._iter, frames, *versions,
                                       collector._newest_version(), workers)
    for worker, count in (workers or {}).items():
        totals = collector._worker_totals.setdefault(worker, [0, 0])
        totals[0], totals[1] = totals[0] + count, totals[1] + 1
