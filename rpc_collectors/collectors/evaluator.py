"""TorchRL 0.14.1's ``Evaluator``: evaluation beside training, blocking (``evaluate()``) or in the
background (``trigger_eval()``, then ``poll()``/``wait()``, ``pending``, ``on_result``), on this
library's collectors (:mod:`.evaluation_runs`), with TorchRL's metrics
(:mod:`.evaluation_metrics`), its frozen normalisation and recorder dumps
(:mod:`.evaluation_envs`) and its arguments (:mod:`.evaluation_options`).

Every result also names the weights it evaluated, ``"<prefix>/policy_version"``, is kept in
:attr:`Evaluator.results`, in the order the evaluations ended, and has its numbers written to the
targets of ``metrics=`` (a collector's: TensorBoard, Prometheus, JSON lines, TorchRL's loggers),
and kept by the collectors given there for their ``metrics()`` and exports.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, Callable

from tensordict import TensorDictBase
from tensordict.nn import InteractionType
from torch import nn

import rpc_collectors.collectors.evaluation_metrics as metrics
import rpc_collectors.collectors.evaluation_options as options
from rpc_collectors.collectors.evaluation_options import Request
from rpc_collectors.collectors.evaluation_runs import CLOSED
from rpc_collectors.core import checks

logger = logging.getLogger(__name__)
# TorchRL's words
BUSY = ("Evaluation already pending. Wait for completion or set busy_policy='skip' or "
        "busy_policy='queue'.")
# TorchRL's words: what state_dict() cannot save
UNSETTLED = "pending, queued, or unread"
# what a metrics= target failing to write leads to
GOES_ON = ("evaluation goes on, and this target is tried again at the next result, without another "
           "warning until it works")


class Evaluator:
    """Evaluates a policy on complete episodes, in a thread, a worker process, a Ray actor or a
    worker of a running collector.

    Args:
        env: an env, or a callable returning one (``"process"`` and ``"ray"``: a callable, or a
            gymnasium id, built in the worker); its normalisation statistics are frozen.
        policy: the policy to evaluate (``"thread"`` only); or ``policy_factory``.
        policy_factory: ``(env) -> policy`` (one that can be called without arguments is called
            so); with a callable ``env`` and ``"thread"``, both are built by the first
            evaluation, in its thread.
        num_trajectories: episodes per evaluation (the collector's ``trajs_per_batch``).
        max_steps: the most steps of an episode (``max_frames_per_traj``); None: until done. In the
            thread backend an env with its own ``StepCounter`` keeps its limit instead.
        frames_per_batch: the collector's step of collection; None: ``max_steps``, else 1000.
        collector_cls: ``"thread"``'s collector: None, ``"Collector"`` or a class taking its
            arguments.
        collector_kwargs: more arguments of the collector; ``traj_format`` is ``"padded"`` unless
            given.
        weight_sync_schemes: TorchRL's; given with ``"thread"``, evaluations run in a worker
            process, as ``"process"``.
        log_prefix: results are named ``"<log_prefix>/<metric>"``.
        reward_keys, done_keys: where the reward and the done flag are read.
        device: where the policy runs (the collector's ``policy_device``).
        exploration_type: set around every policy call; default DETERMINISTIC.
        metrics_fn: ``(batch) -> dict`` of more metrics from each evaluation's batch.
        dump_video: ``dump(step=step)`` on the env's transforms after each evaluation (a
            ``VideoRecorder`` writes its frames).
        on_result: called with each result as a TensorDict (in the background thread for
            background evaluations).
        busy_policy: ``trigger_eval`` while another is pending: ``"skip"`` (it returns False),
            ``"error"`` (it raises) or ``"queue"`` (it runs after).
        backend: ``"thread"``, ``"process"`` (a one-worker ``MultiSyncCollector``), ``"ray"`` (a
            one-actor ``RayCollector``, with the ``ray`` extra) or, not TorchRL's, ``"worker"``: a
            worker of ``worker_of``, a running collector of this library (a local process, a
            torchrun or SLURM rank, a node collector, a Ray actor), builds the env and the policy
            and runs each evaluation beside its collection, on its own cores; the trainer's
            process only waits.
        worker_of, worker_id: ``"worker"``: the collector, and which of its workers (None: the
            last).
        init_fn: ``"process"`` and ``"ray"``: called in the worker before its env and policy are
            built.
        num_gpus, ray_kwargs: ``"ray"``: the actor's GPUs and its other Ray options.
        metrics: not TorchRL's (its ``Evaluator`` has no ``logger=``; its loggers are given
            results by ``on_result``): None, or what a collector's ``metrics=`` takes as
            targets (:mod:`~rpc_collectors.single_process.metric_exports`: ``TensorBoard``,
            ``Prometheus``, ``PrometheusTextfile``, ``JsonLines``, a TorchRL logger or any object
            with ``log_scalar``, ``"tensorboard:DIR"``, ``"prometheus:PORT"``, ``"jsonl:PATH"``,
            or a list of them), checked here, and collectors of this library. Each result's
            numbers are written to the targets at its ``"<prefix>/step"``, named as in the result
            (``"<prefix>/step"`` itself left out); a target failing to write is warned about
            once, until it works again, and evaluation goes on; :meth:`shutdown` closes them. A
            collector keeps the last result's numbers (its step too) and the count of results as
            the group ``log_prefix`` of its ``metrics().evaluations``, in ``metrics().scalars()``
            as ``"<prefix>/reward"``, ..., ``"<prefix>/results"``, which its own ``metrics=``
            exports write at their next interval, at its frames.

    A result is a dict of ``"<prefix>/reward"`` (the mean episode return), ``"/reward_std"``,
    ``"/num_episodes"``, ``"/episode_length"``, ``"/fps"``, ``"/step"`` and ``"/policy_version"``,
    then ``metrics_fn``'s entries.
    """

    def __init__(
        self,
        env: Any,
        policy: Any = None,
        *,
        policy_factory: Callable | None = None,
        num_trajectories: int = 10,
        max_steps: int | None = None,
        frames_per_batch: int | None = None,
        collector_cls: type | str | None = None,
        collector_kwargs: dict | None = None,
        weight_sync_schemes: dict | None = None,
        log_prefix: str = "eval",
        reward_keys: str | tuple = ("next", "reward"),
        done_keys: str | tuple = ("next", "done"),
        device: Any = None,
        exploration_type: InteractionType = InteractionType.DETERMINISTIC,
        metrics_fn: Callable | None = None,
        dump_video: bool = True,
        on_result: Callable | None = None,
        busy_policy: str = "skip",
        backend: str = "thread",
        init_fn: Callable | None = None,
        num_gpus: float = 1,
        ray_kwargs: dict | None = None,
        metrics: Any = None,
        worker_of: Any = None,
        worker_id: int | None = None,
    ) -> None:
        self._busy_policy = options.busy_policy(busy_policy)
        backend = options.backend(backend)
        self._log_prefix = options.text("log_prefix", log_prefix)
        self._reward_keys = options.key("reward_keys", reward_keys)
        self._done_keys = options.key("done_keys", done_keys)
        self._metrics_fn = checks.optional_callable("metrics_fn", metrics_fn)
        self._on_result = checks.optional_callable("on_result", on_result)
        self._dump_video = checks.boolean("dump_video", dump_video)
        settings = options.settings(num_trajectories, max_steps, frames_per_batch, exploration_type,
                                    device, collector_kwargs)
        # checked (its package, its directory, its port) before anything is built
        self._export, self._reported_to = options.metric_targets(metrics, self._log_prefix)
        self._run = options.open_run(env, policy, policy_factory, settings, backend, collector_cls,
                                     weight_sync_schemes, init_fn, num_gpus, ray_kwargs,
                                     worker_of, worker_id)
        # guards the state below
        self._cond = threading.Condition()
        # one evaluation at a time
        self._serial = threading.Lock()
        self._queued: deque[Request] = deque()
        # the background evaluation in progress
        self._running: Request | None = None
        # background results poll() and wait() did not hand out
        self._ready: deque[dict] = deque()
        self._results: list[dict] = []
        # a background evaluation's, for poll()/wait()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._step_counter = 0
        # the version of the weights loaded
        self._version = 0
        self._closed = False

    # ------------------------------------------------------------------ evaluations
    def evaluate(self, weights: Any = None, step: int | None = None, *,
                 weights_dict: dict | None = None, version: int | None = None) -> dict[str, Any]:
        """Evaluate now and return the result.

        Args:
            weights: the policy's weights: an ``nn.Module``, a TensorDict of weights or a state
                dict (None: those loaded last); copied before this returns.
            step: the result's ``"<prefix>/step"`` (None: an internal counter, 0, 1, ...).
            weights_dict: TorchRL's ``{"policy": weights}`` (``weights`` fills ``"policy"``).
            version: the result's ``"<prefix>/policy_version"``, the version of these weights
                (None: how many weights this evaluator loaded; without ``weights``: the version
                loaded last).
        """
        return self._evaluate(self._request(weights, step, weights_dict, version))

    def trigger_eval(self, weights: Any = None, step: int | None = None, *,
                     weights_dict: dict | None = None, version: int | None = None) -> bool:
        """Start an evaluation in the background (arguments as for :meth:`evaluate`): True if it
        was scheduled, False if ``busy_policy="skip"`` skipped it because another is pending."""
        request = self._request(weights, step, weights_dict, version)
        with self._cond:
            if self._closed:
                raise RuntimeError(CLOSED)
            if self._running is not None or self._queued:
                if self._busy_policy == "error":
                    raise RuntimeError(BUSY)
                if self._busy_policy == "skip":
                    return False
            self._queued.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="evaluator", daemon=True)
                self._thread.start()
        return True

    def poll(self, timeout: float = 0) -> dict[str, Any] | None:
        """The oldest background result not handed out yet, waiting up to ``timeout`` seconds
        for one; None if there is none. A background evaluation's error is raised here."""
        with self._cond:
            if timeout > 0:
                self._cond.wait_for(self._settled, timeout)
            return self._pop()

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """As :meth:`poll`, waiting up to ``timeout`` seconds (None: no limit) while an
        evaluation is pending; None at once when none is."""
        with self._cond:
            self._cond.wait_for(self._settled, timeout)
            return self._pop()

    @property
    def pending(self) -> bool:
        """Whether a background evaluation runs or waits in the queue."""
        with self._cond:
            return self._running is not None or bool(self._queued)

    @property
    def results(self) -> list[dict[str, Any]]:
        """Every result so far (blocking and background), in the order the evaluations ended."""
        with self._cond:
            return list(self._results)

    @property
    def collector(self) -> Any:
        """The collector that runs the evaluations (None before the first)."""
        return self._run.collector

    @staticmethod
    def extract_weights(policy: nn.Module) -> TensorDictBase:
        """Detached, cloned CPU weights of ``policy``, safe to hand to another thread."""
        return options.extract_weights(policy)

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self, timeout: float = 5.0) -> None:
        """Drop the queued evaluations, stop the one in progress, release the collector and its
        worker; waits up to ``timeout`` seconds for the background thread. Safe to call again."""
        with self._cond:
            self._closed = True
            self._queued.clear()
            thread = self._thread
        self._run.interrupt()
        if thread is not None:
            thread.join(timeout)
        self._run.shutdown()
        with self._cond:
            self._running = None
            self._cond.notify_all()
            export, self._export = self._export, None
        if export is not None:
            # after the write in progress, if the evaluation ends within timeout
            written = self._serial.acquire(timeout=timeout)
            try:
                export.close()
            finally:
                if written:
                    self._serial.release()

    def __del__(self) -> None:
        try:
            self.shutdown(timeout=2.0)
        except Exception:
            # interpreter shutdown, or a constructor that raised
            pass

    def state_dict(self) -> dict[str, Any]:
        """The step counter, the version loaded and the results, when nothing is pending or
        unread."""
        with self._cond:
            if self._running is not None or self._queued or self._ready:
                raise RuntimeError(f"Evaluator checkpointing requires no {UNSETTLED} evaluation "
                                   "results.")
            return {"step_counter": self._step_counter, "policy_version": self._version,
                    "results": [dict(result) for result in self._results]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counter, version and results, when nothing is pending or
        unread."""
        with self._cond:
            if self._running is not None or self._queued or self._ready:
                raise RuntimeError("Evaluator state cannot be restored while evaluation work is "
                                   f"{UNSETTLED}.")
            self._step_counter = int(state_dict.get("step_counter", 0))
            self._version = int(state_dict.get("policy_version", 0))
            self._results = [dict(result) for result in state_dict.get("results", [])]

    # ------------------------------------------------------------------ internals
    def _request(self, weights: Any, step: Any, weights_dict: Any, version: Any) -> Request:
        request = options.request(weights, step, weights_dict, version)
        if request.step is not None:
            return request
        with self._cond:
            step, self._step_counter = self._step_counter, self._step_counter + 1
        return dataclasses.replace(request, step=step)

    def _evaluate(self, request: Request) -> dict[str, Any]:
        with self._serial:
            if self._closed:
                raise RuntimeError(CLOSED)
            dump_step = int(request.step) if self._dump_video else None
            batch, seconds = self._run.run(request.weights, dump_step)
            if request.version is not None:
                self._version = int(request.version)
            elif request.weights is not None:
                self._version = self._run.policy_version
            found = metrics.episode_metrics(batch, self._reward_keys, self._done_keys,
                                            self._metrics_fn, seconds)
            result = metrics.named(found, self._log_prefix, int(request.step), self._version)
            with self._cond:
                self._results.append(result)
                export = self._export
            values = metrics.scalars(result)
            for collector in self._reported_to:
                collector.report_evaluation(self._log_prefix, values)
            if export is not None:
                # written at the step, not as a number
                values.pop(f"{self._log_prefix}/step")
                export.write_scalars(values, int(request.step), GOES_ON)
        if self._on_result is not None:
            try:
                self._on_result(metrics.as_tensordict(result))
            except Exception:
                # as TorchRL: a failing callback does not fail the evaluation
                logger.warning("Evaluator on_result callback failed", exc_info=True)
        return result

    def _serve(self) -> None:
        """The background thread: evaluates the queued requests in order, then ends."""
        while True:
            with self._cond:
                if self._closed or not self._queued:
                    self._thread = None
                    self._cond.notify_all()
                    return
                request = self._running = self._queued.popleft()
            result = None
            try:
                result = self._evaluate(request)
            except BaseException as err:
                # raised by poll()/wait(); dropped once shut down
                with self._cond:
                    if not self._closed and self._error is None:
                        self._error = err
            with self._cond:
                if result is not None:
                    self._ready.append(result)
                self._running = None
                self._cond.notify_all()

    def _settled(self) -> bool:
        idle = self._running is None and not self._queued
        return bool(self._ready) or self._error is not None or idle

    def _pop(self) -> dict[str, Any] | None:
        if self._ready:
            return self._ready.popleft()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return None
