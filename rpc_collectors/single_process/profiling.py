"""TorchRL's ``enable_profile``: ``torch.profiler`` around some of a collector's batches, with the
trace written as a Chrome trace (or handed to ``on_trace_ready``).

Batches ``warmup_rollouts`` to ``num_rollouts - 1`` (counted from 0) are profiled, as TorchRL counts
them, in the process and thread that collects them (a single-process collector). As in TorchRL, the
profiler is the collector's ``post_collect_hook`` while it is on (a :class:`ProfilerHook`, the one
home of the profiler); unlike TorchRL's, it goes on calling the hook it took the place of, and
``disable_profile`` puts that hook back."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ACTIVITIES = {"cpu": torch.profiler.ProfilerActivity.CPU,
              "cuda": torch.profiler.ProfilerActivity.CUDA}
STARTED = (
    "Cannot enable profiling after iteration has started; call enable_profile() before iterating"
)


@dataclass
class ProfileConfig:
    """What ``enable_profile`` was given (TorchRL's ``ProfileConfig``), checked."""

    workers: list[int] = field(default_factory=lambda: [0])
    num_rollouts: int = 3
    warmup_rollouts: int = 1
    save_path: str | Path | None = None
    activities: list[str] = field(default_factory=lambda: ["cpu", "cuda"])
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = True
    with_flops: bool = False
    on_trace_ready: Any = None

    def __post_init__(self) -> None:
        bad = lambda n: isinstance(n, bool) or not isinstance(n, int)  # noqa: E731
        valid = (not bad(self.warmup_rollouts) and not bad(self.num_rollouts)
                 and 0 <= self.warmup_rollouts < self.num_rollouts)
        if not valid:
            raise ValueError(f"num_rollouts={self.num_rollouts!r}, "
                             f"warmup_rollouts={self.warmup_rollouts!r} are invalid; accepted: "
                             "ints with 0 <= warmup_rollouts < num_rollouts")
        unknown = [a for a in self.activities if a not in ACTIVITIES]
        if unknown:
            raise ValueError(f"activities={self.activities!r} is invalid; "
                             "accepted: a list of 'cpu', 'cuda'")
        if self.on_trace_ready is not None and not callable(self.on_trace_ready):
            raise TypeError(f"on_trace_ready={self.on_trace_ready!r} is invalid; "
                            "accepted: None or a callable")

    def get_save_path(self, worker_idx: int = 0) -> Path:
        """Where worker ``worker_idx``'s trace goes."""
        template = str(self.save_path or "./collector_profile_{worker_idx}.json")
        return Path(template.format(worker_idx=worker_idx))


class RolloutProfiler:
    """Counts a collector's batches and profiles those ``config`` names."""

    def __init__(self, config: ProfileConfig, worker_idx: int = 0) -> None:
        self.config, self.worker_idx = config, worker_idx
        self.count, self.profile = 0, None

    def before_batch(self) -> None:
        if self.count == self.config.warmup_rollouts and self.profile is None:
            activities = [ACTIVITIES[a] for a in self.config.activities
                          if a == "cpu" or torch.cuda.is_available()]
            self.profile = torch.profiler.profile(
                activities=activities, record_shapes=self.config.record_shapes,
                profile_memory=self.config.profile_memory, with_stack=self.config.with_stack,
                with_flops=self.config.with_flops
            )
            self.profile.__enter__()

    def after_batch(self) -> None:
        self.count += 1
        if self.profile is not None and self.count >= self.config.num_rollouts:
            self.stop()

    def stop(self) -> None:
        """End the profile in progress, if any, and write its trace."""
        profile, self.profile = self.profile, None
        if profile is None:
            return
        profile.__exit__(None, None, None)
        if self.config.on_trace_ready is not None:
            self.config.on_trace_ready(profile)
            return
        path = self.config.get_save_path(self.worker_idx)
        os.makedirs(path.parent, exist_ok=True)
        profile.export_chrome_trace(str(path))


class ProfilerHook:
    """A collector's ``post_collect_hook`` while ``enable_profile`` is on: its profiler, and the
    hook it took the place of, called with each batch as before."""

    def __init__(self, profiler: RolloutProfiler, replaced: Any) -> None:
        self.profiler, self.replaced = profiler, replaced

    def __call__(self, batch: Any) -> None:
        if self.replaced is not None:
            self.replaced(batch)


# TorchRL's profile methods of a collector, named by BaseCollector (``self``: the collector, whose
# ``_profile_config`` and ``post_collect_hook`` they set)
def enable_profile(self: Any, *, workers: list[int] | None = None, num_rollouts: int = 3,
                   warmup_rollouts: int = 1, save_path: Any = None,
                   activities: list[str] | None = None, record_shapes: bool = True,
                   profile_memory: bool = False, with_stack: bool = True,
                   with_flops: bool = False, on_trace_ready: Any = None) -> None:
    """TorchRL's: ``torch.profiler`` around batches ``warmup_rollouts`` to ``num_rollouts - 1``
    (from 0), the trace written to ``save_path`` (``{worker_idx}`` filled in; default
    ``./collector_profile_{worker_idx}.json``) or handed to ``on_trace_ready``. Multi-worker
    collectors refuse it (``workers`` is accepted and ignored here, as TorchRL's single-process
    collector does); a RuntimeError once iteration began."""
    if self._iteration_started:
        raise RuntimeError(STARTED)
    config = ProfileConfig(
        workers=[0] if workers is None else list(workers), num_rollouts=num_rollouts,
        warmup_rollouts=warmup_rollouts, save_path=save_path,
        activities=["cpu", "cuda"] if activities is None else list(activities),
        record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
        with_flops=with_flops, on_trace_ready=on_trace_ready
    )
    self._start_profile(config)
    self._profile_config = config


def start_profile(self: Any, config: ProfileConfig) -> None:
    disable_profile(self)
    profiler = RolloutProfiler(config, getattr(self, "worker_idx", None) or 0)
    self.post_collect_hook = ProfilerHook(profiler, self.post_collect_hook)


def disable_profile(self: Any) -> None:
    """Stop a profile in progress (its trace is written), profile no more batches, and put back
    the ``post_collect_hook`` that the profiler took the place of."""
    hook = self.post_collect_hook
    if isinstance(hook, ProfilerHook):
        hook.profiler.stop()
        self.post_collect_hook = hook.replaced
    self._profile_config = None


def profiler(self: Any) -> RolloutProfiler | None:
    """The profiler that ``enable_profile`` installed; None without one (read with every batch:
    a collector that never profiled reads no hook)."""
    if self._profile_config is None:
        return None
    hook = self.post_collect_hook
    return hook.profiler if isinstance(hook, ProfilerHook) else None


def profile_config(self: Any) -> ProfileConfig | None:
    """What ``enable_profile`` was given; None without it."""
    return self._profile_config
