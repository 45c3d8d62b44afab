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

import numpy as np
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
        done = batch.get(DONE).reshape(*batch.shape, -1).any(-1).reshape(-1).cpu().numpy()
        streams = batch.get(self.key, None)
        if streams is None:  # one stream per row: a row's steps are one env's
            rows = batch.shape[:-1].numel() if batch.batch_dims > 1 else 1
            streams = np.repeat(np.arange(rows), batch.shape[-1])
        else:
            streams = streams.reshape(-1).cpu().numpy()
        valid = streams >= 0
        streams, done = streams[valid], done[valid]
        if not len(streams):
            return
        ids, inverse = np.unique(streams, return_inverse=True)
        steps = np.arange(len(streams))
        last_done = np.full(len(ids), -1)
        np.maximum.at(last_done, inverse[done], steps[done])
        frames = np.bincount(inverse, minlength=len(ids))
        after = np.bincount(inverse, weights=steps > last_done[inverse], minlength=len(ids)).astype(np.int64)
        ends = np.bincount(inverse[done], minlength=len(ids))
        self.completed_trajectories += int(ends.sum())
        for stream, count, left, ended in zip(ids.tolist(), frames.tolist(), after.tolist(), ends.tolist()):
            before = self.pending.pop(stream, 0)
            if ended:
                self.completed_frames += before + count - left
            else:
                left = before + count
            if left:
                self.pending[stream] = left

    def counters(self) -> dict[str, int]:
        """TorchRL's names for them, as ``stats()`` gives them."""
        return {"trajectory_completed_frames": self.completed_frames, "trajectory_pending_frames": self.pending_frames,
                "replay_written_frames": self.written_frames, "completed_trajectories": self.completed_trajectories}

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
