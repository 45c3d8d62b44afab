"""``AsyncBatchedCollector``: envs step in worker processes, the policy runs once per step for
every env that is ready, in the trainer's process, as TorchRL 0.14.1's class of that name.

The envs' workers are local processes (:class:`~rpc_collectors.pools.local.LocalPool`), each
stepping ``envs_per_worker`` envs (:mod:`rpc_collectors.worker.env_steps`) through their rows of
the step plane (:mod:`rpc_collectors.transport.step_plane`). The inference loop
(:mod:`rpc_collectors.trainer.inference_loop`) acts for the ready envs and assembles the batches
(:mod:`rpc_collectors.trainer.transitions`). :mod:`.batched_startup` starts the workers and the
loop, and restarts a worker that failed.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import torch
from tensordict import TensorDictBase

import rpc_collectors.collectors.batched_startup as batched_startup
from rpc_collectors.collectors.batched_startup import PRIVATE_VERSION
from rpc_collectors.core import batched_args, checks, options
from rpc_collectors.core.futures import outcome
from rpc_collectors.core.metrics import InferenceMetrics, Metrics
from rpc_collectors.pools.local import LocalPool
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.single_process.batch_record import BatchRecord
from rpc_collectors.single_process.policies import StepPolicy
from rpc_collectors.trainer import batched_observing
from rpc_collectors.trainer.batched_admission import Pacing
from rpc_collectors.trainer.inference_loop import InferenceLoop
from rpc_collectors.trainer.lifetime import finalize_before_exit, weak_method
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.threads import inference_threads
from rpc_collectors.trainer.trace_window import MAX_SPANS, TraceWindow
from rpc_collectors.trainer.transitions import BATCH_KEYS, ENV_INDEX
from rpc_collectors.transport.step_plane import StepPlane
from rpc_collectors.transport.weight_updates import whole_update
from rpc_collectors.transport.weights import load_weights, one_source, signature_of

SHUTDOWN_TIMEOUT = 5.0
# seconds between checks for the loop's errors while a batch is awaited
ERROR_POLL = 0.2


class AsyncBatchedCollector(BaseCollector):
    """Collects from envs in worker processes with one batched policy in this process (TorchRL's
    ``AsyncBatchedCollector``, same signature and batch layout).

    Each env worker process steps ``envs_per_worker`` envs; an env's observation and the action
    chosen for it move through shared memory, with one byte down a pipe each way per step. One
    inference loop, a thread of this process, waits until some envs are ready, calls the policy
    once on all of them (at most ``max_batch_size``), and writes the actions back. A worker of
    several envs steps them in two halves, in turn: one half steps while the loop acts for the
    other (Sample Factory's double buffering). The policy is the object you pass: a weight
    change is used by the next forward pass, with no weight push. ``update_policy_weights_()``
    bumps ``policy_version`` (and copies weights in, when given some), under the loop's lock.

    Batches are ``[frames_per_batch]``: the transitions in the order they completed (each env's
    joins once the env's next one completed, see
    :class:`~rpc_collectors.trainer.transitions.Transitions`), with
    ``"env_index"`` and the version that chose each action (``policy_version_key``). ``last_batch``
    (a :class:`~rpc_collectors.single_process.batch_record.BatchRecord`) has their oldest and newest
    versions and the frames of each env.

    Args:
        create_env_fn: a list of env factories (one per env), or one factory with ``num_envs``.
            An env is one env: a gymnasium id, a ``gymnasium.Env``, a ``GymEnv`` of one env, or a
            TorchRL env of batch size ``[]``.
        policy: the policy (``TensorDictModule``, ``nn.Module`` reading ``"observation"`` and
            writing ``"action"``, or a callable on TensorDicts); or ``policy_factory``, called here.
        frames_per_batch, total_frames: as every collector (``-1``: endless).
        max_batch_size, min_batch_size, server_timeout: at most ``max_batch_size`` envs per forward
            pass (default 64); once one env is ready, wait up to ``server_timeout`` s (0.01) for
            ``min_batch_size`` (1, at most the number of envs). Or TorchRL's ``server_config``
            (``InferenceServerConfig``).
        device: where the policy runs (or ``device_config.policy_device``).
        exploration_type: set around each forward pass; default RANDOM.
        policy_version: the version of the first weights; ``policy_version_key``: the batch key of
            each frame's version (None: no key).
        create_env_kwargs: keywords for the factories (a dict, or a list of one dict per env).
        postproc, replay_buffer, post_collect_hook: as every collector; ``replay_write_mode``:
            None or ``"rollout"`` (batches carry no trajectory ids: ``"trajectory"`` is refused).
        num_envs: the number of envs when ``create_env_fn`` is one factory.
        envs_per_worker: envs each worker process steps (TorchRL's; default 1): worker ``w`` steps
            envs ``w * envs_per_worker`` on, the last worker the rest. 2 or more: in two halves.
        num_threads: the torch threads of the inference loop's thread (this collector's meaning of
            TorchRL's ``num_threads``); None: one per 16 envs, within the cores this process may
            run on less the env worker processes and ``torch.get_num_threads()``, at least 1
            (:func:`~rpc_collectors.trainer.threads.inference_threads`). Set in that thread only:
            yours keep their count.
        max_worker_restarts: replace this many failed env workers in all (each of their envs'
            transition in flight is lost, the one before it is marked truncated and done); beyond
            it, a failure is a :class:`~rpc_collectors.WorkerError`.
        prefetch: full batches that may wait for you (the envs wait when they are there).
        rpc_timeout: seconds each env worker may take to start.
        max_policy_lag: no batch handed out more than this many versions behind
            ``policy_version`` (None: no bound; an int >= 1 and >= ``num_envs / frames_per_batch``)
            by admission, as ``policy_lag_mode="admit"`` of the multi-worker collectors: if you
            update the weights at most once per batch, the loop acts for an env only while its
            transitions can still join a batch within the bound, and nothing is dropped
            (:mod:`~rpc_collectors.trainer.batched_admission`). ``policy_lag_mode``: "admit".

    TorchRL's other arguments are accepted where they select this path (``transport`` None,
    ``"auto"`` or ``"driver"``, ``backend``/``env_backend`` ``"multiprocessing"``,
    ``policy_backend`` ``"threading"``, ``env_exchange`` ``"auto"``/``"shm"``,
    ``transition_chunk_size`` ``"auto"``/1, ``verbose``) and refused otherwise; those of features
    not offered (``reset_at_each_iter``, ``yield_completed_trajectories``, ``weight_sync``,
    ``weight_sync_model_id``, ``worker_affinity``, ``driver_affinity``) only at their defaults.
    """

    # batches carry no trajectory ids: an env's steps are told apart by its index
    _stream_key = ENV_INDEX

    def __init__(
        self,
        create_env_fn: Any,
        *,
        policy: Any = None,
        policy_factory: Any = None,
        frames_per_batch: int,
        total_frames: int = -1,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        server_timeout: float | None = None,
        transport: Any = None,
        device: Any = None,
        backend: str | None = None,
        env_backend: str | None = None,
        env_exchange: str = "auto",
        envs_per_worker: int = 1,
        transition_chunk_size: int | str = "auto",
        policy_backend: str | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        exploration_type: Any = None,
        replay_buffer: Any = None,
        metrics: Any = None,
        replay_write_mode: str | None = None,
        post_collect_hook: Any = None,
        yield_completed_trajectories: bool = False,
        weight_sync: Any = None,
        weight_sync_model_id: str = "policy",
        verbose: bool = False,
        create_env_kwargs: dict | list | None = None,
        worker_affinity: Any = None,
        driver_affinity: Any = None,
        server_config: Any = None,
        device_config: Any = None,
        policy_version: int = 0,
        policy_version_key: Any = "policy_version",
        num_envs: int | None = None,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        prefetch: int = 1,
        rpc_timeout: float = 60.0,
        max_policy_lag: int | None = None,
        policy_lag_mode: str = "admit",
    ) -> None:
        super().__init__(options.Batches.given(locals()), post_collect_hook)
        # transitions, whichever env's: not rounded
        self.frames_per_batch = self.requested_frames_per_batch
        batched_args.replay_write_mode(self.replay_write_mode)
        batched_args.one_policy(policy, policy_factory)
        factories = batched_args.env_factories(create_env_fn, num_envs)
        kwargs = batched_args.env_kwargs(create_env_kwargs, len(factories))
        self.batching = batched_args.batching(server_config, max_batch_size, min_batch_size,
                                              server_timeout, len(factories))
        batched_args.backends(transport, backend, env_backend, policy_backend, env_exchange,
                              transition_chunk_size)
        self.envs_per_worker = checks.positive_int("envs_per_worker", envs_per_worker)
        batched_args.unsupported(
            reset_at_each_iter=reset_at_each_iter,
            yield_completed_trajectories=yield_completed_trajectories, weight_sync=weight_sync,
            weight_sync_model_id=weight_sync_model_id, worker_affinity=worker_affinity,
            driver_affinity=driver_affinity,
        )
        checks.boolean("verbose", verbose)
        self.max_policy_lag = batched_args.policy_lag(max_policy_lag, policy_lag_mode,
                                                      len(factories), self.frames_per_batch)
        self.policy_lag_mode = policy_lag_mode
        device = batched_args.policy_device(device, device_config)
        self._take(exploration_type, policy_version, policy_version_key, max_worker_restarts,
                   prefetch, rpc_timeout)
        self.num_workers = -(-len(factories) // self.envs_per_worker)
        num_threads = options.check("num_threads", num_threads)
        self.num_threads = inference_threads(num_threads, self.num_workers, len(factories))
        self._specs = batched_args.worker_specs(factories, kwargs, self._meter.on)
        self.policy = StepPolicy(policy if policy_factory is None else policy_factory(), device)
        self._open(len(factories))

    def _take(self, exploration_type: Any, policy_version: Any, policy_version_key: Any,
              max_worker_restarts: Any, prefetch: Any, rpc_timeout: Any) -> None:
        """Keep the options of the inference loop and the env workers, each checked."""
        self.exploration_type = options.check("exploration_type", exploration_type)
        self.policy_version = checks.non_negative_int("policy_version", policy_version)
        self.policy_version_key = batched_args.version_key(policy_version_key, BATCH_KEYS)
        self.max_worker_restarts = checks.non_negative_int("max_worker_restarts",
                                                           max_worker_restarts)
        self.prefetch = checks.positive_int("prefetch", prefetch)
        self.rpc_timeout = options.check("rpc_timeout", rpc_timeout)

    def _open(self, num_envs: int) -> None:
        """Start the env workers and the inference loop; a failure shuts down what started.

        ``_seeds``: the seed of each worker's first env; ``_inference``: the loop's counters, once
        it is shut down."""
        self.num_envs = num_envs
        self._lock = threading.Lock()
        # max_policy_lag's figures of the trainer's side, which the loop reads
        self._pacing = (None if self.max_policy_lag is None
                        else Pacing(self.max_policy_lag, weak_method(self._version)))
        self.roster = Roster(self.num_workers, self.max_worker_restarts, name="env worker {}")
        self._seeds: list[int | None] = [None] * self.num_workers
        self._loop: InferenceLoop | None = None
        self._inference: InferenceMetrics | None = None
        self.plane: StepPlane | None = None
        self.pool = LocalPool(self.num_workers, self.rpc_timeout, lambda *_: None)
        self.tracing = TraceWindow(batched_observing.PoolParts(self.pool), self._meter)
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise
        # the loop's thread reaches this object only weakly: dropping it stops the loop and the envs
        self._release = finalize_before_exit(self, batched_startup.close, self._loop, self.plane,
                                             self.pool, SHUTDOWN_TIMEOUT)

    # ------------------------------------------------------------------ start-up
    def _start(self) -> None:
        """Start the env workers, their plane and the inference loop
        (:func:`.batched_startup.start`)."""
        self._loop = batched_startup.start(self)

    def _version(self) -> int:
        return self.policy_version

    def _starting(self, worker: int, step: Any) -> None:
        """Run a start-up ``step`` of ``worker``; its failure is a WorkerError naming the worker."""
        batched_startup.starting(self, worker, step)

    def _join(self, worker: int) -> None:
        """Have ``worker`` step its envs through their rows of the plane."""
        batched_startup.join(self, worker)

    def _on_failure(self, worker: int, text: str) -> bool:
        """In the loop: replace ``worker`` if the budget allows, else queue its WorkerError."""
        return batched_startup.replace(self, worker, text)

    # ------------------------------------------------------------------ batches
    def _collect_batch(self) -> TensorDictBase:
        loop = self._loop
        if loop is None or self._closing:
            raise RuntimeError("AsyncBatchedCollector was shut down")
        loop.start()
        self._paced(Pacing.asked)
        while True:
            try:
                error = loop.errors.get_nowait()
            except queue.Empty:
                error = None
            if error is not None:
                self.shutdown()
                raise error
            try:
                batch = loop.batches.get(timeout=ERROR_POLL)
                break
            except queue.Empty:
                # the loop keeps going, or it was stopped: shutdown() in another thread
                if loop.stop.is_set() and loop.errors.empty() and loop.batches.empty():
                    raise RuntimeError("AsyncBatchedCollector was shut down") from None
        self._paced(Pacing.taken)
        if self.total_frames != -1 and self._frames + batch.numel() > self.total_frames:
            batch = batch[:self.total_frames - self._frames]
        self._record(batch)
        if self._pacing is not None:
            self._pacing.check(self.last_batch)
        if self.tracing.rounds_left:
            # a trace window is open
            self.tracing.handed_out()
        return batch

    def _paced(self, event: Callable[[Pacing], None]) -> None:
        """Tell the pacing of ``max_policy_lag`` (if any) of ``event``; the loop looks again."""
        if self._pacing is not None:
            event(self._pacing)
            if self.plane is not None:
                self.plane.wake()

    def _record(self, batch: TensorDictBase) -> None:
        key = self.policy_version_key if self.policy_version_key is not None else PRIVATE_VERSION
        versions = batch.get(key)
        low, high = torch.aminmax(versions)
        envs, counts = torch.unique(batch.get(ENV_INDEX), return_counts=True)
        frames_of_env = dict(zip(envs.tolist(), counts.tolist()))
        self.last_batch = BatchRecord(self._iter + 1, batch.numel(), int(low), int(high),
                                      self.policy_version, frames_of_env)
        if self.policy_version_key is None:
            batch.exclude(PRIVATE_VERSION, inplace=True)

    # ------------------------------------------------------------------ weights, seeds, state
    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, weights: Any = None,
        policy: Any = None, model_id: str | None = None,
    ) -> None:
        """The next forward pass uses new weights: those given (an ``nn.Module``, a TensorDict of
        weights or a state dict), copied into the policy, or, with none, the policy as it is now
        (trained in place; a policy on another ``device`` re-reads the one you passed). Bumps
        ``policy_version``. The update is checked whole first: one that raises changed no weight
        and no version."""
        source = one_source(policy_or_weights, weights, policy)
        if model_id not in (None, "policy"):
            raise ValueError(f"update_policy_weights_: model_id={model_id!r} is unknown; "
                             "accepted: None or 'policy'")
        if worker_ids is not None:
            raise ValueError(f"update_policy_weights_: worker_ids={worker_ids!r} is not accepted: "
                             "the one policy is in this process; accepted: None")
        module = self.policy.module
        if source is None and module is not None and module is not self.policy.source:
            source = self.policy.source
        if source is not None and module is None:
            raise TypeError("update_policy_weights_: this collector's policy has no weights "
                            "to update")
        signature = signature_of(module) if module is not None else None
        new = whole_update(source, None, signature, 1, None)[0]
        new = new.clone() if new is not None else None
        with self._lock:
            if new is not None:
                load_weights(module, new)
            self.policy_version += 1
        self._paced(Pacing.updated)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed env i with ``seed + i`` from its next reset on (each env's first reset is done at
        start-up: seed before iterating, and the next episode of each env starts from its seed)."""
        seed = checks.seed(seed)
        for worker in range(self.num_workers):
            self._seeds[worker] = seed + self.plane.envs_of(worker)[0]
            outcome(self.pool.calls.set_seed(worker, self._seeds[worker]))
        return seed + self.num_envs

    def state_dict(self) -> dict:
        """Frames, iteration and ``policy_version`` (the policy's weights are yours)."""
        return {**self._base_state(), "policy_version": self.policy_version}

    def load_state_dict(self, state: dict) -> None:
        self._load_base_state(state)
        self.policy_version = int(state["policy_version"])

    def _serving_steps(self) -> int:
        """What its env workers stepped (their pool reads it, also once they exited)."""
        return sum(self.pool.stepped(worker) or 0 for worker in range(self.num_workers))

    def metrics(self) -> Metrics:
        """As every collector's, with each env worker's phases, the roster of env workers and the
        inference loop's forward passes (:mod:`~rpc_collectors.trainer.batched_observing`)."""
        return batched_observing.of(self, super().metrics())

    def trace(self, path: Any, rounds: int = 1, max_spans: int = MAX_SPANS) -> None:
        """Write the timeline of the next ``rounds`` batches (the inference loop's waits and forward
        passes, each env worker's phases), at most ``max_spans`` spans per thread, to ``path`` once
        they are handed out, as a Chrome trace file
        (:mod:`~rpc_collectors.trainer.trace_window`)."""
        if self._loop is None or self._closing:
            raise RuntimeError("AsyncBatchedCollector was shut down")
        self.tracing.start(path, rounds, max_spans)

    def server_stats(self, *, reset: bool = False) -> dict:
        """TorchRL's inference statistics: none are kept."""
        return {}

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, timeout: float | None = None, close_env: bool = True,
                 raise_on_error: bool = True) -> None:
        """Stop the inference loop, the envs and their workers; bounded and idempotent."""
        self._shutdown_timeout = SHUTDOWN_TIMEOUT if timeout is None else timeout
        super().shutdown(close_env)

    def _shutdown(self, close_env: bool) -> None:
        release = getattr(self, "_release", None)
        if release is not None:
            release.detach()
        timeout = getattr(self, "_shutdown_timeout", SHUTDOWN_TIMEOUT)
        batched_startup.close(self._loop, self.plane, self.pool, timeout)
        if self._loop is not None:
            # its counters outlive it, for metrics()
            self._inference = batched_observing.inference_of(self._loop)
        self.plane = self._loop = None

