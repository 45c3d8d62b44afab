"""What TorchRL's single-process collector shows beyond collecting: ``_wrapped_policy``, ``reset()``
and ``fake_tensordict()``, and its phases (``metrics()``, a worker's answer to ``phases``), from the
state :class:`~rpc_collectors.single_process.collector.Collector` owns."""
from __future__ import annotations

import os
from typing import Any

import torch
from tensordict import TensorDictBase

from rpc_collectors.core.metrics import WorkerMetrics, WorkerPhases
from rpc_collectors.single_process.step_records import time_names
from rpc_collectors.single_process.trajectories import TRAJ_IDS

VERSION_KEYS = (("collector", "policy_version"), "policy_version", ("next", "policy_version"))


class CollectorViews:
    """TorchRL's ``_wrapped_policy``, ``reset`` and ``fake_tensordict`` of the
    single-process ``Collector``."""

    policy: Any
    rollout: Any
    env: Any
    _assembly: Any
    _busy: Any
    track_policy_version: bool
    frames_per_env: int
    worker_idx: int | None
    _frames: int
    _iter: int

    def phases(self) -> tuple[WorkerPhases, ...]:
        """Its frames, batches and phase clock (:mod:`.phase_clock`): a worker's
        answer to the trainer's ``phases``."""
        clock = self.rollout.clock.totals_ns
        return (
            WorkerPhases(self.worker_idx or 0, os.getpid(), self._frames, self._iter, dict(clock),
                         self.rollout.counted.value),
        )

    def _serving_steps(self) -> int:
        """What its rollout counted (:mod:`.step_count`)."""
        return self.rollout.counted.value

    def _worker_metrics(self) -> tuple[WorkerMetrics, ...]:
        """This process is its own one worker."""
        return tuple(WorkerMetrics.of(phases) for phases in self.phases())

    @property
    def _wrapped_policy(self) -> Any:
        """TorchRL's: the policy as this collector calls it (a plain module in
        its ``TensorDictModule``)."""
        return None if self.policy is None else self.policy.td_module or self.policy.policy

    def reset(self, index: Any = None) -> None:
        """TorchRL's: the next batch starts from a fresh reset of every env, and the trajectories
        ``trajs_per_batch`` holds back (in flight or complete) are dropped. A batch in progress in
        another thread is finished first."""
        if index is not None:
            raise ValueError(f"reset(index={index!r}): this collector resets all "
                             "its envs; accepted: index=None")
        with self._busy:
            self.rollout.invalidate()
            self._assembly.clear()

    def fake_tensordict(self) -> TensorDictBase:
        """TorchRL's: a zero-filled TensorDict with the keys, shapes, dtypes and dim names of one
        batch, built without stepping the env: from the env's ``fake_tensordict()`` (TorchRL's envs
        have it) and the policy's outputs, then edited as batches are (``postproc`` included)."""
        fake = getattr(self.env, "fake_tensordict", None)
        if not callable(fake):
            raise TypeError("fake_tensordict() reads the env's fake_tensordict(), which "
                            f"{self.env!r} lacks; accepted: an env with TorchRL's EnvBase API")
        step = fake()
        for key, zero in self.rollout.policy_zeros.items():
            step.set(key, zero)
        step.set(TRAJ_IDS, torch.zeros(self.env.batch_size, dtype=torch.int64))
        if self.track_policy_version:
            for key in VERSION_KEYS:
                step.set(key, torch.zeros(self.env.batch_size, dtype=torch.int64))
        batch = torch.stack([step] * self.frames_per_env, len(self.env.batch_size)).zero_()
        batch.names = time_names(batch.batch_dims)
        return self._postprocess(self._finish(batch))
