"""Policies as collectors call them: random actions, and user policies behind one step call.

A user policy may be a ``TensorDictModule``, a plain ``nn.Module`` (reads ``"observation"``, writes
``"action"``, and, as TorchRL names them, ``"output1"``, ``"output2"``, ... for the further outputs
of a module that returns a tuple), any callable taking and returning a TensorDict, or ``None``
(random actions). :class:`StepPolicy` turns each into ``inputs -> {key: tensor}`` (a TensorDict of
the outputs for a policy called on TensorDicts) and, where it can, calls the underlying module on
tensors directly, so no TensorDict is built per step.
"""
from __future__ import annotations

import copy
import inspect
from typing import Any, Mapping

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.base import _is_leaf_nontensor
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from tensordict.utils import unravel_key
from torch import nn


class MissingAction(ValueError):
    """A policy wrote none of the env's action keys (raised at the step that calls it)."""


class RandomPolicy:
    """Samples actions from a gymnasium action space (the per-env, unbatched space).

    Call it on a TensorDict: it writes ``"action"`` with the TensorDict's batch size.
    """

    def __init__(self, action_space: gym.Space) -> None:
        if not isinstance(action_space, gym.Space):
            raise TypeError(f"RandomPolicy: action_space={action_space!r} is not a gymnasium.Space")
        self.action_space = action_space

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        n = int(np.prod(td.batch_size)) if td.batch_dims else 1
        samples = np.stack([np.asarray(self.action_space.sample()) for _ in range(n)])
        td["action"] = torch.as_tensor(samples).reshape(tuple(td.batch_size) + samples.shape[1:])
        return td


def _fast_module(policy: Any, trust: bool = False) -> TensorDictModule | None:
    """The policy as a TensorDictModule whose inner module takes tensors, if it is one.

    A TensorDictModule with hooks of its own is called as a whole, so the hooks run; a trusted
    plain module (TorchRL's ``trust_policy``) is called on the step's TensorDict.
    """
    if type(policy) is TensorDictModule:
        return None if policy._forward_hooks or policy._forward_pre_hooks else policy
    if isinstance(policy, nn.Module) and not isinstance(policy, TensorDictModuleBase) and not trust:
        check_forward(policy)
        return TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    return None


def check_forward(policy: nn.Module) -> None:
    """A ``TypeError`` (TorchRL's wording first) when a plain module's ``forward`` needs more than
    the one tensor it is called with here (the observation)."""
    try:
        params = list(inspect.signature(policy.forward).parameters.values())
    except (TypeError, ValueError):
        # no signature to read: the first call tells
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p.name for p in params if p.default is inspect.Parameter.empty
                and (p.kind in positional or p.kind is inspect.Parameter.KEYWORD_ONLY)]
    if len(required) > 1:
        raise TypeError(
            f"policy={type(policy).__name__}: Arguments to policy.forward are incompatible with "
            f"entries in the step's TensorDict: forward requires {required}, and a plain nn.Module "
            "is called with the observation only; accepted: a module whose forward takes one "
            "tensor, a TensorDictModule with its in_keys, or trust_policy=True "
            "(forward called on the step's TensorDict)"
        )


