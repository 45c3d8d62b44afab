"""Transitions of a batched-inference collector, assembled into flat batches in TorchRL's layout.

When the trainer acts for some envs, it keeps what chose each action (the observation, the
policy's outputs, the weights version) in one staging row per env. When an env answers, its
transition is complete: the staged row and the step's result in the env's row of the step
plane are copied into the env's held row, and the transition held there before (the env's
previous one) goes into the next free place of the batch being filled, one indexed copy per
key for every env that answered together. A full batch lies in one of a few preallocated
buffers (:class:`~rpc_collectors.planes.slots.SlotPool`): it is handed out as it lies while the
user can no longer hold it, as a copy otherwise.

Continuity: each env's latest transition stays held until the env's next one completes, so
when an env's stream is cut (its worker replaced: the step in flight is lost, and the new env
starts from a reset), the frame before the cut is still here, and :meth:`Transitions.cut`
marks it ``("next", "truncated")`` and ``("next", "done")`` (unless its episode ended there)
before it joins a batch. No frame of a batch is ever followed, in its env's stream, by a
frame of another episode without a ``done`` between them.

A batch is ``[frames_per_batch]``: the keys of the env's step, ``"done"``, ``"terminated"`` and
``"truncated"`` (False: an action is never chosen on a finished episode), the policy's outputs,
``"env_index"`` (int64, which env) and, unless disabled, the weights version that chose the
action (TorchRL's ``policy_version_key``), as TorchRL's ``AsyncBatchedCollector`` lays it out.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.planes.layouts import BatchLayout
from rpc_collectors.planes.slots import SLOTS, SlotPool

ENV_INDEX = "env_index"
ROOT_FLAGS = ("done", "terminated", "truncated")


class Transitions:
    """Staging rows for ``rows`` (the step plane's ``[N]`` TensorDict) and the batches they fill.

    Args:
        rows: the step plane's rows.
        outputs: the policy's outputs for one env (keys, shapes, dtypes).
        frames_per_batch: frames of each batch.
        version_key: where each frame's weights version goes; None: nowhere.
        prefetch: full batches that may wait for the user besides the one being filled.
    """

    def __init__(
        self, rows: TensorDict, outputs: Mapping, frames_per_batch: int, version_key: Any, prefetch: int,
    ) -> None:
        num_envs = rows.batch_size[0]
        self.rows, self.frames_per_batch, self.version_key = rows, frames_per_batch, version_key
        self.obs_keys = [key for key in rows.keys(include_nested=True, leaves_only=True)
                         if key != "action" and not (isinstance(key, tuple) and key[0] == "next")]
        self.next_keys = [key for key in rows.keys(include_nested=True, leaves_only=True)
                          if isinstance(key, tuple) and key[0] == "next"]
        staged = TensorDict(batch_size=[num_envs])
        for key in self.obs_keys:
            staged.set(key, torch.zeros_like(rows.get(key)))
        for key, value in outputs.items():
            staged.set(key, torch.zeros(num_envs, *value.shape, dtype=value.dtype))
        if version_key is not None:
            staged.set(version_key, torch.zeros(num_envs, dtype=torch.int64))
        self.staged = staged
        self.staged_keys = list(staged.keys(include_nested=True, leaves_only=True))
        self.output_shapes = {key: staged.get(key).shape[1:] for key in outputs}
        held = staged.clone()
        for key in self.next_keys:
            held.set(key, torch.zeros_like(rows.get(key)))
        self.held = held  # each env's latest transition, until its next one completes or its stream is cut
        self.holding = [False] * num_envs
        example = TensorDict(batch_size=[frames_per_batch])
        for key in self.staged_keys:
            value = staged.get(key)
            example.set(key, torch.zeros(frames_per_batch, *value.shape[1:], dtype=value.dtype))
        for key in self.next_keys:
            value = rows.get(key)
            example.set(key, torch.zeros(frames_per_batch, *value.shape[1:], dtype=value.dtype))
        for flag in ROOT_FLAGS:
            example.set(flag, torch.zeros(frames_per_batch, 1, dtype=torch.bool))
        example.set(ENV_INDEX, torch.zeros(frames_per_batch, dtype=torch.int64))
        self.layout = BatchLayout.of(example)
        self.buffers = SlotPool(self.layout, 1, shared=False, slots=SLOTS + prefetch)
        self._slot: int | None = None
        self._batch: TensorDict | None = None
        self._filled = 0

    def stage(self, envs: torch.Tensor, inputs: Mapping, outputs: Mapping, version: int) -> None:
        """What chose the actions of ``envs`` (an int64 index): observations, outputs, version.

        Raises ValueError if the outputs' keys or shapes are not those the policy gave at start-up."""
        self._check_outputs(outputs, len(envs))
        staged = self.staged
        for key in self.obs_keys:
            staged.get(key).index_copy_(0, envs, inputs[key])
        for key, value in outputs.items():
            staged.get(key).index_copy_(0, envs, value.to(staged.get(key).dtype))
        if self.version_key is not None:
            staged.get(self.version_key).index_fill_(0, envs, version)

    def _check_outputs(self, outputs: Mapping, n: int) -> None:
        shapes = self.output_shapes
        if set(outputs.keys()) != set(shapes):
            raise ValueError(
                f"AsyncBatchedCollector: the policy returned the keys {sorted(map(str, outputs.keys()))}; accepted: "
                f"the keys it returned at start-up, {sorted(map(str, shapes))}"
            )
        for key, value in outputs.items():
            if tuple(value.shape) != (n, *shapes[key]):
                raise ValueError(
                    f"AsyncBatchedCollector: the policy returned {key!r} of shape {list(value.shape)} for {n} envs; "
                    f"accepted: shape {[n, *shapes[key]]}, as at start-up ({list(shapes[key])} per env)"
                )

    def record(self, envs: list[int]) -> list[TensorDictBase]:
        """The transitions of ``envs``, whose rows hold their steps' results now: each is held,
        and the one each env held before goes into the batch. Returns the batches this completed."""
        full = self._release([env for env in envs if self.holding[env]])
        index = torch.tensor(envs, dtype=torch.int64)
        for key in self.staged_keys:
            self.held.get(key).index_copy_(0, index, self.staged.get(key).index_select(0, index))
        for key in self.next_keys:
            self.held.get(key).index_copy_(0, index, self.rows.get(key).index_select(0, index))
        for env in envs:
            self.holding[env] = True
        return full

    def cut(self, env: int) -> list[TensorDictBase]:
        """``env``'s stream is cut (its next frame starts from a reset of another env): its held
        transition, the last before the cut, is marked truncated and done (unless its episode
        ended there) and goes into the batch. Returns the batches this completed."""
        if not self.holding[env]:  # no frame before the cut: the env had not completed a step
            return []
        done = self.held.get(("next", "done"))[env]
        if ("next", "truncated") in self.next_keys:
            self.held.get(("next", "truncated"))[env] |= ~done
        done.fill_(True)
        return self._release([env])

    def _release(self, envs: list[int]) -> list[TensorDictBase]:
        """Move the held transitions of ``envs`` into the next free places of the batch."""
        full = []
        index = torch.tensor(envs, dtype=torch.int64)
        done = 0
        while done < len(envs):
            if self._batch is None:
                self._open()
            n = min(len(envs) - done, self.frames_per_batch - self._filled)
            part = index[done:done + n]
            lo, hi = self._filled, self._filled + n
            batch = self._batch
            for key in self.staged_keys + self.next_keys:
                torch.index_select(self.held.get(key), 0, part, out=batch.get(key)[lo:hi])
            batch.get(ENV_INDEX)[lo:hi] = part
            self._filled, done = hi, done + n
            if self._filled == self.frames_per_batch:
                full.append(self._hand_out())
        for env in envs:
            self.holding[env] = False
        return full

    def _open(self) -> None:
        self._slot = self.buffers.slot_for(0)
        if self._slot is None:  # every buffer is held: a batch of its own
            self._batch = self.layout.view(torch.empty(self.buffers.slot_bytes, dtype=torch.uint8), None)
        else:
            self._batch = self.layout.view(self.buffers.slots[self._slot], None)
        for flag in ROOT_FLAGS:
            self._batch.get(flag).zero_()
        self._filled = 0

    def _hand_out(self) -> TensorDictBase:
        batch = self._batch if self._slot is None else self.buffers.hand_out(self._slot)
        self._batch, self._slot = None, None
        return batch
