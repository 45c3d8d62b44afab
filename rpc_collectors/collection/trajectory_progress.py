"""TorchRL's progress counters of a collector's ``stats()``: how many of the frames handed out
belong to trajectories that ended, how many to trajectories still running, and how many went
into the ``replay_buffer``.

A trajectory ends at its step whose ``("next", "done")`` is set. Steps are told apart by a
stream key: ``("collector", "traj_ids")`` (one stream per trajectory), a collector's own key
where its batches carry no ids (``AsyncBatchedCollector``: the env index), or, without either,
the batch's row (one env's steps, in the same row of every batch). Padded steps (id -1, a
preempted worker's) are not frames and are not counted.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

DONE = ("next", "done")


class TrajectoryProgress:
    """Counts, over the batches given to :meth:`add`, the frames of ended and of running trajectories.

    ``completed_frames + pending_frames`` is every frame added; ``pending`` holds each running
    stream's frames so far (a stream cut without a done, by ``reset_at_each_iter``, stays there).
    """

    def __init__(self, key: str | tuple) -> None:
        self.key = key
        self.pending: dict[int, int] = {}  # stream -> frames since its last done
        self.completed_frames = 0
        self.completed_trajectories = 0
        self.written_frames = 0  # frames written into the replay buffer

    @property
    def pending_frames(self) -> int:
        return sum(self.pending.values())

    def add(self, batch: TensorDictBase) -> None:
        """Count the frames of ``batch`` (before ``split_trajs`` and ``postproc``)."""
        if not isinstance(batch, TensorDictBase) or DONE not in batch.keys(True):
            return
        done = batch.get(DONE).reshape(*batch.shape, -1).any(-1).reshape(-1)
        streams = batch.get(self.key, None)
        if streams is None:  # one stream per row: a row's steps are one env's
            rows = batch.shape[:-1].numel() if batch.batch_dims > 1 else 1
            streams = torch.arange(rows).repeat_interleave(batch.shape[-1])
        streams = streams.reshape(-1).to("cpu", torch.int64)
        done, valid = done.to("cpu"), streams >= 0
        streams, done = streams[valid], done[valid]
        if not len(streams):
            return
        ids, inverse = torch.unique(streams, return_inverse=True)
        steps = torch.arange(len(streams))
        last_done = torch.full((len(ids),), -1, dtype=torch.int64).scatter_reduce(
            0, inverse, torch.where(done, steps, -1), "amax")
        frames = torch.bincount(inverse, minlength=len(ids))
        after = torch.bincount(inverse, weights=(steps > last_done[inverse]).double(), minlength=len(ids)).long()
        ends = torch.bincount(inverse, weights=done.double(), minlength=len(ids)).long()
        self.completed_trajectories += int(ends.sum())
        for stream, count, left, ended in zip(ids.tolist(), frames.tolist(), after.tolist(), ends.tolist()):
            before = self.pending.pop(stream, 0)
            if ended:
                self.completed_frames += before + count - left
            else:
                left = before + count
            if left:
                self.pending[stream] = left

    def state(self) -> dict:
        return {"pending": dict(self.pending), "completed_frames": self.completed_frames,
                "completed_trajectories": self.completed_trajectories, "written_frames": self.written_frames}

    def load(self, state: dict | None) -> None:
        """Restore :meth:`state` (None: a state saved without counters, which start from 0)."""
        state = state or {}
        self.pending = {int(k): int(v) for k, v in state.get("pending", {}).items()}
        self.completed_frames = int(state.get("completed_frames", 0))
        self.completed_trajectories = int(state.get("completed_trajectories", 0))
        self.written_frames = int(state.get("written_frames", 0))
