"""How a batch lies: its tensors' keys, shapes and dtypes (and their place in a flat buffer),
and a sync round's batches in the layout a multi-worker collector yields (``cat_results``).

``"stack"``: ``[N, (B,) T]``; ``0``: concatenated along dim 0 (``[N*T]``, ``[N*B, T]``); ``-1``:
along the time dim. Every layout keeps the dim name ``"time"`` on the last dim.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

WORKER_ID = ("collector", "worker_id")
# bytes; every tensor starts on a cache line (and on its dtype's alignment)
ALIGN = 64


def aligned(nbytes: int, to: int = ALIGN) -> int:
    """``nbytes`` rounded up to a multiple of ``to``."""
    return -(-nbytes // to) * to


def _has_lazy_stack(td: TensorDictBase) -> bool:
    """Whether ``td`` or an entry of it is a lazy stack (shapes that differ between its parts)."""
    return isinstance(td, LazyStackedTensorDict) or any(
        _has_lazy_stack(value) for value in td.values() if isinstance(value, TensorDictBase)
    )


@dataclass(frozen=True)
class Leaf:
    """One tensor of a batch: its key, shape, dtype and size in bytes."""

    key: tuple
    shape: tuple
    dtype: torch.dtype
    nbytes: int


@dataclass(frozen=True)
class BatchLayout:
    """The tensors of one batch (keys, shapes, dtypes), and how ``rows`` batches
    lie in a flat buffer."""

    batch_size: tuple
    names: tuple
    leaves: tuple
    # the device the batch reports (a worker's: its storing device, the CPU)
    device: torch.device | None = None
    # rows -> _ViewPlan
    _plans: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def of(cls, batch: TensorDictBase) -> "BatchLayout | None":
        """The layout of ``batch``; None if it cannot go through shared memory (lazy stacks: an env
        whose shapes change from step to step, or heterogeneous agents)."""
        if _has_lazy_stack(batch):
            return None
        leaves = []
        for key, value in batch.items(include_nested=True, leaves_only=True):
            if type(value) is not torch.Tensor or value.device.type != "cpu":
                return None
            key = key if isinstance(key, tuple) else (key,)
            if len(key) > 1 and batch.get(key[:-1]).batch_size != batch.batch_size:
                return None
            leaves.append(Leaf(key, tuple(value.shape), value.dtype,
                               value.numel() * value.element_size()))
        names = tuple(batch.names) if batch._has_names() else ()
        return cls(tuple(batch.batch_size), names, tuple(leaves), batch.device)

    @property
    def nbytes(self) -> int:
        """Bytes of one batch's tensors."""
        return sum(leaf.nbytes for leaf in self.leaves)

    def size(self, rows: int) -> int:
        """Bytes of a slot holding ``rows`` batches (each tensor's rows contiguous, aligned)."""
        return sum(aligned(leaf.nbytes * rows) for leaf in self.leaves)

    def signature(self) -> dict:
        """``{key: (shape, dtype)}``, as :func:`signature_of` gives for a batch of this layout."""
        return {leaf.key: (leaf.shape, leaf.dtype) for leaf in self.leaves}

    def view(self, slot: torch.Tensor, rows: int | None) -> TensorDict:
        """A TensorDict of views into ``slot`` (flat uint8): ``[rows, *batch_size]``, or one batch
        if rows is None, on the layout's device (as the batch it was made from)."""
        plan = self._plans.get(rows)
        if plan is None:
            plan = self._plans[rows] = _view_plan(self, rows)
        slot = slot[:plan.nbytes]
        typed = [slot.view(dtype) for dtype in plan.dtypes]
        tensors = [typed[i].as_strided(shape, stride, typed[i].storage_offset() + offset)
                   for i, shape, stride, offset in plan.tensors]
        return nested_tensordict(plan.tree, plan.batch_size, plan.names, tensors.__getitem__,
                                 self.device)


@dataclass(frozen=True)
class _ViewPlan:
    """Where each tensor of ``rows`` batches of a layout lies in a slot, worked out once: a view of
    the slot per dtype, then one ``as_strided`` per tensor (a slice and two
    views cost 3x as much)."""

    nbytes: int
    dtypes: tuple
    # (dtype index, shape, stride, offset in elements of that dtype), per leaf
    tensors: tuple
    # {name: leaf index, or a dict for a nested TensorDict}
    tree: dict
    batch_size: torch.Size
    names: list | None


