"""Policy weights: reading them from what users pass, and packing them into one flat buffer.

:class:`FlatWeights` lays a module's parameters and buffers out in one contiguous byte
buffer, so a weight update is one copy and one collective, whatever the number of tensors.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

# bytes; keeps every tensor's view aligned for any dtype
ALIGN = 64


def weights_of(source: Any, argument: str = "policy_or_weights") -> TensorDictBase:
    """Weights as a nested TensorDict from an ``nn.Module``, a TensorDict or a state dict."""
    if isinstance(source, nn.Module):
        return TensorDict.from_module(source).data
    if isinstance(source, TensorDictBase):
        return source.unflatten_keys(".") if any("." in k for k in source.keys()) else source
    if isinstance(source, Mapping):
        return TensorDict(dict(source), batch_size=[]).unflatten_keys(".")
    raise TypeError(
        f"{argument}={type(source).__name__} is not accepted; accepted: None, an nn.Module, a "
        "TensorDict of weights (TensorDict.from_module) or a state dict"
    )


def one_source(policy_or_weights: Any, weights: Any, policy: Any) -> Any:
    """The one of TorchRL's three spellings (positional, ``weights=``, ``policy=``)
    that was given, or None."""
    given = [x for x in (policy_or_weights, weights, policy) if x is not None]
    if len(given) > 1:
        raise TypeError("update_policy_weights_: give the new weights once: positionally, as "
                        "weights= or as policy=")
    return given[0] if given else None


def signature_of(weights: nn.Module | TensorDictBase) -> tuple:
    """``(key, dtype, shape)`` of every tensor of a module or a TensorDict of weights, by sorted
    key: what :func:`checked` compares and :class:`FlatWeights` lays out."""
    td = _tensors_of(weights)
    return tuple(sorted(
        ((_as_tuple(key), t.dtype, tuple(t.shape))
         for key, t in td.items(include_nested=True, leaves_only=True)),
        key=lambda entry: entry[0],
    ))


def check_layout(given: tuple, layout: tuple, argument: str, whose: str = "the policy") -> None:
    """A ValueError naming the first tensor where ``given`` (a :func:`signature_of`) differs from
    ``layout``: absent from either, or of another dtype or shape."""
    if given == layout:
        return
    theirs = {key: (dtype, shape) for key, dtype, shape in given}
    ours = {key: (dtype, shape) for key, dtype, shape in layout}
    for key in sorted(set(theirs) | set(ours)):
        if theirs.get(key) != ours.get(key):
            have = "absent" if key not in theirs else f"{theirs[key][0]} {list(theirs[key][1])}"
            want = "absent" if key not in ours else f"{ours[key][0]} {list(ours[key][1])}"
            name = key[0] if len(key) == 1 else key
            raise ValueError(
                f"{argument}: weight {name!r} is {have}, {whose} has {want}; accepted: weights "
                f"with the same keys, dtypes and shapes as {whose}"
            )


def checked(source: Any, layout: tuple, argument: str = "policy_or_weights",
            whose: str = "the policy") -> TensorDictBase:
    """``source`` (an ``nn.Module``, a TensorDict of weights or a state dict) as a
    TensorDict of weights, checked whole against ``layout`` (the policy's
    :func:`signature_of`) before anything changes.

    Every weight update, whatever its form and collector, passes here before a policy or a version
    changes: what passes holds exactly the policy's tensors, so copying it in cannot fail half way
    (:func:`load_weights`, :meth:`FlatWeights.pack`), and what fails changed nothing.
    """
    weights = weights_of(source, argument)
    check_layout(signature_of(weights), layout, argument, whose)
    return weights


def load_weights(module: nn.Module, weights: TensorDictBase) -> None:
    """Copy ``weights`` (:func:`checked` against ``module``'s layout) into
    ``module``'s tensors, in place."""
    TensorDict.from_module(module).data.update_(weights)


def _tensors_of(holder: nn.Module | TensorDictBase) -> TensorDictBase:
    return TensorDict.from_module(holder).data if isinstance(holder, nn.Module) else holder


def _as_tuple(key: Any) -> tuple:
    return (key,) if isinstance(key, str) else tuple(key)


def holder_of(signature: tuple) -> TensorDictBase:
    """Empty tensors laid out as ``signature`` (:attr:`FlatWeights.signature`): where a process
    without a policy of its own (a node whose workers build theirs) keeps the
    weights it passes on."""
    return TensorDict({key: torch.empty(shape, dtype=dtype) for key, dtype, shape in signature},
                      batch_size=[])


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
        self.signature = signature_of(td)

    def new_buffer(self, device: torch.device | None = None) -> torch.Tensor:
        return torch.empty(self.nbytes, dtype=torch.uint8, device=device or self.device)

    def views(self, buffer: torch.Tensor) -> list[torch.Tensor]:
        return [buffer[o:o + n].view(dtype).view(shape) for o, n, dtype, shape in self.layout]

    def tensors(self, source: Any = None) -> list[torch.Tensor]:
        """``source``'s tensors (None: the module's now) in this layout,
        :func:`checked` against it."""
        weights = checked(self.module if source is None else source, self.signature,
                          "update_policy_weights_" if source is not None else "the policy",
                          "the workers' policy")
        return [weights.get(key) for key in self.keys]

    def pack(self, buffer: torch.Tensor, source: TensorDictBase | None = None,
             tensors: list[torch.Tensor] | None = None) -> None:
        """Copy the module's current weights (or ``source``'s) into ``buffer`` (``tensors``: their
        :meth:`tensors`, already looked up)."""
        if self.keys:
            with torch.no_grad():
                tensors = self.tensors(source) if tensors is None else tensors
                torch._foreach_copy_(self.views(buffer), tensors)

    def share(self, buffer: torch.Tensor) -> None:
        """Make the module's tensors views of ``buffer``, which holds their values (the "shared"
        transport): each tensor object is kept (an optimizer's references stay valid), and a change
        to one in place is a change to ``buffer``. A TensorDict holder is left as it is."""
        if self.device.type != "cpu":
            raise ValueError(
                f"a policy on {self.device} cannot share its memory with the trainer's and the "
                "other workers' (SharedMemWeightSyncScheme, weight_transport='shared'); "
                "accepted: a CPU policy, or weight_transport='shm'")
        if not isinstance(self.module, nn.Module) or self.shares(buffer):
            return
        td = TensorDict.from_module(self.module)
        with torch.no_grad():
            for key, view in zip(self.keys, self.views(buffer)):
                td.get(key).data = view

    def shares(self, buffer: torch.Tensor) -> bool:
        """Whether the module's tensors are the views of ``buffer`` that :meth:`share` made."""
        td = _tensors_of(self.module)
        return all(td.get(key).data_ptr() == view.data_ptr()
                   for key, view in zip(self.keys, self.views(buffer)))

    def unpack(self, buffer: torch.Tensor) -> None:
        """Copy weights from ``buffer`` into the module's current tensors, in place."""
        if self.keys:
            torch._foreach_copy_(self.tensors(), self.views(buffer))
