"""Policy weights: reading them from what users pass, and packing them into one flat buffer.

:class:`FlatWeights` lays a module's parameters and buffers out in one contiguous byte
buffer, so a weight update is one copy and one collective, whatever the number of tensors.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

ALIGN = 64  # bytes; keeps every tensor's view aligned for any dtype


def weights_of(source: Any, argument: str = "policy_or_weights") -> TensorDictBase:
    """Weights as a nested TensorDict from an ``nn.Module``, a TensorDict or a state dict."""
    if isinstance(source, nn.Module):
        return TensorDict.from_module(source).data
    if isinstance(source, TensorDictBase):
        return source.unflatten_keys(".") if any("." in k for k in source.keys()) else source
    if isinstance(source, Mapping):
        return TensorDict(dict(source), batch_size=[]).unflatten_keys(".")
    raise TypeError(
        f"{argument}={type(source).__name__} is not accepted; accepted: None, an nn.Module, a TensorDict "
        "of weights (TensorDict.from_module) or a state dict"
    )


def one_source(policy_or_weights: Any, weights: Any, policy: Any) -> Any:
    """The one of TorchRL's three spellings (positional, ``weights=``, ``policy=``) that was given, or None."""
    given = [x for x in (policy_or_weights, weights, policy) if x is not None]
    if len(given) > 1:
        raise TypeError("update_policy_weights_: give the new weights once: positionally, as weights= or as policy=")
    return given[0] if given else None


def load_weights(module: nn.Module, weights: TensorDictBase) -> None:
    """Copy ``weights`` into ``module``'s parameters and buffers, in place."""
    target = TensorDict.from_module(module).data
    missing = set(target.keys(True, True)) - set(weights.keys(True, True))
    if missing:
        raise KeyError(f"the new weights lack {sorted(map(str, missing))[:5]} of the policy")
    target.update_(weights.select(*target.keys(True, True)))


def _tensors_of(holder: nn.Module | TensorDictBase) -> TensorDictBase:
    return TensorDict.from_module(holder).data if isinstance(holder, nn.Module) else holder


def _as_tuple(key: Any) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def holder_of(signature: tuple) -> TensorDictBase:
    """Empty tensors laid out as ``signature`` (:attr:`FlatWeights.signature`): where a process
    without a policy of its own (a node whose workers build theirs) keeps the weights it passes on."""
    return TensorDict({key: torch.empty(shape, dtype=dtype) for key, dtype, shape in signature}, batch_size=[])


class FlatWeights:
    """A fixed layout of a module's parameters and buffers inside one flat ``uint8`` buffer.

    ``holder`` is the module, or a TensorDict of weights standing in for one (a trainer whose
    workers build their policies with ``policy_factory``). Its tensors are looked up at every
    ``pack``/``unpack``, so parameters replaced after construction
    (``TensorDict.from_module(new).data.to_module(module)``, ``load_state_dict(..., assign=True)``)
    are the ones read and written. Tensors are laid out by sorted key, so a module and a
    TensorDict or state dict of its weights give the same layout.
    """

    def __init__(self, holder: nn.Module | TensorDictBase) -> None:
        self.module = holder
        td = _tensors_of(holder)
        self.keys = sorted(td.keys(include_nested=True, leaves_only=True), key=_as_tuple)
        self.layout, offset = [], 0
        for t in (td.get(k) for k in self.keys):
            nbytes = t.numel() * t.element_size()
            self.layout.append((offset, nbytes, t.dtype, t.shape))
            offset += -(-nbytes // ALIGN) * ALIGN
        self.nbytes = offset
        self.device = td.get(self.keys[0]).device if self.keys else torch.device("cpu")
        # what the other side checks its own layout against: (key, dtype, shape) of every tensor
        self.signature = tuple(
            (_as_tuple(key), dtype, tuple(shape)) for key, (_, _, dtype, shape) in zip(self.keys, self.layout)
        )

    def check(self, signature: tuple, argument: str = "the pushed weights") -> None:
        """A ValueError naming the first tensor where ``signature`` differs from this layout."""
        if signature == self.signature:
            return
        theirs = {key: (dtype, shape) for key, dtype, shape in signature}
        ours = {key: (dtype, shape) for key, dtype, shape in self.signature}
        for key in sorted(set(theirs) | set(ours)):
            if theirs.get(key) != ours.get(key):
                have = "absent" if key not in theirs else f"{theirs[key][0]} {list(theirs[key][1])}"
                want = "absent" if key not in ours else f"{ours[key][0]} {list(ours[key][1])}"
                raise ValueError(
                    f"{argument}: weight {key!r} is {have}, the worker's policy has {want}; accepted: "
                    "weights of the policy the workers build (same keys, dtypes and shapes)"
                )

    def new_buffer(self, device: torch.device | None = None) -> torch.Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device or self.device)

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer[o:o + n].view(dtype).view(shape) for o, n, dtype, shape in self.layout]

    def tensors(self) -> list[torch.Tensor]:
        """The module's current tensors, checked against the layout."""
        td = _tensors_of(self.module)
        tensors = [td.get(k) for k in self.keys]
        for key, t, (_, _, dtype, shape) in zip(self.keys, tensors, self.layout):
            if t.dtype != dtype or t.shape != shape:
                raise ValueError(
                    f"weight {key!r} is now {t.dtype} {list(t.shape)}; the collector's workers hold "
                    f"{dtype} {list(shape)}: a policy's weights may change values, not shapes or dtypes"
                )
        return tensors

    def pack(self, buffer: torch.Tensor, source: TensorDictBase | None = None) -> None:
        """Copy the module's current weights (or ``source``'s) into ``buffer``."""
        if self.keys:
            with torch.no_grad():
                torch._foreach_copy_(self.views(buffer), self.tensors() if source is None else self._matching(source))

    def _matching(self, source: TensorDictBase, argument: str = "policy_or_weights") -> list[torch.Tensor]:
        """``source``'s tensors in this layout; a ValueError naming what differs from the policy."""
        tensors = []
        for key, (_, _, _, shape) in zip(self.keys, self.layout):
            tensor = source.get(key, None)
            if tensor is None:
                raise ValueError(f"{argument} has no {key!r}, which the policy has; accepted: weights of the same architecture")
            if tensor.shape != shape:
                raise ValueError(
                    f"{argument}[{key!r}] has shape {list(tensor.shape)}, the policy's is {list(shape)}; "
                    "accepted: weights of the same architecture"
                )
            tensors.append(tensor)
        return tensors

    def unpack(self, buffer: torch.Tensor) -> None:
        """Copy weights from ``buffer`` into the module's current tensors, in place."""
        if self.keys:
            torch._foreach_copy_(self.tensors(), self.views(buffer))
