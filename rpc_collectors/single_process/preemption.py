"""TorchRL's ``preemptive_threshold``: a sync round ends once that fraction of the workers handed
in their batch; the others stop at their next step and hand in what they have.

Worker side, :class:`Preemption` numbers the batches a worker is asked for, so that a stop the
trainer sent for one batch never cuts the next one short. A cut batch is padded to full length:
the padded steps have ``("collector", "traj_ids")`` -1 and ``("collector", "mask")`` False.
Trainer side, :func:`valid_frames` counts the frames that were collected and :func:`drop_padding`
removes the padded steps where the layout allows it (``cat_results=-1``), as TorchRL does.
"""
from __future__ import annotations

import math
import threading

import torch
from tensordict import TensorDictBase, pad

from rpc_collectors.single_process.trajectories import TRAJ_IDS

MASK = ("collector", "mask")


class Preemption:
    """A worker's batch numbers and the trainer's stops: ``stop(n)`` ends batch ``n`` (counted
    from 1 by :meth:`begin`), also when it arrives before that batch began."""

    def __init__(self) -> None:
        # batches begun
        self.started = 0
        # batches up to this one are to stop
        self.until = 0
        self._lock = threading.Lock()

    def begin(self) -> None:
        self.started += 1

    def stop(self, batch: int) -> None:
        with self._lock:
            self.until = max(self.until, int(batch))

    def stopped(self) -> bool:
        """Checked after each step of the batch in progress."""
        return self.until >= self.started


def padded(batch: TensorDictBase, steps: int) -> TensorDictBase:
    """``batch`` (``[..., t]``, ``t <= steps``) padded with zeros to ``steps`` steps, with its mask;
    padded steps have trajectory id -1."""
    time = batch.batch_dims - 1
    collected = batch.shape[time]
    mask = torch.ones(batch.shape, dtype=torch.bool)
    if collected < steps:
        names = batch.names
        batch = pad(batch, [0, 0] * time + [0, steps - collected])
        batch.names = names
        mask = torch.nn.functional.pad(mask, (0, steps - collected))
        if TRAJ_IDS in batch.keys(True):
            batch.get(TRAJ_IDS)[..., collected:] = -1
    batch.set(MASK, mask)
    return batch


def valid_frames(batch: TensorDictBase) -> int:
    """Frames collected in ``batch``: those its mask marks, if it has one."""
    mask = batch.get(MASK, None)
    return batch.numel() if mask is None else int(mask.sum())


def row_frames(batch: TensorDictBase) -> list[int]:
    """:func:`valid_frames` of each row of ``batch`` (a sync round ``[N, ...]``)."""
    mask = batch.get(MASK, None)
    if mask is None:
        return [math.prod(batch.shape[1:])] * batch.shape[0]
    return mask.reshape(batch.shape[0], -1).sum(1).tolist()


def drop_padding(batch: TensorDictBase) -> TensorDictBase:
    """``batch`` without its padded steps (along the last dim) and without the mask."""
    mask = batch.get(MASK)
    valid = mask.reshape(-1, mask.shape[-1]).any(0)
    return batch[..., valid].exclude(MASK)


def no_length(threshold: float) -> TypeError:
    """The error of ``len()`` on a collector whose rounds may be cut short."""
    return TypeError(
        f"len() of a collector with preemptive_threshold={threshold!r} is unknown before the run: "
        "rounds cut short hold fewer frames, so reaching total_frames takes more batches than "
        "total_frames / frames_per_batch; iterate until the collector stops (collector.frames "
        "counts the frames) or, for a known number of batches, accepted: preemptive_threshold=None"
    )
