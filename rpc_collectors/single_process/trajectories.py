"""Trajectory bookkeeping: run-unique trajectory ids and splitting batches into trajectories.

Ids never repeat within a run: worker ``w`` of ``n`` hands out ``w + k * n``
(:class:`TrajectoryIds`), a replacement or resumed worker continues above every ``k`` its slot used,
and each start of the run (the first, and every resume, counted outside the saved state:
:mod:`~rpc_collectors.cluster.run_starts`) hands its ids out in a range of its own
(:func:`shift_ids`)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

TRAJ_IDS = ("collector", "traj_ids")
# the ids of one start of a run (its first, each resume) lie in [n, n + 1) * STARTS_APART
STARTS_APART = 2**44


class TrajectoryIds:
    """Hands out trajectory ids ``start, start + stride, start + 2 * stride, ...``.

    Worker ``w`` of ``n`` uses ``start=w, stride=n``, so ids never collide across workers and
    are never reused within a run.
    """

    def __init__(self, start: int = 0, stride: int = 1) -> None:
        self.start, self.stride, self.count = start, stride, 0

    def peek(self, n: int = 0) -> int:
        """The id :meth:`new` hands out after ``n`` more."""
        return self.start + self.stride * (self.count + n)

    def new(self, n: int) -> np.ndarray:
        ids = self.start + self.stride * np.arange(self.count, self.count + n, dtype=np.int64)
        self.count += n
        return ids


def pool_state(next_id: int, start: int) -> dict:
    """TorchRL's ``state_dict()["traj_pool"]``: ``{"traj_id": tensor}``, an id above every id handed
    out so far and those the envs' current trajectories hold (``next_id``, before
    :func:`shift_ids`). It is read from the trajectory counts, not loaded: a loaded collector's envs
    start new trajectories."""
    return {"traj_id": torch.tensor(next_id + start * STARTS_APART if start else next_id)}


def shift_ids(batch: Any, start: int) -> None:
    """Move ``batch``'s trajectory ids into the range of the ``start``-th start of the run (0: the
    first, unchanged): a resume from a checkpoint never hands out an id that a start before it
    handed out after that checkpoint. Workers number ids as if each start were the first."""
    if start and isinstance(batch, TensorDictBase) and TRAJ_IDS in batch.keys(include_nested=True):
        ids = batch.get(TRAJ_IDS)
        # -1: a preempted worker's padding
        batch.set(TRAJ_IDS, torch.where(ids >= 0, ids + start * STARTS_APART, ids))


def split_trajectories(
    td: TensorDictBase,
    *,
    prefix: Any = None,
    trajectory_key: Any = None,
    done_key: Any = None,
    as_nested: bool | torch.layout = False,
) -> TensorDictBase:
    """Split a ``[T]``, ``[B, T]`` or ``[N, B, T]`` batch into ``[n_traj, T_max]`` trajectories,
    zero padded.

    TorchRL's signature and keys. Time is the last dim; trajectories are the runs of equal ids
    along it, in each env's row. The ids are read at ``trajectory_key``, else at ``(prefix,
    "traj_ids")`` (``prefix`` defaults to ``"collector"`` when ``td`` has that entry, else
    none: ``"traj_ids"``); without ids there, they are derived from ``("next", done_key)``
    (default ``"done"``) and written there. The mask, True on real steps, goes next to the ids
    (``(..., "mask")``). ``as_nested`` (True or a ``torch.layout``): nested tensors of batch
    size ``[n_traj, -1]`` instead of padding, without a mask, as TorchRL returns them.
    """
    if td.batch_dims < 1:
        raise ValueError(
            f"split_trajectories: td has batch size {list(td.batch_size)}; "
            "accepted: [T], [B, T], [N, B, T] (time last)"
        )
    ids_key, mask_key = _id_keys(td, prefix, trajectory_key)
    td = td.copy()
    if ids_key not in td.keys(include_nested=True):
        td.set(ids_key, _ids_from_done(td, ids_key, done_key))
    rows = td.reshape(-1, td.shape[-1])
    ids = rows.get(ids_key)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    starts = starts.reshape(-1)
    segment = torch.cumsum(starts.long(), 0) - 1
    flat = rows.reshape(-1)
    if as_nested:
        layout = as_nested if isinstance(as_nested, torch.layout) else torch.strided
        sizes = torch.bincount(segment).tolist()
        return flat.apply(lambda x: torch.nested.nested_tensor(list(x.split(sizes)), layout=layout),
                          batch_size=[len(sizes), -1])
    first = torch.nonzero(starts).squeeze(-1)
    position = torch.arange(starts.numel()) - first[segment]
    n_traj, t_max = int(first.numel()), int(position.max()) + 1
    out = flat.apply(lambda x: x.new_zeros((n_traj, t_max, *x.shape[1:])),
                     batch_size=[n_traj, t_max])
    out[segment, position] = flat
    mask = torch.zeros(n_traj, t_max, dtype=torch.bool)
    mask[segment, position] = True
    out.set(mask_key, mask)
    out.refine_names(None, "time")
    return out


def _id_keys(td: TensorDictBase, prefix: Any, trajectory_key: Any) -> tuple:
    """Where the trajectory ids are read and the mask is written, as TorchRL chooses them."""
    if trajectory_key is not None:
        key = (trajectory_key,) if isinstance(trajectory_key, str) else tuple(trajectory_key)
        return trajectory_key, (*key[:-1], "mask") if len(key) > 1 else "mask"
    if prefix is None and "collector" in td.keys():
        prefix = "collector"
    if prefix is None:
        return "traj_ids", "mask"
    return (prefix, "traj_ids"), (prefix, "mask")


def _ids_from_done(td: TensorDictBase, ids_key: Any, done_key: Any) -> torch.Tensor:
    """Trajectory ids counted from the done flags (a new one after each done
    step), as TorchRL does."""
    done_key = ("next", "done" if done_key is None else done_key)
    if done_key not in td.keys(include_nested=True):
        raise KeyError("split_trajectories: td has neither trajectory ids at "
                       f"{ids_key} nor done flags at {done_key}")
    done = td.get(done_key).reshape(*td.shape, -1).any(-1)
    ids = torch.zeros(td.shape, dtype=torch.int64)
    ids[..., 1:] = done[..., :-1].long().cumsum(-1)
    for i in range(1, td.shape[0] if td.batch_dims > 1 else 1):
        ids[i] += ids[i - 1].max() + 1
    return ids
