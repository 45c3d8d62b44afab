"""A sync round's batches in the layout a multi-worker collector yields (``cat_results``).

``"stack"``: ``[N, (B,) T]``; ``0``: concatenated along dim 0 (``[N*T]``, ``[N*B, T]``); ``-1``:
along the time dim. Every layout keeps the dim name ``"time"`` on the last dim.
"""
from __future__ import annotations

import torch
from tensordict import TensorDictBase

WORKER_ID = ("collector", "worker_id")


def combine(batches: list[TensorDictBase], cat_results: str | int) -> TensorDictBase:
    """The workers' batches of a round (each labelled with its worker id), in one batch."""
    if cat_results == "stack":
        out = torch.stack(batches, 0)
    else:
        out = torch.cat(batches, 0 if cat_results == 0 else batches[0].batch_dims - 1)
    return _named(out)


def lay_out(stacked: TensorDictBase, cat_results: str | int) -> TensorDictBase:
    """A round the workers wrote as rows of one buffer, ``[N, (B,) T]``, labelled and laid out."""
    shape = stacked.shape
    ids = torch.arange(shape[0]).reshape(-1, *[1] * (len(shape) - 1))
    stacked.set(WORKER_ID, ids.expand(shape).clone())
    if cat_results == "stack":
        out = stacked
    elif cat_results == 0 or len(shape) == 2:  # [N, T] or [N, B, T] -> [N*B, T]
        out = stacked.reshape(-1, *shape[2:])
    else:  # [N, B, T] along time -> [B, N*T]
        out = torch.cat(stacked.unbind(0), -1)
    return _named(out)


def _named(batch: TensorDictBase) -> TensorDictBase:
    batch.names = [None] * (batch.batch_dims - 1) + ["time"]
    return batch


def difference(signature: dict, expected: dict) -> str:
    """What differs between two batches' ``{key: (shape, dtype)}`` (see ``data_plane.signature_of``); '' if nothing."""
    name = ".".join
    parts = [f"no {name(key)}" for key in sorted(set(expected) - set(signature))]
    parts += [f"an extra {name(key)}" for key in sorted(set(signature) - set(expected))]
    for key in sorted(set(signature) & set(expected)):
        (shape, dtype), (want_shape, want_dtype) = signature[key], expected[key]
        if shape != want_shape:
            parts.append(f"{name(key)} of shape {list(shape)} instead of {list(want_shape)}")
        if dtype != want_dtype:
            parts.append(f"{name(key)} of dtype {dtype} instead of {want_dtype}")
    return ", ".join(parts)
