"""Where an :class:`~rpc_collectors.collectors.evaluator.Evaluator`'s rollouts run, on this
library's collectors: :class:`InThreadRun` (``backend="thread"``) steps a single-process
``Collector`` with ``trajs_per_batch`` in the thread that evaluates; :class:`WorkerRun`
(``"process"``, ``"ray"``) a one-worker ``MultiSyncCollector`` or ``RayCollector`` whose worker
builds the env and policy (:class:`~.evaluation_envs.WorkerSetup`); :class:`CollectorRun`
(``"worker"``) an :class:`InThreadRun` that a worker of a running collector builds from a
:class:`RunRecipe` and runs beside its own collection
(:mod:`~rpc_collectors.worker.evaluations`).

Each evaluation loads the weights given (the collector's ``update_policy_weights_``, one version
up), resets the envs, and collects ``num_trajectories`` whole episodes, all with those weights.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from torch import nn

from rpc_collectors.collectors.evaluation_envs import (
    WorkerSetup,
    build_policy,
    counts_steps,
    dump_transforms,
    evaluation_mode,
    open_env,
)
from rpc_collectors.collectors.multi import MultiSyncCollector
from rpc_collectors.collectors.ray_extra import ray_collector
from rpc_collectors.core import pickling
from rpc_collectors.core.futures import detached
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.single_process.collector import Collector
from rpc_collectors.single_process.whole_trajectories import WholeTrajectories, emit

CLOSED = "the Evaluator was shut down"
# seconds between checks for a shutdown while a worker evaluates
POLL = 0.2


@dataclass(frozen=True)
class RunSettings:
    """What every evaluation collects, as the Evaluator's arguments gave it."""

    num_trajectories: int
    max_steps: int | None
    frames_per_batch: int
    exploration_type: InteractionType
    traj_format: str
    # the collector's other arguments (``policy_device`` from ``device``)
    collector_kwargs: dict


class InThreadRun:
    """Evaluations in the thread that asks for them, on a single-process collector.

    ``env`` and ``policy`` (or ``policy_factory(env)``) are built now, or, when ``env`` is a factory
    and ``policy_factory`` is given, by the first evaluation, in its thread (TorchRL's lazy path).
    """

    def __init__(self, env: Any, policy: Any, policy_factory: Callable | None, collector_cls: type,
                 settings: RunSettings, lazy: bool) -> None:
        self.settings, self.collector_cls = settings, collector_cls
        self.collector: BaseCollector | None = None
        self._lock, self._stopped = threading.Lock(), False
        self._recipe: tuple[Any, Callable] | None = (env, policy_factory) if lazy else None
        self.env = self.policy = None
        if not lazy:
            self.env = open_env(env)
            built = policy_factory is not None
            self.policy = build_policy(policy_factory, self.env) if built else policy

    @property
    def policy_version(self) -> int:
        """How many weights this run loaded (0: the policy's own)."""
        return 0 if self.collector is None else int(self.collector.policy_version)

    def _open(self) -> BaseCollector:
        if self.collector is not None:
            return self.collector
        if self._recipe is not None:
            env, policy_factory = self._recipe
            self.env = open_env(env)
            self.policy, self._recipe = build_policy(policy_factory, self.env), None
        s = self.settings
        collector = self.collector_cls(
            create_env_fn=self.env, policy=self.policy, frames_per_batch=s.frames_per_batch,
            total_frames=-1,
            max_frames_per_traj=None if counts_steps(self.env) else s.max_steps,
            trajs_per_batch=s.num_trajectories, traj_format=s.traj_format,
            exploration_type=s.exploration_type, **s.collector_kwargs,
        )
        with self._lock:
            if not self._stopped:
                self.collector = collector
                return collector
        collector.shutdown()
        raise RuntimeError(CLOSED)

    def run(self, weights: TensorDictBase | None,
            dump_step: int | None = None) -> tuple[TensorDictBase, float]:
        """``num_trajectories`` whole episodes with ``weights`` (None: those loaded), and the
        seconds they took; then the recorders dumped at ``dump_step`` (None: not)."""
        collector = self._open()
        if weights is not None:
            collector.update_policy_weights_(weights)
        collector.reset()
        policy = self.policy
        training = isinstance(policy, nn.Module) and policy.training
        evaluation_mode(policy)
        start = time.perf_counter()
        try:
            batch = next(iter(collector))
        finally:
            if training:
                policy.train()
        seconds = time.perf_counter() - start
        if dump_step is not None:
            self.dump(dump_step)
        return batch, seconds

    def dump(self, step: int | None) -> None:
        """Dump the recorders of the collector's env (which may hold copies of the transforms)."""
        if self.collector is not None:
            dump_transforms(self.collector.env, step)

    def interrupt(self) -> None:
        """End the evaluation in progress at its next step (it raises) and refuse further ones."""
        with self._lock:
            self._stopped, collector = True, self.collector
        interrupt = getattr(collector, "interrupt", None)
        if callable(interrupt):
            interrupt()

    def shutdown(self) -> None:
        self.interrupt()
        if self.collector is not None:
            self.collector.shutdown()


