"""``max_policy_lag``: async batches collected with weights too far behind the trainer's are dropped.

A batch whose oldest step was chosen with weights more than ``max_policy_lag`` versions behind
the trainer's ``policy_version`` is not handed out: its frames are counted in
``dropped_frames`` (and ``dropped_batches``), its worker's stream is cut there (:mod:`.continuity`),
and it is asked again, with the newest weights pushed to it: its own, or, if it was left out of the
pushes since they were within the bound, the trainer's. The lag of each batch handed out is in
``last_batch`` (``lag``, ``min_lag``).
"""
from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase

from rpc_collectors.single_process.batch_record import VERSION


def check(value: Any, sync: Any) -> int | None:
    """``max_policy_lag``: None (no bound) or an int >= 0, for async collection only."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_policy_lag={value!r} is invalid; accepted: None (no bound) or an int >= 0")
    if sync:
        raise ValueError(
            f"max_policy_lag={value!r} applies to async collection, where a worker's batch may lag the trainer's "
            "weights; accepted with sync=True: None"
        )
    return value


def too_old(batch: TensorDictBase, trainer_version: int, max_lag: int | None) -> bool:
    """Whether the oldest step of ``batch`` is more than ``max_lag`` versions behind ``trainer_version``."""
    if max_lag is None or VERSION not in batch.keys(include_nested=True):
        return False
    return trainer_version - int(batch.get(VERSION).min()) > max_lag


def left_behind(weights: Any, worker_id: int, trainer_version: int, max_lag: int | None) -> bool:
    """Whether the newest weights pushed to ``worker_id`` are themselves more than ``max_lag`` versions
    behind (it was left out of the pushes since): only then does it need the trainer's."""
    return weights is not None and max_lag is not None and trainer_version - weights.min_version[worker_id] > max_lag
