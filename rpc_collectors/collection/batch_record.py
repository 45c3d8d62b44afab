"""What a collector knows of each batch it hands out, kept outside the batch.

Workers mark every step with the weights version that chose its action,
``("collector", "policy_version")``. The collector the user iterates reads those versions into
a :class:`BatchRecord` (``collector.last_batch``) and removes the key, so a batch has TorchRL's
key set; with ``track_policy_version=True`` the key stays in the batch too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

VERSION = ("collector", "policy_version")
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
    """

    iteration: int
    frames: int
    oldest_version: int
    newest_version: int
    trainer_version: int

    @property
    def lag(self) -> int:
        """How many weight versions the oldest frame of the batch is behind the trainer's."""
        return self.trainer_version - self.oldest_version


def take_versions(batch: TensorDictBase, keep: bool) -> tuple[int, int] | None:
    """The oldest and newest version in ``batch`` (None: it has no versions); the key is removed
    from ``batch`` unless ``keep``, and so is an empty ``"collector"`` entry."""
    if not isinstance(batch, TensorDictBase) or VERSION not in batch.keys(True):
        return None
    versions = batch.get(VERSION)
    if MASK in batch.keys(True):
        versions = versions[batch.get(MASK)]
    low, high = torch.aminmax(versions) if versions.numel() else (torch.zeros(()), torch.zeros(()))
    if not keep:
        batch.exclude(VERSION, inplace=True)
        if not batch.get("collector").keys():
            batch.exclude("collector", inplace=True)
    return int(low), int(high)
