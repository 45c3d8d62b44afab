"""Transitions of a batched-inference collector, assembled into flat batches in TorchRL's layout.

Each env has two frame rows. When the trainer acts for some envs, it keeps what chose each
action (the observation, the policy's outputs, the weights version) in the env's staging row.
When an env answers, its transition is complete: the step's result in the env's row of the
step plane is copied into the staging row, which now holds the env's latest transition, and
the transition the other row held (the env's previous one) is due for the batch. It goes into
the next free place of the batch being filled before its row stages the env's next transition
(:meth:`Transitions.stage` moves every due transition first, so the trainer does it while the
envs step). Each key moves in one copy for the envs that answered together (:func:`copy_rows`:
a slice where their rows are consecutive, else an indexed copy, or one copy per row of pixels),
as bytes through numpy (:func:`byte_rows`), whatever its dtype and memory layout. A full batch
lies in one of a few preallocated buffers (:class:`~rpc_collectors.transport.data.SlotPool`): it
is handed out as it lies while the user can no longer hold it, as a copy otherwise.

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

import math
from typing import Any, Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.core import batched_args
from rpc_collectors.single_process.batch_record import MARKS
from rpc_collectors.transport.data import SLOTS, SlotPool
from rpc_collectors.transport.layouts import BatchLayout

ENV_INDEX = "env_index"
ROOT_FLAGS = ("done", "terminated", "truncated")
# keys of every batch: the collector's own (its records under MARKS), and TorchRL's names for an
# env's step
BATCH_KEYS = (ENV_INDEX, MARKS, *ROOT_FLAGS, "action", "next", "observation", "reward")
# bytes: rows at least this large are copied one by one (no gathered copy in between)
LARGE_ROW = 1024


def byte_rows(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` (contiguous, rows along dim 0) as a ``[rows, bytes]`` uint8 array over its memory
    (writes reach ``tensor``): a row moves as its bytes whatever its dtype, at numpy's cost per copy
    (about half torch's)."""
    return tensor.view(tensor.shape[0], math.prod(tensor.shape[1:])).view(torch.uint8).numpy()


def source_rows(tensor: torch.Tensor) -> np.ndarray:
    """``tensor``'s rows to copy from, as :func:`byte_rows` gives them, in any memory layout: over a
    dense copy where no byte view exists (expanded, stride 0 even where torch calls it contiguous;
    transposed). Where the view exists it reads the same values, strides and all."""
    try:
        return byte_rows(tensor)
    except RuntimeError:
        return byte_rows(tensor.clone(memory_format=torch.contiguous_format))


def output_leaves(outputs: Mapping) -> dict:
    """The policy's outputs by leaf key (``"action"``, ``("pol", "logits")``), the one way every
    method here reads them.

    Invariant: a policy that writes nested keys gives a TensorDict (or a mapping) of TensorDicts;
    each of its tensors is a frame entry of its own, never the sub-TensorDict as one entry."""
    if isinstance(outputs, TensorDictBase):
        return dict(outputs.items(include_nested=True, leaves_only=True))
    leaves = {}
    for key, value in outputs.items():
        if isinstance(value, TensorDictBase):
            for sub, leaf in value.items(include_nested=True, leaves_only=True):
                leaves[(key, *((sub,) if isinstance(sub, str) else sub))] = leaf
        else:
            leaves[key] = value
    return leaves


class Rows:
    """Row numbers, as a sequence (large rows: one copy each) and as an index: a slice where they
    are consecutive (one copy of them all), an array otherwise (small rows: one indexed copy)."""

    __slots__ = ("each", "index")

    def __init__(self, rows: list[int] | range) -> None:
        consecutive = rows and not isinstance(rows, range) and rows[-1] - rows[0] == len(rows) - 1
        if consecutive and rows == sorted(rows):
            # whole passes act for consecutive envs, in consecutive rows
            rows = range(rows[0], rows[-1] + 1)
        self.each = rows
        if isinstance(rows, range):
            self.index = slice(rows.start, rows.stop)
        else:
            self.index = np.array(rows, dtype=np.int64)


def copy_rows(dst: np.ndarray, to: Rows, src: np.ndarray, at: Rows) -> None:
    """``dst[to[i]] = src[at[i]]`` for every i (arrays of :func:`byte_rows`)."""
    both_slices = isinstance(to.index, slice) and isinstance(at.index, slice)
    if dst.shape[1] >= LARGE_ROW and not both_slices:
        for d, s in zip(to.each, at.each):
            dst[d] = src[s]
    else:
        dst[to.index] = src[at.index]


