"""A GymEnv rollout's recorded steps, and the batch they make in TorchRL's layout.

:class:`StepRecords` holds a batch's steps as the env gave them (numpy arrays and scalars) and
the policy's outputs; :meth:`StepRecords.to_tensordict` stacks them along time. Where the
batch's targets (a worker's shared-memory slot, see
:func:`~rpc_collectors.transport.data.tensors_by_key`) have a tensor of the right shape and dtype
for an entry, the steps are written into it with numpy and the batch holds that tensor: a
worker's batch then lies in its slot already, at the cost of a few numpy calls. A sync round of
many workers on few cores waits for the last of them to finish its batch, so this work is what
the round's end costs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.single_process.trajectories import TRAJ_IDS
from rpc_collectors.transport.layouts import nested_tensordict, put_nested

FLAGS = ("done", "terminated", "truncated")


def time_names(batch_dims: int) -> list:
    return [None] * (batch_dims - 1) + ["time"]


@dataclass
class StepRecords:
    """One batch's steps: observations before and after, the policy's outputs, rewards, flags,
    trajectory ids and (with a step limit) step counts, one entry per step; ``targets``: where
    the batch is written (:func:`~rpc_collectors.transport.data.tensors_by_key`)."""

    targets: dict = field(default_factory=dict)
    obs: list = field(default_factory=list)
    next_obs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    # outputs kept as numpy arrays too: {key: [one per step]}
    output_arrays: dict = field(default_factory=dict)
    rewards: list = field(default_factory=list)
    terminated: list = field(default_factory=list)
    truncated: list = field(default_factory=list)
    traj_ids: list = field(default_factory=list)
    counts: list = field(default_factory=list)

    def add_outputs(self, out: Any) -> None:
        """Record a step's policy outputs; those with a target are kept as numpy arrays as well
        (views, taken step by step): the batch's end then stacks them with numpy, not torch."""
        # the first step: which outputs can be
        if not self.outputs and self.targets:
            for key, value in out.items():
                target = self.targets.get((key,) if isinstance(key, str) else key)
                if target is not None and target[1] is not None and type(value) is torch.Tensor \
                        and value.device.type == "cpu" and not value.requires_grad \
                        and _numpy_dtype(value.dtype) == target[1].dtype:
                    self.output_arrays[key] = []
        self.outputs.append(out)
        for key in list(self.output_arrays):
            try:
                self.output_arrays[key].append(out[key].numpy())
            except (AttributeError, TypeError, RuntimeError):
                # not one after all: stacked with torch
                del self.output_arrays[key]

    def to_tensordict(self, batch_size: torch.Size, vector: bool, policy_zeros: dict,
                      device: torch.device | None, marks: dict) -> TensorDict:
        """The batch ``[*batch_size, steps]`` (``vector``: the env's arrays hold ``batch_size``
        envs), written into the targets where they fit; ``policy_zeros``: the policy's outputs but
        the action, as zeros of one step (random actions); ``marks``: see :func:`set_marks`."""
        axis = 1 if vector else 0
        shape = (*batch_size, len(self.obs))
        targets = self.targets

        def stack(key: tuple, values: list, dtype: Any = None, flag: bool = False) -> torch.Tensor:
            """The steps' ``values`` (scalars, or one step's arrays) along time; ``flag``: with a
            trailing dim of 1 (rewards, done flags, step counts)."""
            first = np.asarray(values[0], dtype=dtype)
            stacked = (*first.shape[:axis], len(values), *first.shape[axis:],
                       *((1,) if flag else ()))
            tensor, array = targets.get(key, (None, None))
            if array is not None and array.shape == stacked and array.dtype == first.dtype:
                dest = array[..., 0] if flag else array
                if not vector:
                    dest[...] = values
                elif np.asarray(values[0]).dtype == array.dtype:
                    np.stack(values, axis=1, out=dest)
                else:
                    # cast as a fresh batch's entry is (0/1 flags of ints, float64 rewards)
                    np.copyto(dest, np.stack(values, axis=1), casting="unsafe")
                return tensor
            if vector:
                out = torch.from_numpy(np.ascontiguousarray(np.stack(values, axis=1), dtype=dtype))
            else:
                # one env: along a new first dim
                out = torch.from_numpy(np.array(values, dtype=dtype))
            return out.reshape(stacked) if flag else out

        def zeros(key: tuple) -> torch.Tensor:
            tensor, array = targets.get(key, (None, None))
            if array is not None and array.shape == (*shape, 1) and array.dtype == np.bool_:
                array[...] = False
                return tensor
            return torch.zeros(*shape, 1, dtype=torch.bool)

        def done(terminated: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
            """``terminated | truncated``, in the target where both lie there."""
            tensor, array = targets.get(("next", "done"), (None, None))
            term, term_array = targets.get(("next", "terminated"), (None, None))
            trunc, trunc_array = targets.get(("next", "truncated"), (None, None))
            shared = (array is not None and term is terminated and trunc is truncated
                      and array.shape == term_array.shape and array.dtype == np.bool_)
            if shared:
                np.logical_or(term_array, trunc_array, out=array)
                return tensor
            return terminated | truncated

        root = {name: zeros((name,)) for name in FLAGS}
        terminated = stack(("next", "terminated"), self.terminated, np.bool_, flag=True)
        truncated = stack(("next", "truncated"), self.truncated, np.bool_, flag=True)
        nxt = {"reward": stack(("next", "reward"), self.rewards, np.float32, flag=True),
               "done": done(terminated, truncated), "terminated": terminated,
               "truncated": truncated}
        root["collector"] = {TRAJ_IDS[1]: stack(TRAJ_IDS, self.traj_ids, np.int64)}
        if self.counts:
            root["step_count"] = stack(("step_count",), self.counts, np.int64, flag=True)
            nxt["step_count"] = stack(("next", "step_count"), [count + 1 for count in self.counts],
                                      np.int64, flag=True)
        for key in self.obs[0]:
            path = (key,) if isinstance(key, str) else tuple(key)
            put_nested(root, key, stack(path, [o[key] for o in self.obs]))
            put_nested(nxt, key, stack(("next", *path), [o[key] for o in self.next_obs]))
        root["next"] = nxt
        # the policy's outputs that do not start with the batch's shape on the CPU: set with checks
        checked = []
        for key in self.outputs[0].keys():
            if key in self.output_arrays:
                value = stack((key,) if isinstance(key, str) else key, self.output_arrays[key])
            else:
                value = torch.stack([o[key] for o in self.outputs], dim=axis)
            on_cpu = type(value) is torch.Tensor and value.device.type == "cpu"
            if on_cpu and value.shape[:len(shape)] == shape:
                put_nested(root, key, value)
            else:
                checked.append((key, value))
        for key, (first, rest) in marks.items():
            tensor, array = targets.get((key,) if isinstance(key, str) else key, (None, None))
            if array is not None and array.shape == shape and array.dtype == np.int64:
                array[...] = rest
                array[..., 0] = first
                put_nested(root, key, tensor)
            else:
                put_nested(root, key, _mark(shape, first, rest))
        td = nested_tensordict(root, torch.Size(shape), time_names(len(shape)), device=device)
        for key, value in checked:
            td.set(key, value.cpu())
        # random actions: the policy's other outputs as zeros
        for key, zero in policy_zeros.items():
            if key not in td.keys(include_nested=True):
                td.set(key, zero.cpu().unsqueeze(axis).expand(*shape, *zero.shape[axis:]).clone())
        return td


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype of torch's ``dtype`` (None: numpy has none, such as bfloat16)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


def _mark(shape: tuple, first: int, rest: int) -> torch.Tensor:
    value = torch.full(shape, rest, dtype=torch.int64)
    value[..., 0] = first
    return value


def set_marks(batch: TensorDictBase, marks: dict) -> TensorDictBase:
    """``batch`` with ``marks`` (``{key: (first step's value, the other steps')}``, such as the
    weight versions that collected it) set as int64 entries of its shape."""
    for key, (first, rest) in marks.items():
        batch.set(key, _mark(batch.shape, first, rest))
    return batch
