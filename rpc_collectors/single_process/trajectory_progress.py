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
    """Counts, over the batches given to :meth:`add`, the frames of ended and of running
    trajectories.

    ``completed_frames + pending_frames`` is every frame added; ``pending`` holds each running
    stream's frames so far (a stream cut without a done, by ``reset_at_each_iter``, stays there).
    :meth:`add` only keeps each batch's streams and done flags (a copy, so no batch memory is held);
    they are counted together when a counter is read, or once ``QUEUED`` batches or
    ``QUEUED_FRAMES`` frames wait: counting a run of batches at once gives what counting them one by
    one does, at a fraction of the cost per batch.
    """

    # batches, frames kept at most before they are counted
    QUEUED, QUEUED_FRAMES = 64, 1 << 16

    def __init__(self, key: str | tuple) -> None:
        self.key = key
        # stream -> frames since its last done
        self._pending: dict[int, int] = {}
        self._completed_frames = 0
        self._completed_trajectories = 0
        # (streams, done) of batches not counted yet
        self._queued: list[tuple[np.ndarray, np.ndarray]] = []
        self._queued_frames = 0
        # frames written into the replay buffer
        self.written_frames = 0

    @property
    def pending(self) -> dict[int, int]:
        self._count()
        return self._pending

    @property
    def completed_frames(self) -> int:
        self._count()
        return self._completed_frames

    @property
    def completed_trajectories(self) -> int:
        self._count()
        return self._completed_trajectories

    @property
    def pending_frames(self) -> int:
        return sum(self.pending.values())

    def add(self, batch: TensorDictBase) -> None:
        """Count the frames of ``batch`` (before ``split_trajs`` and ``postproc``)."""
        if not isinstance(batch, TensorDictBase) or DONE not in batch.keys(True):
            return
        done = batch.get(DONE).reshape(*batch.shape, -1).any(-1).reshape(-1).cpu().numpy()
        streams = batch.get(self.key, None)
        # one stream per row: a row's steps are one env's
        if streams is None:
            rows = batch.shape[:-1].numel() if batch.batch_dims > 1 else 1
            streams = np.repeat(np.arange(rows), batch.shape[-1])
        else:
            # a copy: the batch's memory is the user's
            streams = np.array(streams.reshape(-1).cpu().numpy())
        self._queued.append((streams, done))
        self._queued_frames += len(streams)
        if len(self._queued) >= self.QUEUED or self._queued_frames >= self.QUEUED_FRAMES:
            self._count()

    def _count(self) -> None:
        """Count the queued batches, in the order they were added."""
        if not self._queued:
            return
        streams, done = (np.concatenate(parts) for parts in zip(*self._queued))
        self._queued.clear()
        self._queued_frames = 0
        valid = streams >= 0
        streams, done = streams[valid], done[valid]
        if not len(streams):
            return
        ids, inverse = np.unique(streams, return_inverse=True)
        steps = np.arange(len(streams))
        last_done = np.full(len(ids), -1)
        np.maximum.at(last_done, inverse[done], steps[done])
        frames = np.bincount(inverse, minlength=len(ids))
        after = np.bincount(inverse, weights=steps > last_done[inverse], minlength=len(ids)).astype(
            np.int64
        )
        ends = np.bincount(inverse[done], minlength=len(ids))
        self._completed_trajectories += int(ends.sum())
        for stream, count, left, ended in zip(ids.tolist(), frames.tolist(), after.tolist(),
                                              ends.tolist()):
            before = self._pending.pop(stream, 0)
            if ended:
                self._completed_frames += before + count - left
            else:
                left = before + count
            if left:
                self._pending[stream] = left

    def counters(self) -> dict[str, int]:
        """TorchRL's names for them, as ``stats()`` gives them."""
        return {"trajectory_completed_frames": self.completed_frames,
                "trajectory_pending_frames": self.pending_frames,
                "replay_written_frames": self.written_frames,
                "completed_trajectories": self.completed_trajectories}

    def state(self) -> dict:
        return {"pending": dict(self.pending), "completed_frames": self.completed_frames,
                "completed_trajectories": self.completed_trajectories,
                "written_frames": self.written_frames}

    def load(self, state: dict | None) -> None:
        """Restore :meth:`state` (None: a state saved without counters, which start from 0)."""
        state = state or {}
        self._queued.clear()
        self._queued_frames = 0
        self._pending = {int(k): int(v) for k, v in state.get("pending", {}).items()}
        self._completed_frames = int(state.get("completed_frames", 0))
        self._completed_trajectories = int(state.get("completed_trajectories", 0))
        self.written_frames = int(state.get("written_frames", 0))