def _view_plan(layout: BatchLayout, rows: int | None) -> _ViewPlan:
    lead = () if rows is None else (rows,)
    dtypes = tuple(dict.fromkeys(leaf.dtype for leaf in layout.leaves))
    tensors, tree, offset = [], {}, 0
    for index, leaf in enumerate(layout.leaves):
        shape = (*lead, *leaf.shape)
        tensors.append((dtypes.index(leaf.dtype), shape, _contiguous_strides(shape),
                        offset // leaf.dtype.itemsize))
        offset += aligned(leaf.nbytes * (rows or 1))
        put_nested(tree, leaf.key, index)
    names = [None] * len(lead) + list(layout.names) if layout.names else None
    return _ViewPlan(offset, dtypes, tuple(tensors), tree, torch.Size((*lead, *layout.batch_size)),
                     names)


def _contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def put_nested(tree: dict, key: str | tuple, value: object) -> None:
    """``tree[key] = value``, a tuple key going through nested dicts (made where missing)."""
    *path, name = (key,) if isinstance(key, str) else key
    for part in path:
        tree = tree.setdefault(part, {})
    tree[name] = value


def nested_tensordict(tree: dict, batch_size: torch.Size, names: list | None,
                      leaf: Callable = lambda value: value,
                      device: torch.device | None = None) -> TensorDict:
    """The TensorDict of ``tree`` (``{name: leaf, or a dict for a nested TensorDict}``, each leaf
    ``leaf(value)``), built without checking each entry: every tensor must start with ``batch_size``
    (and be on ``device``, if given)."""
    source = {name: nested_tensordict(node, batch_size, names, leaf, device)
              if isinstance(node, dict) else leaf(node)
              for name, node in tree.items()}
    return TensorDict._new_unsafe(source=source, batch_size=batch_size, names=names, device=device)


def signature_of(batch: TensorDictBase) -> dict:
    """``{key: (shape, dtype)}`` of every tensor of ``batch`` (empty if it holds non-tensors)."""
    out = {}
    for key, value in batch.items(include_nested=True, leaves_only=True):
        if type(value) is not torch.Tensor:
            return {}
        out[key if isinstance(key, tuple) else (key,)] = (tuple(value.shape), value.dtype)
    return out



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
    elif cat_results == 0 or len(shape) == 2:
        # [N, T] or [N, B, T] -> [N*B, T]
        out = stacked.reshape(-1, *shape[2:])
    else:
        # [N, B, T] along time -> [B, N*T]
        out = torch.cat(stacked.unbind(0), -1)
    return _named(out)


def _named(batch: TensorDictBase) -> TensorDictBase:
    batch.names = [None] * (batch.batch_dims - 1) + ["time"]
    return batch


def difference(signature: dict, expected: dict) -> str:
    """What differs between two batches' ``{key: (shape, dtype)}`` (see
    :func:`signature_of`); '' if nothing."""
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


def for_storage(batch: TensorDictBase, ndim: int | None) -> TensorDictBase:
    """A stacked ``[N, (B,) T]`` batch for a replay buffer whose storage has ``ndim`` dims, as
    TorchRL's workers fill it, one worker's batch after the other: the leading dims merged down
    to ``ndim`` (1: ``N*(B*)T`` frames; 2: ``[N*B, T]`` rows)."""
    if isinstance(ndim, int) and batch.batch_dims > ndim >= 1:
        return batch.reshape(-1, *batch.shape[batch.batch_dims - ndim + 1:])
    return batch


def worker_parts(batch: TensorDictBase, stacked: bool,
                 ids: torch.Tensor | None = None) -> list[TensorDictBase]:
    """Each worker's part of a multi-worker batch, ``[(B,) T]``, in the order the batch holds them:
    the lanes of a stacked batch, or the runs of one worker id (``ids``, else the batch's
    ``WORKER_ID``) along the time dim (``cat_results=-1``, and ``0`` over ``[T]`` batches) or
    along dim 0 (``0`` over ``[B, T]``)."""
    if stacked:
        return list(batch.unbind(0))
    ids = batch.get(WORKER_ID) if ids is None else ids
    first_row = ids.reshape(-1, ids.shape[-1])[0]
    if (first_row != first_row[0]).any():
        dim, lead = batch.batch_dims - 1, first_row
    else:
        dim, lead = 0, ids.reshape(ids.shape[0], -1)[:, 0]
    counts = torch.unique_consecutive(lead, return_counts=True)[1]
    return list(batch.split(counts.tolist(), dim))
