"""TorchRL's private entries: a key part starting with ``"_"`` (an exploration module's
``"_ou_prev_noise"``), which collectors drop from their batches after ``postproc``."""
from __future__ import annotations

from typing import Any

from tensordict import TensorDict, TensorDictBase, is_non_tensor, is_tensor_collection


def drop_private_keys(batch: Any) -> Any:
    """``batch`` without its private entries (a name part starting with ``"_"``, such as an
    exploration module's ``"_ou_prev_noise"``), as TorchRL's collectors drop them after
    ``postproc``."""
    if not isinstance(batch, TensorDictBase):
        return batch
    private = _private_keys(batch, ())
    return batch.exclude(*private, inplace=True) if private else batch


def _private_keys(td: TensorDictBase, prefix: tuple) -> list[tuple]:
    """The keys under ``prefix`` with a part starting with ``"_"`` (a private entry's own entries
    not listed): a TensorDict level by level; anything else (a lazy stack, whose ``items()`` would
    stack its parts' tensors, or a tensorclass) by its nested keys."""
    if type(td) is not TensorDict:
        keys = ((key,) if isinstance(key, str) else key for key in td.keys(include_nested=True))
        return [(*prefix, *key) for key in keys if any(part.startswith("_") for part in key)]
    found = []
    for name, value in td.items():
        if name.startswith("_"):
            found.append((*prefix, name))
        elif is_tensor_collection(value) and not is_non_tensor(value):
            found += _private_keys(value, (*prefix, name))
    return found
