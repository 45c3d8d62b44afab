"""TorchRL's ``trajs_per_batch``: batches of whole trajectories, assembled from fixed-frame batches.

Steps are grouped by ``("collector", "traj_ids")`` in each env's row; a trajectory is complete
at its step whose ``("next", "done")`` is set, and until then it is held back (in flight).
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

from rpc_collectors.single_process.trajectories import TRAJ_IDS, split_trajectories


class WholeTrajectories:
    """Complete trajectories of the batches given to :meth:`add`, in the order they completed."""

    def __init__(self) -> None:
        self.in_flight: dict[int, list[TensorDictBase]] = {}
        self.complete: list[TensorDictBase] = []

    def add(self, batch: TensorDictBase) -> None:
        rows = batch.reshape(-1, batch.shape[-1]) if batch.batch_dims > 1 else batch.unsqueeze(0)
        for row in rows.unbind(0):
            ids = row.get(TRAJ_IDS)
            done = row.get(("next", "done")).reshape(len(ids), -1).any(-1)
            starts = [0, *(torch.nonzero(ids[1:] != ids[:-1]).squeeze(-1) + 1).tolist(), len(ids)]
            for start, end in zip(starts[:-1], starts[1:]):
                traj = int(ids[start])
                parts = self.in_flight.setdefault(traj, [])
                parts.append(row[start:end])
                if done[end - 1]:
                    self.complete.append(torch.cat(self.in_flight.pop(traj), 0))

    def drop_in_flight(self) -> None:
        """Forget the trajectories not complete yet (their envs were reset)."""
        self.in_flight.clear()

    def clear(self) -> None:
        """Forget every trajectory, complete or not (the collector was reset)."""
        self.in_flight.clear()
        self.complete.clear()

    def take(self, n: int | None = None) -> list[TensorDictBase]:
        """The first ``n`` complete trajectories (all if None), removed from here."""
        n = len(self.complete) if n is None else n
        taken = self.complete[:n]
        del self.complete[:n]
        return taken


def on_buffer_device(batch: TensorDictBase, replay_buffer: object) -> TensorDictBase:
    """``batch`` labelled with the device of ``replay_buffer``'s storage when it has none but every
    tensor is there already (a ``postproc`` cleared it), as TorchRL does before it writes; no copy."""
    storage = getattr(replay_buffer, "storage", None)
    device = getattr(storage, "device", None)
    if not isinstance(batch, TensorDictBase) or batch.device is not None or device in (None, "auto"):
        return batch
    device = torch.device(device)
    if any(value.device != device for value in batch.values(True, True) if isinstance(value, torch.Tensor)):
        return batch
    return batch.to(device)


def emit(trajectories: list[TensorDictBase], traj_format: str) -> TensorDictBase:
    """``"padded"``: ``[n, T_max]`` zero-padded with ``("collector", "mask")``; ``"cat"``: ``[sum T_i]``."""
    flat = torch.cat(trajectories, 0)
    return flat if traj_format == "cat" else split_trajectories(flat)
