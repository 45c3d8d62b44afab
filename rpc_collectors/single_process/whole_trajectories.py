"""TorchRL's ``trajs_per_batch``: batches of whole trajectories, assembled from fixed-frame batches,
and the collectors' writes into a replay buffer.

Steps are grouped by ``("collector", "traj_ids")`` in each env's row; a trajectory is complete
at its step whose ``("next", "done")`` is set, and until then it is held back (in flight).
"""
from __future__ import annotations

from typing import Any, Iterator

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

    def batches(self, collector: Any) -> Iterator[TensorDictBase | None]:
        """As TorchRL: ``trajs_per_batch`` complete trajectories per batch of ``collector`` (a
        :class:`~rpc_collectors.single_process.base_collector.BaseCollector` that holds this
        assembly), or, with a replay buffer (``replay_write_mode="trajectory"``), the trajectories
        that completed with each batch written to it flat (``[T]``), ``trajs_per_write`` per
        ``extend()`` (all of them if None)."""
        for batch in collector._processed_batches():
            self.add(batch)
            if collector._discards_in_flight():
                self.drop_in_flight()
            if collector.writes_buffer:
                trajectories = self.take()
                step = collector.trajs_per_write or max(len(trajectories), 1)
                for start in range(0, len(trajectories), step):
                    written = torch.cat(trajectories[start:start + step], 0)
                    buffer = collector.replay_buffer
                    buffer.extend(on_buffer_device(written, buffer))
                    collector.progress.written_frames += written.numel()
                yield None
            else:
                while len(self.complete) >= collector.trajs_per_batch:
                    yield emit(self.take(collector.trajs_per_batch), collector.traj_format)


def on_buffer_device(batch: TensorDictBase, replay_buffer: object) -> TensorDictBase:
    """``batch`` labelled with the device of ``replay_buffer``'s storage when it has none but every
    tensor is there already (a ``postproc`` cleared it), as TorchRL does before it writes; no
    copy."""
    storage = getattr(replay_buffer, "storage", None)
    device = getattr(storage, "device", None)
    labelled = not isinstance(batch, TensorDictBase) or batch.device is not None
    if labelled or device in (None, "auto"):
        return batch
    device = torch.device(device)
    tensors = (value for value in batch.values(True, True) if isinstance(value, torch.Tensor))
    if any(value.device != device for value in tensors):
        return batch
    return batch.to(device)



def write_batch(replay_buffer: Any, batch: TensorDictBase, extend_buffer: bool) -> None:
    """Write a batch into ``replay_buffer`` as TorchRL's single-process collector does: as it is
    (``extend()``), or with ``extend_buffer=False`` step by step (``add()``)."""
    if extend_buffer:
        replay_buffer.extend(on_buffer_device(batch, replay_buffer))
    else:
        for step in batch.unbind(batch.batch_dims - 1):
            replay_buffer.add(step)

def emit(trajectories: list[TensorDictBase], traj_format: str) -> TensorDictBase:
    """``"padded"``: ``[n, T_max]`` zero-padded with ``("collector", "mask")``;
    ``"cat"``: ``[sum T_i]``."""
    flat = torch.cat(trajectories, 0)
    return flat if traj_format == "cat" else split_trajectories(flat)
