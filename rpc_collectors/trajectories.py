"""Trajectory bookkeeping: run-unique trajectory ids and splitting batches into trajectories."""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDictBase

TRAJ_IDS = ("collector", "traj_ids")
MASK = ("collector", "mask")


class TrajectoryIds:
    """Hands out trajectory ids ``start, start + stride, start + 2 * stride, ...``.

    Worker ``w`` of ``n`` uses ``start=w, stride=n``, so ids never collide across workers and
    are never reused within a run.
    """

    def __init__(self, start: int = 0, stride: int = 1) -> None:
        self.start, self.stride, self.count = start, stride, 0

    def new(self, n: int) -> np.ndarray:
        ids = self.start + self.stride * np.arange(self.count, self.count + n, dtype=np.int64)
        self.count += n
        return ids


def split_trajectories(td: TensorDictBase) -> TensorDictBase:
    """Split a ``[T]``, ``[B, T]`` or ``[N, B, T]`` batch into ``[n_traj, T_max]`` trajectories, zero padded.

    Time is the last dim. Trajectories are the runs of equal ``("collector", "traj_ids")`` along
    it, in each env's row; ``("collector", "mask")`` is True on real steps and False on padding.
    """
    if td.batch_dims < 1:
        raise ValueError(
            f"split_trajectories: td has batch size {list(td.batch_size)}; accepted: [T], [B, T], [N, B, T] "
            "(time last)"
        )
    if TRAJ_IDS not in td.keys(include_nested=True):
        raise KeyError(f"split_trajectories: td has no {TRAJ_IDS} entry")
    rows = td.reshape(-1, td.shape[-1])
    ids = rows.get(TRAJ_IDS)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    starts = starts.reshape(-1)
    segment = torch.cumsum(starts.long(), 0) - 1
    first = torch.nonzero(starts).squeeze(-1)
    position = torch.arange(starts.numel()) - first[segment]
    n_traj, t_max = int(first.numel()), int(position.max()) + 1
    flat = rows.reshape(-1)
    out = flat.apply(lambda x: x.new_zeros((n_traj, t_max, *x.shape[1:])), batch_size=[n_traj, t_max])
    out[segment, position] = flat
    mask = torch.zeros(n_traj, t_max, dtype=torch.bool)
    mask[segment, position] = True
    out.set(MASK, mask)
    out.refine_names(None, "time")
    return out
