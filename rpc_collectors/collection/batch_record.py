"""What a collector knows of each batch it hands out, kept outside the batch.

Workers mark every step with the weights version that chose its action,
``("collector", "policy_version")``, and a multi-worker collector marks it with the worker that
collected it, ``("collector", "worker_id")``. The collector the user iterates reads both into a
:class:`BatchRecord` (``collector.last_batch``) and removes the keys, so a batch has TorchRL's
key set; with ``track_policy_version=True`` the keys stay in the batch too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

VERSION = ("collector", "policy_version")
WORKER_ID = ("collector", "worker_id")
MASK = ("collector", "mask")  # steps a preempted worker did not collect are False


@dataclass(frozen=True)
class BatchRecord:
    """One batch as the collector handed it out.

    Attributes:
        iteration: the batch's number in the run, from 1.
        frames: the frames it holds (steps a preempted worker did not collect not counted).
        oldest_version, newest_version: the oldest and newest weights versions that chose an
            action in it (``policy_version`` counts ``update_policy_weights_`` calls).
        trainer_version: the collector's ``policy_version`` when it handed the batch out.
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
    if not isinstance(batch, TensorDictBase) or "collector" not in batch.keys():
        return None, None
    keys = batch.get("collector").keys()
    ids = batch.get(WORKER_ID) if "worker_id" in keys else None
    versions = None
    if "policy_version" in keys and not batch.get(VERSION).is_meta:  # meta: placed where nothing can be read
        found = batch.get(VERSION)
        if "mask" in keys:
            found = found[batch.get(MASK)]
        low, high = torch.aminmax(found) if found.numel() else (torch.zeros(()), torch.zeros(()))
        versions = int(low), int(high)
    if not keep:
        batch.exclude(VERSION, WORKER_ID, inplace=True)
        if not batch.get("collector").keys():
            batch.exclude("collector", inplace=True)
    return versions, ids


def frames_per_worker(ids: torch.Tensor | None, mask: torch.Tensor | None) -> dict[int, int] | None:
    """Frames per worker id of a batch whose steps carry ``ids`` (its collected steps: ``mask``)."""
    if ids is None or ids.is_meta:
        return None
    workers, counts = torch.unique(ids if mask is None else ids[mask], return_counts=True)
    return dict(zip(workers.tolist(), counts.tolist()))