class WorkerRun:
    """Evaluations in one worker process (a local process or a Ray actor), started by the first.

    The worker's collector resets before each evaluation; its batches are cut into whole
    trajectories here, and a batch collected before the weights of this evaluation is dropped.
    """

    def __init__(self, open_collector: Callable[[], BaseCollector], settings: RunSettings) -> None:
        self.settings, self._open_collector = settings, open_collector
        self.collector: BaseCollector | None = None
        self._lock, self._stopped = threading.Lock(), False
        # whether the worker's env has transforms (asked once)
        self._dumps: bool | None = None

    @property
    def policy_version(self) -> int:
        """How many weights this run pushed to its worker (0: the policy's own)."""
        return 0 if self.collector is None else int(self.collector.pushed_version)

    def _open(self) -> BaseCollector:
        if self.collector is None:
            collector = self._open_collector()
            with self._lock:
                if not self._stopped:
                    self.collector = collector
            if self.collector is None:
                collector.shutdown()
                raise RuntimeError(CLOSED)
        return self.collector

    def run(self, weights: TensorDictBase | None,
            dump_step: int | None = None) -> tuple[TensorDictBase, float]:
        """``num_trajectories`` whole episodes with ``weights`` (None: those loaded), and the
        seconds they took; then the recorders dumped at ``dump_step`` (None: not)."""
        collector, wanted = self._open(), self.settings.num_trajectories
        if weights is not None:
            collector.update_policy_weights_(weights)
        version = collector.pushed_version
        collector.map_fn("reset")
        assembled, start = WholeTrajectories(), time.perf_counter()
        while len(assembled.complete) < wanted:
            batch = collector.next()
            if collector.last_batch is not None and collector.last_batch.oldest_version < version:
                # collected before this evaluation's weights arrived
                assembled.clear()
                continue
            assembled.add(batch)
        seconds = time.perf_counter() - start
        if dump_step is not None:
            self.dump(dump_step)
        return emit(assembled.take(wanted), self.settings.traj_format), seconds

    def dump(self, step: int | None) -> None:
        """Dump the recorders of the worker's env, in the worker (a ``VideoRecorder``'s logger must
        reach the trainer from there, e.g. TorchRL's ``ProcessLogger.client()``)."""
        if self.collector is None:
            return
        if self._dumps is None:
            # as transform_of() asks, of the worker's env
            self._dumps = "transform" in self.collector.map_fn("env.__dir__")[0]
        if self._dumps:
            self.collector.map_fn("env.transform.dump", list_of_kwargs=[{"step": step}])

    def interrupt(self) -> None:
        """Stop the worker: the evaluation in progress raises, and no other starts."""
        with self._lock:
            self._stopped, collector = True, self.collector
        if collector is not None:
            collector.shutdown()

    def shutdown(self) -> None:
        self.interrupt()


