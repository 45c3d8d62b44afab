"""How ``AsyncBatchedCollector`` (:mod:`.async_batched`) starts, restarts an env worker, and
closes.

Its env workers start in its :class:`~rpc_collectors.pools.local.LocalPool`; the first answers
one env's row of the step plane (:mod:`rpc_collectors.transport.step_plane`), and each then
steps its envs through their rows. The policy's first forward pass, on that one row, is checked
against the env's action and lays out every batch
(:class:`~rpc_collectors.trainer.transitions.Transitions`); the inference loop
(:class:`~rpc_collectors.trainer.inference_loop.InferenceLoop`) runs over them. A worker that
fails while the loop runs is started again and rejoins the plane, as its roster allows.

Each function takes the collector and reads or sets its attributes (``pool``, ``plane``,
``roster``, ``_specs``, ``_seeds``, ...); the loop's thread reaches the collector only weakly.
"""
from __future__ import annotations

import time
from typing import Any

import torch
from tensordict.nn import set_interaction_type

from rpc_collectors.core.futures import outcome
from rpc_collectors.pools.local import LocalPool
from rpc_collectors.trainer.inference_loop import InferenceLoop
from rpc_collectors.trainer.lifetime import weak_method
from rpc_collectors.trainer.transitions import Transitions
from rpc_collectors.transport.step_plane import StepGroup, StepPlane

# where versions are staged with policy_version_key=None
PRIVATE_VERSION = "_policy_version"


def start(collector: Any) -> InferenceLoop:
    """Start ``collector``'s env workers and its plane (``collector.plane``), each worker joined
    onto its rows; the inference loop over them, not yet running."""
    pool, specs, per_worker = collector.pool, collector._specs, collector.envs_per_worker
    for worker in range(collector.num_workers):
        collector._starting(worker, lambda w=worker: outcome(pool.create(w, specs[w * per_worker])))
    try:
        row = outcome(pool.calls.step_row(0))
    except RuntimeError as err:
        # the env is not one this collector steps: its TypeError, as the worker raised it
        last = str(err).strip().splitlines()[-1]
        raise TypeError(last.removeprefix("TypeError: ")) from None
    collector.plane = StepPlane(row, collector.num_envs, collector.envs_per_worker)
    for worker in range(collector.num_workers):
        collector._starting(worker, lambda w=worker: collector._join(w))
    outputs = first_outputs(collector, row)
    key = collector.policy_version_key
    key = key if key is not None else PRIVATE_VERSION
    transitions = Transitions(collector.plane.rows, {k: v[0] for k, v in outputs.items()},
                              collector.frames_per_batch, key, collector.prefetch)
    batching = collector.batching
    return InferenceLoop(
        collector.plane, transitions, collector.policy, collector._lock,
        weak_method(collector._version), weak_method(collector._on_failure),
        max_batch_size=batching.max_batch_size, min_batch_size=batching.min_batch_size,
        timeout=batching.timeout, exploration_type=collector.exploration_type,
        prefetch=collector.prefetch, threads=collector.num_threads, meter=collector._meter,
        pacing=collector._pacing,
    )


def first_outputs(collector: Any, row: Any) -> Any:
    """The policy's outputs for the one env of step ``row`` (their layout is every batch's); an
    action that does not fit the env's is a ValueError."""
    leaves = row.keys(include_nested=True, leaves_only=True)
    inputs = {key: row.get(key).unsqueeze(0) for key in leaves
              if key != "action" and not (isinstance(key, tuple) and key[0] == "next")}
    with torch.no_grad(), set_interaction_type(collector.exploration_type):
        outputs = collector.policy(inputs, torch.Size([1]))
    action = outputs.get("action") if hasattr(outputs, "get") else None
    if not isinstance(action, torch.Tensor) or action[0].numel() != row.get("action").numel():
        shape = list(action.shape[1:]) if isinstance(action, torch.Tensor) else None
        raise ValueError(
            f"policy={collector.policy.source!r} returned an action of shape {shape} for one env; "
            f"the env's action needs shape {list(row.get('action').shape)} "
            "(an index for a discrete action, e.g. logits.argmax(-1))"
        )
    return outputs


def starting(collector: Any, worker: int, step: Any) -> None:
    """Run a start-up ``step`` of ``worker``; its failure is a WorkerError naming the worker."""
    try:
        step()
    except RuntimeError as err:
        reason, remote = collector.pool.failure(worker, err)
        raise collector.pool.error(worker, f"{reason} during start-up", remote) from None


def join(collector: Any, worker: int) -> None:
    """Have ``worker`` step its envs through their rows of the plane (seeded, once ``set_seed()``
    gave it a seed)."""
    seed, envs = collector._seeds[worker], collector.plane.envs_of(worker)
    if seed is not None:
        outcome(collector.pool.calls.set_seed(worker, seed))
    others = [collector._specs[env] for env in envs[1:]]
    group = StepGroup(collector.plane.specs(worker), others, seed)
    outcome(collector.pool.calls.join_steps(worker, group))
    collector.plane.opened(worker)


def replace(collector: Any, worker: int, text: str) -> bool:
    """In the loop: replace ``worker`` (``text``: what its env raised; empty: it exited) if the
    roster's budget allows, else queue its WorkerError for the loop. True: it was replaced."""
    pool = collector.pool
    if text:
        reason, remote = "raised in its env", text
    else:
        reason, remote = pool.channels[worker].exit_reason() or "closed its doorbell", ""
    if not collector._closing and collector.roster.take(worker, reason):
        try:
            collector.ledger.unmatched_end(pool.replace(worker) or 0)
            outcome(pool.create(worker, collector._specs[collector.plane.envs_of(worker)[0]]))
            collector._join(worker)
            return True
        except Exception as err:
            # the replacement failed too: that ends the run
            reason, remote = f"could not be replaced after it {reason}: {err}", remote
    collector._loop.errors.put(pool.error(worker, reason, remote))
    return False


def close(loop: InferenceLoop | None, plane: StepPlane | None, pool: LocalPool,
           timeout: float) -> None:
    """Stop the inference loop, the envs and their workers within about ``timeout`` s: at
    ``shutdown()``, or when the collector is garbage-collected or the interpreter exits before."""
    start = time.monotonic()
    if loop is not None:
        loop.close(timeout)
    if plane is not None:
        plane.close()
    pool.close(max(0.5, (timeout - (time.monotonic() - start)) / 2))

