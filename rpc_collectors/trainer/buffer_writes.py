"""How a multi-worker collector writes its batches into a ``replay_buffer``: as TorchRL's workers
write theirs, one worker's batch after the other, and never the steps a preempted worker did not
collect (``preemptive_threshold``: only collected frames, as ``collector.frames`` counts them)."""
from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from rpc_collectors.single_process import preemption
from rpc_collectors.transport import layouts


def write(buffer: Any, batch: TensorDictBase, *, stacked: bool, extend_buffer: bool,
          split_trajs: bool, worker_ids: torch.Tensor | None = None) -> None:
    """Write ``batch`` (``stacked``: a sync ``[N, (B,) T]`` batch; ``worker_ids``: whose step each
    is, when the batch no longer holds them) into ``buffer``.

    With ``extend_buffer`` one ``extend()``, merged down to the storage's dims (see
    :func:`layouts.for_storage`); a batch with padded steps one ``extend()`` per worker, of its
    collected steps. Without it, each worker's collected steps one by one with ``add()``.
    """
    ndim = getattr(getattr(buffer, "storage", None), "ndim", None)
    if not extend_buffer or preemption.MASK in batch.keys(True):
        for part in layouts.worker_parts(batch, stacked, worker_ids):
            if preemption.MASK in part.keys(True):
                part = preemption.drop_padding(part)
            if extend_buffer:
                buffer.extend(layouts.for_storage(part, ndim))
            else:
                for step in part.unbind(part.batch_dims - 1):
                    buffer.add(step)
        return
    if stacked and not split_trajs:
        batch = layouts.for_storage(batch, ndim)
    buffer.extend(batch)