def worker_collector(backend: str, setup: WorkerSetup, settings: RunSettings,
                     remote_config: dict) -> Callable:
    """What opens the one-worker collector of ``backend`` (``"process"`` or ``"ray"``)."""
    s = settings

    def open_collector() -> BaseCollector:
        common = dict(policy_factory=setup.policy, frames_per_batch=s.frames_per_batch,
                      total_frames=-1, max_frames_per_traj=s.max_steps,
                      exploration_type=s.exploration_type, **s.collector_kwargs)
        if backend == "ray":
            # sync, as the process backend: no batch is in flight when an evaluation resets the env
            return ray_collector()([setup.env], sync=True, remote_configs=remote_config, **common)
        return MultiSyncCollector([setup.env], **common)

    return open_collector


@dataclass(frozen=True)
class RunRecipe:
    """What a collector's worker builds an evaluation from (``backend="worker"``): picklable."""

    setup: WorkerSetup
    settings: RunSettings

    def open(self) -> InThreadRun:
        """The run, in the worker: ``init_fn`` first; the env and the policy by its first
        evaluation."""
        if self.setup.init_fn is not None:
            self.setup.init_fn()
        return InThreadRun(self.setup.env_factory, None, self.setup.policy_factory, Collector,
                           self.settings, lazy=True)


class CollectorRun:
    """Evaluations in worker ``worker_id`` of ``collector``, a running multi-worker collector: the
    worker builds the env and the policy once and runs each evaluation in a thread of its own
    process, beside its collection, so the trainer's process only waits for the result. A worker
    that fails fails the evaluation in progress; its replacement builds the run again, and an
    evaluation without weights gives it the last ones; shutting the Evaluator down ends the
    evaluation in the worker too.
    """

    def __init__(self, collector: Any, worker_id: int, recipe: RunRecipe) -> None:
        self.collector, self.worker_id = collector, worker_id
        self._recipe = pickling.dumps(recipe)
        # weights loaded by the evaluations so far, and the last: sent again with an evaluation
        # that brings none, so a replacement of the worker evaluates them too
        self._loaded, self._last = 0, None
        self._stopped = threading.Event()

    @property
    def policy_version(self) -> int:
        """How many weights this run gave its worker (0: the policy's own)."""
        return self._loaded

    def run(self, weights: TensorDictBase | None,
            dump_step: int | None = None) -> tuple[TensorDictBase, float]:
        """``num_trajectories`` whole episodes with ``weights`` (None: those loaded), and the
        seconds they took in the worker; its env's recorders dumped there at ``dump_step``."""
        front = self.collector
        if self._stopped.is_set():
            raise RuntimeError(CLOSED)
        front.require_running()
        if not front.roster[self.worker_id].serving:
            raise RuntimeError(f"worker {self.worker_id} of the {type(front).__name__} is not "
                               "serving: no evaluation runs in it")
        given = weights if weights is not None else self._last
        fut = front.workers.calls.evaluate(self.worker_id, self._recipe, given, dump_step)
        done = threading.Event()
        fut.add_done_callback(lambda _: done.set())
        while not done.wait(POLL):
            if self._stopped.is_set():
                raise RuntimeError(CLOSED)
        try:
            batch, seconds = fut.value()
        except Exception as err:
            failed = detached(err)
        else:
            if weights is not None:
                self._loaded, self._last = self._loaded + 1, weights
            return batch, seconds
        raise RuntimeError(f"the evaluation in worker {self.worker_id} of the "
                           f"{type(front).__name__} failed: {failed}") from None

    def interrupt(self) -> None:
        """Stop waiting (the evaluation in progress raises here) and have the worker end it."""
        self._stopped.set()
        front = self.collector
        try:
            front.require_running()
        except RuntimeError:
            # its shutdown ended the evaluation
            return
        if front.roster[self.worker_id].serving:
            # not waited for: a worker gone meanwhile answers with an error nobody needs
            front.workers.calls.stop_evaluation(self.worker_id)

    def shutdown(self) -> None:
        self.interrupt()
