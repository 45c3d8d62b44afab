"""The single-process collector: one env (single or vector), one policy, batches
in TorchRL's layout."""
from __future__ import annotations

import threading
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, set_interaction_type

from rpc_collectors.core import checks, options
from rpc_collectors.single_process import batch_edits, collector_setup, envs, preemption, run_meter
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.single_process.collector_views import CollectorViews
from rpc_collectors.single_process.dispatching import DispatchingCollector
from rpc_collectors.single_process.policies import RandomPolicy, StepPolicy, run_device
from rpc_collectors.single_process.trajectories import TrajectoryIds, pool_state
from rpc_collectors.transport.weight_updates import whole_update
from rpc_collectors.transport.weights import load_weights, one_source, signature_of

POLICY_VERSION = ("collector", "policy_version")
# TorchRL's track_policy_version key, at the root and under "next"
TORCHRL_VERSION = "policy_version"
# seconds shutdown() waits for a batch in progress in another thread (an interrupted one ends at
# its next step) to end, its steps counted, before it closes the env
BATCH_END_WAIT = 5.0


class Collector(CollectorViews, BaseCollector, metaclass=DispatchingCollector):
    """Collects batches of ``frames_per_batch`` frames from one env in this process.

    Args:
        create_env_fn: an env (``GymEnv``, gymnasium env or id, or any TorchRL-style env) or a
            callable returning one.
        policy: a ``TensorDictModule``, an ``nn.Module`` (reads ``"observation"``, writes
            ``"action"``), a callable on TensorDicts, or None for random actions.
        frames_per_batch: frames per batch; rounded up to a multiple of the env's batch size,
            with a warning, as TorchRL does.
        total_frames: frames in the whole run, -1 for endless.
        max_frames_per_traj: truncate trajectories at this many steps (adds ``"step_count"``);
            None or -1 for no limit.
        init_random_frames: the first batches, up to this many frames, use random actions.
        reset_at_each_iter: reset the env at the start of every batch.
        split_trajs: yield ``[n_traj, T_max]`` padded trajectories instead of ``[(B,) T]``.
        postproc: applied to each batch before it is yielded.
        device, storing_device, env_device, policy_device: where batches are stored, the env
            runs and the policy runs (``device`` is the default of the other three).
        replay_buffer: an object with ``.extend(td)``; batches go there and iteration yields None.
        exploration_type: TorchRL's ``ExplorationType`` (tensordict's ``InteractionType``) set
            around every policy call; default ``RANDOM``, so probabilistic policies sample.
        track_policy_version: batches carry ``("collector", "policy_version")`` (int64, the
            weights version that chose each action) and TorchRL's ``"policy_version"`` and
            ``("next", "policy_version")``, as its ``PolicyVersion`` transform writes them: the
            version at each step, and at the root the version the observation came with. Without
            it batches have no version key (TorchRL's key set); ``last_batch`` has the versions.
        create_env_kwargs: keyword arguments for ``create_env_fn`` (an env instance takes them only
            if it has ``update_kwargs``, as TorchRL's batched envs).
        policy_factory: called here to build the policy (instead of ``policy``).
        set_truncated: mark the last step of every batch truncated (and done), as TorchRL does;
            the env must have a ``"truncated"`` done key.
        reset_when_done: True only (TorchRL refuses False too).
        track_traj_ids: False: batches carry no ``("collector", "traj_ids")`` (then ``split_trajs``
            cannot be used).
        extend_buffer: False: the ``replay_buffer`` gets each step with ``add()`` rather than the
            whole batch with ``extend()`` (then without ``postproc`` or ``split_trajs``).
        compile_policy: True or ``torch.compile`` keyword arguments: the policy runs compiled.
        compact_obs: drop ``("next", <observation>)`` entries, which the next step's root holds too
            (rewards and done flags stay), as TorchRL does.
        pre_collect_hook, post_collect_hook: called before each batch is collected, and with each
            batch (after ``postproc``) before it is yielded or written to the replay buffer.
        trajs_per_batch: yield batches of this many whole trajectories (``frames_per_batch`` is then
            the step of collection), trajectories in flight held back, as TorchRL does: ``[n,
            T_max]`` zero-padded with ``("collector", "mask")`` (``traj_format="padded"``) or ``[sum
            T_i]`` (``"cat"``). With a ``replay_buffer`` each trajectory is written to it flat as it
            ends, ``trajs_per_write`` of them per ``extend()`` (None: all that ended with a batch).
        replay_write_mode: TorchRL's: ``"rollout"`` writes each batch into the ``replay_buffer``;
            ``"trajectory"`` writes only whole trajectories, each flat as it ends (as
            ``trajs_per_batch`` with a buffer does); None: ``"trajectory"`` with ``trajs_per_batch``
            and a ``replay_buffer``, else ``"rollout"``.
        use_buffers: True: steps are stacked into one dense TensorDict (a ``RuntimeError`` for an
            env whose observation shapes change, and a ``TypeError`` with a ``replay_buffer``, as in
            TorchRL); None or False: as TorchRL without buffers, a lazy stack where shapes change.
        auto_register_policy_transforms: True: a TorchRL env gets the transforms a recurrent
            policy needs (``InitTracker``, ``TensorDictPrimer``) if it lacks them; None (TorchRL
            0.14's default): a ``FutureWarning`` says they lack; False: nothing.
        worker_idx: TorchRL's index of this collector among a multi-worker collector's workers
            (their ``get_distant_attr("worker_idx")``); the workers of ours set it themselves.
        traj_id_start, traj_id_stride: trajectory ids are ``start + k * stride``; multi-worker
            collectors give each worker its own ``start`` so ids never collide.
        no_cuda_sync: TorchRL's; this collector makes no CUDA synchronize calls (True or False).
        interruptor: TorchRL's: its ``collection_stopped()``, True after a step, ends the batch
            there, padded as a preempted worker's (trajectory id -1, ``("collector", "mask")``
            False).
        return_same_td: TorchRL's: every batch is written into the TensorDict handed out first
            (while its shape and keys stay), so each iteration returns the same object with new
            values: clone a batch you keep. Not with a ``replay_buffer`` or ``trajs_per_batch``
            (a ``TypeError``).
        trust_policy, cudagraph_policy, weight_sync_schemes: TorchRL's, as
            :mod:`rpc_collectors.core.torchrl_args` maps them (a plain module called on TensorDicts;
            CUDA graphs only as a pass-through without CUDA; ``NoWeightSyncScheme`` makes
            ``update_policy_weights_`` do nothing, the other schemes change nothing in one process).

    Batches have shape ``[T]`` (dim name ``"time"``) or ``[B, T]`` for a vector env of B.
    ``Collector(..., num_collectors=N, backend=...)`` builds a multi-worker collector
    (:mod:`.dispatch`).
    """

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool | None = None,
        postproc: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        replay_buffer: Any = None,
        metrics: Any = None,
        exploration_type: Any = InteractionType.RANDOM,
        track_policy_version: bool = False,
        create_env_kwargs: dict | None = None,
        policy_factory: Any = None,
        set_truncated: bool = False,
        reset_when_done: bool = True,
        track_traj_ids: bool = True,
        extend_buffer: bool = True,
        compile_policy: bool | dict | None = None,
        compact_obs: bool = False,
        pre_collect_hook: Any = None,
        post_collect_hook: Any = None,
        trajs_per_batch: int | None = None,
        replay_write_mode: str | None = None,
        traj_format: str | None = None,
        trajs_per_write: int | None = None,
        auto_register_policy_transforms: bool | None = None,
        use_buffers: bool | None = None,
        traj_id_start: int = 0,
        traj_id_stride: int = 1,
        trust_policy: bool | None = None,
        cudagraph_policy: bool | dict | None = None,
        weight_sync_schemes: dict | None = None,
        worker_idx: int | None = None,
        no_cuda_sync: bool = False,
        interruptor: Any = None,
        return_same_td: bool = False,
    ) -> None:
        return_same_td = checks.return_same_td(
            return_same_td, replay_buffer is not None and not self._ignore_rb, trajs_per_batch)
        # a subclass with _ignore_rb keeps its buffer: the rest is set up as without one
        kept_buffer, replay_buffer = replay_buffer, None if self._ignore_rb else replay_buffer
        super().__init__(options.Batches.given(locals()), post_collect_hook)
        # each of these options checked there, once
        c = options.Collect.given(locals())
        use_buffers = collector_setup.keep_options(self, c, worker_idx, no_cuda_sync, interruptor,
                                                   weight_sync_schemes)
        policy = checks.policy_or_factory(policy, c.policy_factory)
        if policy is not None and not callable(policy):
            # raises the TypeError that names the argument
            StepPolicy(policy)
        envs = collector_setup.open_env(self, create_env_fn, policy, c)
        self.frames_per_env = checks.frames_per_batch_fits(self.requested_frames_per_batch, envs)
        self.frames_per_batch = self.frames_per_env * envs
        checks.total_frames_fits(self.total_frames, self.frames_per_batch)
        self.policy = None if policy is None or isinstance(policy, RandomPolicy) else StepPolicy(
            policy, self.devices["policy_device"], self.action_keys, self.compile_policy,
            c.trust_policy
        )
        collector_setup.check_random_actions(self, create_env_fn, policy)
        traj_ids = TrajectoryIds(traj_id_start, traj_id_stride)
        collector_setup.open_rollout(self, traj_ids, use_buffers)
        self.replay_buffer, self.return_same_td = kept_buffer, return_same_td
        # return_same_td: what every batch is written into
        self._same_td: TensorDictBase | None = None
        self._start_state()
        if self.policy is not None:
            collector_setup.check_policy(self)

    def _start_state(self) -> None:
        """Versions, pending weights, seeds, locks and preemption before the first batch."""
        self.policy_version = 0
        # the version the observation the next batch starts from came with
        self._obs_version = 0
        self._pending: tuple[Any, int] | None = None
        # the last set_seed's seed: a resume draws the env's next seed from its sequence
        self._seed: int | None = None
        self._resumes = 0
        self._lock = threading.Lock()
        # held by a batch in progress: state changes wait for its end
        self._busy = threading.Lock()
        # a worker's, when the trainer may end its batches early
        self.preemption: preemption.Preemption | None = None
        # the worker process is closing: the batch in progress ends
        self._interrupted = threading.Event()

    # ------------------------------------------------------------------ collection
    def _discards_in_flight(self) -> bool:
        return self.reset_at_each_iter

    def _collect_batch(self) -> TensorDictBase:
        with self._busy:
            return self._collect_locked()

    def _collect_locked(self) -> TensorDictBase:
        if self.pre_collect_hook is not None:
            self.pre_collect_hook()
        self._apply_pending_weights()
        if self.reset_at_each_iter and not self.rollout.fresh:
            self.rollout.invalidate()
        random, fresh_obs = self._frames < self.init_random_frames, self.rollout.needs_reset
        preempted = self.preemption.stopped if self.preemption is not None else (
            None if self.interruptor is None else self.interruptor.collection_stopped)
        interrupted = self._interrupted.is_set
        stopped = interrupted if preempted is None else lambda: interrupted() or preempted()

        def marks() -> dict:
            """The versions to set, read at the batch's end (a node's policy
            tells its version at the first step)."""
            version = self.policy_version
            out = {POLICY_VERSION: (version, version)}
            # TorchRL's keys; at the root, the first step's observation is the previous batch's
            if self.track_policy_version:
                out[TORCHRL_VERSION] = (version if fresh_obs else self._obs_version, version)
                out[("next", TORCHRL_VERSION)] = (version, version)
            return out

        with torch.no_grad(), set_interaction_type(self.exploration_type):
            batch = self.rollout.collect(self.frames_per_env, None if random else self.policy,
                                         stopped, marks)
        if interrupted():
            raise RuntimeError("the collector was interrupted: its worker process is closing")
        self._obs_version = self.policy_version
        return self._finish(batch)

    def _finish(self, batch: TensorDictBase) -> TensorDictBase:
        """A batch's last edits, as TorchRL's: truncated marks, compact
        observations, padding, ids, device."""
        if self.truncated_keys:
            batch_edits.set_truncated(batch, self.truncated_keys)
        if self.compact_keys:
            batch = batch.exclude(*self.compact_keys)
        if self.preemption is not None or self.interruptor is not None:
            batch = preemption.padded(batch, self.frames_per_env)
        if not self.track_traj_ids:
            batch_edits.drop_traj_ids(batch)
        storing, env_device = self.devices["storing_device"], self.devices["env_device"]
        unshared = env_device is None or self.devices["policy_device"] != env_device
        if storing is not None and batch.device != storing:
            batch = batch.to(storing)
        elif storing is None and batch.device is not None and unshared:
            # as TorchRL's: no device was given that the env and the policy share
            batch.clear_device_()
        return batch

    def _place(self, batch: TensorDictBase) -> TensorDictBase:
        """With ``return_same_td``, the batch written into the TensorDict handed out before,
        while its shape and keys stay those of the batch."""
        if not self.return_same_td:
            return batch
        same = self._same_td
        if (same is not None and same.batch_size == batch.batch_size
                and set(same.keys(True, True)) == set(batch.keys(True, True))):
            return same.update_(batch)
        self._same_td = batch
        return batch

    # ------------------------------------------------------------------ weights
    def update_policy_weights_(self, policy_or_weights: Any = None, *, worker_ids: Any = None,
                               weights: Any = None, policy: Any = None) -> None:
        """Use new policy weights from the next batch on, and bump ``policy_version``.

        ``policy_or_weights`` (or TorchRL's ``weights=``/``policy=``) may be an ``nn.Module``, a
        TensorDict of weights, a state dict or TorchRL's per-worker ``{0: weights}``; None re-reads
        the policy given to the constructor (needed when the collector runs a copy of it on another
        device). ``worker_ids`` must be None, 0 or the policy's device for a single-process
        collector. The update is checked whole first: one that raises changed no weight and no
        version.
        """
        policy_or_weights = one_source(policy_or_weights, weights, policy)
        # TorchRL's NoWeightSyncScheme
        if self._no_push:
            return
        module = self.policy.module if self.policy is not None else None
        device = run_device(module, self.devices["policy_device"])
        if policy_or_weights is None and module is not None and module is not self.policy.source:
            # the policy given, re-read into the copy this collector runs
            policy_or_weights = self.policy.source
        if policy_or_weights is not None and module is None:
            raise TypeError("update_policy_weights_: this collector's policy "
                            "has no weights to update")
        layout = signature_of(module) if module is not None else None
        weights = whole_update(policy_or_weights, worker_ids, layout, 1, device)[0]
        weights = weights.clone() if weights is not None else None
        # acknowledged once applied
        self._meter.pushed(run_meter.size_of(weights))
        with self._lock:
            self._pending = (
                weights, self.policy_version + 1 if self._pending is None else self._pending[1] + 1
            )
        if not self.running:
            self._apply_pending_weights()

    def _apply_pending_weights(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        weights, version = pending
        if weights is not None:
            load_weights(self.policy.module, weights)
        self.policy_version = version
        self._meter.acknowledged()

    # ------------------------------------------------------------------ state
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the env (and its random actions); the next batch starts from a fresh reset.

        Returns the next free seed, to seed another collector with. A batch in progress in
        another thread is finished first.
        """
        if not hasattr(self.env, "set_seed"):
            raise TypeError(f"set_seed: the env {self.env!r} has no set_seed method")
        with self._busy:
            next_seed = self.env.set_seed(int(seed))
            self.rollout.invalidate()
            self._seed, self._resumes = int(seed), 0
        return int(next_seed) if next_seed is not None else int(seed) + 1

    def state_dict(self) -> dict:
        """Frames, iteration, trajectory counter, policy weights and version, the env's seed
        sequence: enough to resume (between batches: a batch in progress in another thread is
        finished first)."""
        with self._busy:
            state = self._base_state()
            state.update(traj_count=self.traj_ids.count, policy_version=self.policy_version,
                         seed=self._seed, resumes=self._resumes)
            # ids at the next step
            starting = int(torch.Size(self.env.batch_size).numel()) if self.rollout.fresh else 0
            state["traj_pool"] = pool_state(self.traj_ids.peek(starting), self.run_start)
            if self.policy is not None and self.policy.module is not None:
                state["policy_state_dict"] = {k: v.clone()
                                              for k, v in self.policy.module.state_dict().items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``: envs restart from a reset (the trajectories in progress at
        the save end there; new ones get ids above every id handed out before), and an env that was
        seeded gets a new seed drawn from its seed's sequence, so the resumed run does not replay
        the saved run's first episodes (call ``set_seed`` before, not after, this)."""
        with self._busy:
            self._load_base_state(state)
            self.traj_ids.count = int(state["traj_count"])
            self.policy_version = int(state["policy_version"])
            module = self.policy.module if self.policy is not None else None
            if "policy_state_dict" in state and module is not None:
                module.load_state_dict(state["policy_state_dict"])
            if state.get("seed") is not None:
                if not hasattr(self.env, "set_seed"):
                    raise TypeError("load_state_dict: the state is of a seeded env; this env "
                                    f"{self.env!r} has no set_seed")
                self._seed, self._resumes = int(state["seed"]), int(state.get("resumes", 0)) + 1
                self.env.set_seed(envs.resumed_seed(self._seed, self._resumes))
            self.rollout.invalidate()

    def cut(self) -> None:
        """End the trajectories in progress where the last batch ended: they continue under new ids
        (the env is not reset). A batch in progress in another thread is finished first."""
        with self._busy:
            self.rollout.cut()

    def interrupt(self) -> None:
        """End the batch in progress (in another thread) at its next step, with an error instead of
        a batch: the worker process that runs this collector is closing, and nobody waits for the
        batch."""
        self._interrupted.set()

    def _shutdown(self, close_env: bool) -> None:
        ended = self._busy.acquire(timeout=BATCH_END_WAIT)
        if close_env and hasattr(self.env, "close"):
            self.env.close()
        if ended:
            self._busy.release()