class Transitions:
    """Two frame rows per env of ``rows`` (the step plane's ``[N]`` TensorDict), and the batches
    they fill.

    Env ``e``'s rows are ``e`` and ``N + e``: one stages the transition in flight (what chose its
    action, then the step's result), the other holds its latest complete transition; they swap
    roles when the transition in flight completes, so nothing is copied between them.
    ``staging[e]`` is the row env ``e`` stages its transition in flight in; ``holding[e]``: its
    other row holds its latest complete transition. ``_into`` pairs (frame rows, batch rows) of
    each key; ``_due`` lists the frame rows whose transitions go into the batch next, in order.

    Args:
        rows: the step plane's rows.
        outputs: the policy's outputs for one env (keys, shapes, dtypes).
        frames_per_batch: frames of each batch.
        version_key: where each frame's weights version goes; None: nowhere.
        prefetch: full batches that may wait for the user besides the one being filled.
    """

    def __init__(
        self, rows: TensorDict, outputs: Mapping, frames_per_batch: int, version_key: Any,
        prefetch: int,
    ) -> None:
        num_envs = rows.batch_size[0]
        outputs = output_leaves(outputs)
        if version_key is not None:
            # the env's and the policy's keys are known now
            batched_args.free_key(version_key, [*BATCH_KEYS, *rows.keys(True, True), *outputs])
        self.rows, self.frames_per_batch, self.version_key = rows, frames_per_batch, version_key
        self.num_envs = num_envs
        self.obs_keys = [key for key in rows.keys(include_nested=True, leaves_only=True)
                         if key != "action" and not (isinstance(key, tuple) and key[0] == "next")]
        self.next_keys = [key for key in rows.keys(include_nested=True, leaves_only=True)
                          if isinstance(key, tuple) and key[0] == "next"]
        frames = TensorDict(batch_size=[2 * num_envs])
        for key in self.obs_keys:
            frames.set(key, torch.zeros(2 * num_envs, *rows.get(key).shape[1:],
                                        dtype=rows.get(key).dtype))
        for key, value in outputs.items():
            frames.set(key, torch.zeros(2 * num_envs, *value.shape, dtype=value.dtype))
        if version_key is not None:
            frames.set(version_key, torch.zeros(2 * num_envs, dtype=torch.int64))
        for key in self.next_keys:
            frames.set(key, torch.zeros(2 * num_envs, *rows.get(key).shape[1:],
                                        dtype=rows.get(key).dtype))
        # row r is env r % N's
        frames.set(ENV_INDEX, torch.arange(num_envs).repeat(2))
        self.frame_keys = list(frames.keys(include_nested=True, leaves_only=True))
        # the tensors, looked up once
        self._frame = {key: frames.get(key) for key in self.frame_keys}
        self._bytes = {key: byte_rows(value) for key, value in self._frame.items()}
        self._next = [(self._bytes[key], byte_rows(rows.get(key))) for key in self.next_keys]
        self._versions = None if version_key is None else self._frame[version_key].numpy()
        self.output_shapes = {key: frames.get(key).shape[1:] for key in outputs}
        self.staging = list(range(num_envs))
        self.holding = [False] * num_envs
        example = TensorDict(batch_size=[frames_per_batch])
        for key in self.frame_keys:
            value = frames.get(key)
            example.set(key, torch.zeros(frames_per_batch, *value.shape[1:], dtype=value.dtype))
        for flag in ROOT_FLAGS:
            example.set(flag, torch.zeros(frames_per_batch, 1, dtype=torch.bool))
        self.layout = BatchLayout.of(example)
        self.buffers = SlotPool(self.layout, 1, shared=False, slots=SLOTS + prefetch)
        self._slot: int | None = None
        self._batch: TensorDict | None = None
        self._into: list[tuple[np.ndarray, np.ndarray]] = []
        self._filled = 0
        self._due: list[int] = []
        # batches filled so far
        self.batches_filled = 0

    def stage(self, envs: list[int], inputs: Mapping, outputs: Mapping,
              version: int) -> list[TensorDictBase]:
        """What chose the actions of ``envs``: observations, outputs (checked by :meth:`check`),
        version. The due transitions go into the batch first; returns the batches this completed."""
        full = self.release()
        frame, given = self._bytes, Rows(range(len(envs)))
        rows = Rows([self.staging[env] for env in envs])
        for key in self.obs_keys:
            copy_rows(frame[key], rows, source_rows(inputs[key]), given)
        for key, value in output_leaves(outputs).items():
            values = source_rows(value.detach().to("cpu", self._frame[key].dtype))
            copy_rows(frame[key], rows, values, given)
        if self._versions is not None:
            self._versions[rows.index] = version
        return full

    def check(self, outputs: Mapping, n: int) -> None:
        """Raises ValueError if the policy's ``outputs`` for ``n`` envs have not the keys and
        shapes it gave at start-up."""
        shapes, seen, outputs = self.output_shapes, 0, output_leaves(outputs)
        for key, value in outputs.items():
            want = shapes.get(key)
            if want is not None and (value.shape[0] != n or value.shape[1:] != want):
                raise ValueError(
                    f"AsyncBatchedCollector: the policy returned {key!r} of shape "
                    f"{list(value.shape)} for {n} envs; "
                    f"accepted: shape {[n, *want]}, as at start-up ({list(want)} per env)"
                )
            seen += want is not None
        if seen != len(shapes) or seen != len(outputs.keys()):
            raise ValueError(
                "AsyncBatchedCollector: the policy returned the keys "
                f"{sorted(map(str, outputs.keys()))}; accepted: "
                f"the keys it returned at start-up, {sorted(map(str, shapes))}"
            )

    def record(self, envs: list[int]) -> None:
        """The transitions of ``envs``, whose rows hold their steps' results now: each is held,
        and the one each env held before is due for the batch."""
        self._due += [self._other(env, self.staging[env]) for env in envs if self.holding[env]]
        rows = [self.staging[env] for env in envs]
        into, plane = Rows(rows), Rows(envs)
        for frames, plane_rows in self._next:
            copy_rows(frames, into, plane_rows, plane)
        for env, row in zip(envs, rows):
            self.holding[env] = True
            self.staging[env] = self._other(env, row)

    def _other(self, env: int, row: int) -> int:
        return env + self.num_envs if row == env else env

    def cut(self, env: int) -> list[TensorDictBase]:
        """``env``'s stream is cut (its next frame starts from a reset of another env): its held
        transition, the last before the cut, is marked truncated and done (unless its episode
        ended there) and goes into the batch, after the transitions due. Returns the batches
        this completed."""
        if not self.holding[env]:
            # no frame before the cut: the env had not completed a step
            return []
        row = self._other(env, self.staging[env])
        done = self._frame["next", "done"][row]
        if ("next", "truncated") in self._frame:
            self._frame["next", "truncated"][row] |= ~done
        done.fill_(True)
        self.holding[env] = False
        self._due.append(row)
        return self.release()

    @property
    def room(self) -> int:
        """Places left in the batch being filled."""
        return self.frames_per_batch - self._filled if self._batch is not None \
            else self.frames_per_batch

    def held_version(self, env: int) -> int | None:
        """The version of ``env``'s held transition (None: it holds none)."""
        return int(self._versions[self._other(env, self.staging[env])]) \
            if self.holding[env] else None

    def staged_version(self, env: int) -> int:
        """The version of the action in flight for ``env``."""
        return int(self._versions[self.staging[env]])

    @property
    def due(self) -> int:
        """Transitions due, not in the batch yet."""
        return len(self._due)

    def release(self) -> list[TensorDictBase]:
        """Move the due transitions into the next free places of the batch, in order (:meth:`stage`
        does it with each pass); returns the batches this completed."""
        full, held, self._due = [], self._due, []
        done = 0
        while done < len(held):
            if self._batch is None:
                self._open()
            n = min(len(held) - done, self.frames_per_batch - self._filled)
            part, places = Rows(held[done:done + n]), Rows(range(self._filled, self._filled + n))
            for frames, batch in self._into:
                copy_rows(batch, places, frames, part)
            self._filled, done = self._filled + n, done + n
            if self._filled == self.frames_per_batch:
                full.append(self._hand_out())
        return full

    def _open(self) -> None:
        self._slot = self.buffers.slot_for(0)
        if self._slot is None:
            # every buffer is held: a batch of its own
            own = torch.empty(self.buffers.slot_bytes, dtype=torch.uint8)
            self._batch = self.layout.view(own, None)
        else:
            self._batch = self.layout.view(self.buffers.slots[self._slot], None)
        for flag in ROOT_FLAGS:
            self._batch.get(flag).zero_()
        self._into = [(self._bytes[key], byte_rows(self._batch.get(key)))
                      for key in self.frame_keys]
        self._filled = 0

    def _hand_out(self) -> TensorDictBase:
        batch = self._batch if self._slot is None else self.buffers.hand_out(self._slot)
        self._batch, self._slot = None, None
        self.batches_filled += 1
        return batch