class StepPolicy:
    """Calls a user policy once per step: ``policy(inputs) -> {key: tensor}``.

    Args:
        policy: the user's policy (see module docstring); ``None`` is handled by the caller.
        device: where the policy runs; the policy is copied there if its weights live elsewhere.
        action_keys: the env's action keys, which the policy must write (TorchRL's
            ``env.action_keys``).
        compile_kwargs: if not None, the policy runs through ``torch.compile(...,
            **compile_kwargs)``.
        trust: TorchRL's ``trust_policy``: a plain ``nn.Module`` is called on the step's TensorDict
            (not given ``"observation"``), as any callable.
    """

    def __init__(
        self, policy: Any, device: torch.device | None = None, action_keys: list | None = None,
        compile_kwargs: dict | None = None, trust: bool = False,
    ) -> None:
        if not callable(policy):
            raise TypeError(
                f"policy={policy!r} is not callable; accepted: a TensorDictModule, an nn.Module, "
                "a callable taking and returning a TensorDict, or None for random actions"
            )
        self.source = policy
        self.device = device
        self.policy = _to_device(policy, device)
        self.action_keys = [unravel_key(key) for key in (action_keys or ["action"])]
        self.td_module = _fast_module(self.policy, trust)
        # a plain module wrapped here
        self.numbered = self.td_module is not None and self.td_module.module is self.policy
        self.out_keys: list | None = None
        if self.td_module is not None:
            self.out_keys = list(self.td_module.out_keys)
            missing = self._missing_actions(self.out_keys)
            if missing:
                raise MissingAction(
                    f"policy={policy!r} writes {self.out_keys}, which lacks {missing}; a policy "
                    f"must write the env's action keys {self.action_keys}"
                )
            self.in_keys = list(self.td_module.in_keys)
            module, method = self.td_module.module, self.td_module.method
            self.inner = module if method is None else getattr(module, method)
            self.method_kwargs = dict(self.td_module.method_kwargs or {})
            # in_keys given as {kwarg: key}: each tensor goes to its keyword, as
            # TensorDictModule does
            self.kwarg_names = getattr(self.td_module, "_kwargs", None)
        self.call = self.policy
        # the module's forward compiled; it keeps its weights (updates reach it)
        if compile_kwargs is not None:
            if self.td_module is not None:
                self.inner = torch.compile(self.inner, **compile_kwargs)
            else:
                self.call = torch.compile(self.policy, **compile_kwargs)

    @property
    def module(self) -> nn.Module | None:
        """The module that holds the weights the collector runs with."""
        return self.policy if isinstance(self.policy, nn.Module) else None

    def __call__(self, inputs: Mapping, batch_size: torch.Size) -> Mapping:
        if self.td_module is not None:
            args = [inputs[k] for k in self.in_keys]
            if self.device is not None:
                args = [a.to(self.device, non_blocking=True) for a in args]
            if self.kwarg_names is not None:
                out = self.inner(**dict(zip(self.kwarg_names, args)), **self.method_kwargs)
            else:
                out = self.inner(*args, **self.method_kwargs)
            if not isinstance(out, tuple):
                out = (out,)
            # learnt at the first call (the collector's check)
            if self.numbered and len(out) != len(self.out_keys):
                self.out_keys = ["action", *(f"output{i}" for i in range(1, len(out)))]
                self.td_module = TensorDictModule(self.policy, in_keys=self.in_keys,
                                                  out_keys=self.out_keys)
            return dict(zip(self.out_keys, out))
        td = (inputs if isinstance(inputs, TensorDictBase)
              else TensorDict(dict(inputs), batch_size=batch_size))
        if self.device is not None:
            td_in = td.to(self.device)
        elif td.device is not None:
            # as TorchRL: a policy without a device is given the step without one
            td_in = td.clone(False).clear_device_()
        else:
            td_in = td
        in_keys = (set(td_in.keys(include_nested=True, leaves_only=True)) if self.out_keys is None
                   else None)
        result = self.call(td_in)
        result = td_in if result is None else result
        if self.out_keys is None:
            written = (list(result.keys(True, True, is_leaf=_is_leaf_nontensor))
                       if isinstance(result, TensorDictBase) else [])
            missing = self._missing_actions(written)
            if missing:
                raise MissingAction(
                    f"policy={self.source!r} did not write {missing} into the TensorDict it was "
                    f"given; a policy must write the env's action keys {self.action_keys}"
                )
            self.out_keys = [k for k in result.keys(include_nested=True, leaves_only=True)
                             if k not in in_keys]
        # a TensorDict: heterogeneous lazy stacks stay as they are
        return result.select(*self.out_keys)

    def zeros_of_other_outputs(self, out: Any) -> dict:
        """Zeros shaped as the outputs ``out`` other than the action: random-action batches carry
        them too, as TorchRL's do."""
        actions = set(self.action_keys)
        try:
            items = out.items(True, True) if isinstance(out, TensorDictBase) else out.items()
            outputs = [(key, value) for key, value in items if unravel_key(key) not in actions]
        except RuntimeError:
            # entries of a heterogeneous lazy stack cannot be read as one tensor
            outputs = [(key, value) for key, value in out.items()
                       if unravel_key(key) not in actions]
        return {key: torch.zeros_like(value) for key, value in outputs}

    def _missing_actions(self, keys: list) -> list:
        written = {unravel_key(key) for key in keys}
        return [key for key in self.action_keys if key not in written]


def _to_device(policy: Any, device: torch.device | None) -> Any:
    """The policy on ``device``: itself if its weights are already there, else a deep copy."""
    if device is None or not isinstance(policy, nn.Module):
        return policy
    tensors = list(policy.parameters()) + list(policy.buffers())
    if all(t.device == device for t in tensors):
        return policy
    return copy.deepcopy(policy).to(device)


def run_device(policy: Any, policy_device: torch.device | None) -> torch.device:
    """Where a policy runs: ``policy_device`` if given, else where its weights are, else the CPU."""
    if policy_device is not None:
        return policy_device
    tensor = next(iter(policy.parameters()), None) if isinstance(policy, nn.Module) else None
    return tensor.device if tensor is not None else torch.device("cpu")


def check_action_shape(policy: Any, out: Mapping, expected: torch.Size | None, space: Any) -> None:
    """A ``ValueError`` naming ``policy``, the action shape it returned and the one the env's action
    ``space`` needs (``expected``, for all envs), when they hold a different number of values
    (logits where an action is due); ``[1]`` for ``[]`` and the like pass, as the env takes them."""
    action = out.get("action") if expected is not None else None
    if not isinstance(action, torch.Tensor) or action.numel() == expected.numel():
        return
    described = repr(policy) if len(repr(policy)) <= 200 else f"{type(policy).__name__}(...)"
    hint = " (logits, or probabilities, instead of an action: pick one, e.g. with .argmax(-1))" \
        if action.shape == torch.Size([*expected, getattr(space, "n", -1)]) else ""
    raise ValueError(
        f"policy={described} returned an action of shape {list(action.shape)}{hint}; the env's "
        f"action space {space} needs an action of shape {list(expected)} "
        "(one per env, batch size included)"
    )

