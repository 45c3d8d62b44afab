"""What every collector shares: the batch iterator, frame accounting, background collection."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

from rpc_collectors.core import options
from rpc_collectors.core.metrics import FrameAccount, WorkerMetrics
from rpc_collectors.single_process import (
    background,
    batch_record,
    collector_metrics,
    metric_exports,
    profiling,
    remote_calls,
)
from rpc_collectors.single_process.batch_record import BatchRecord
from rpc_collectors.single_process.frame_ledger import Ledger
from rpc_collectors.single_process.preemption import valid_frames
from rpc_collectors.single_process.private_keys import drop_private_keys
from rpc_collectors.single_process.profiling import ProfileConfig
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.single_process.trajectories import TRAJ_IDS, shift_ids, split_trajectories
from rpc_collectors.single_process.trajectory_progress import TrajectoryProgress
from rpc_collectors.single_process.whole_trajectories import WholeTrajectories, write_batch


class BaseCollector:
    """Common base of all collectors.

    Subclasses implement ``_collect_batch()`` (one batch, in TorchRL's layout),
    ``update_policy_weights_``, ``set_seed``, ``state_dict``/``load_state_dict`` and ``_shutdown``.
    Iterating yields batches until ``total_frames`` is reached (forever when it is -1), without
    private keys; with a ``replay_buffer`` each batch is written there and the iterator yields None.

    ``last_batch`` is the :class:`~rpc_collectors.single_process.batch_record.BatchRecord` of the
    batch handed out last (frames, the weight versions that chose its actions, how far they were
    behind the trainer's, the frames of each worker), whether or not the batch carries
    ``("collector", "policy_version")`` and ``("collector", "worker_id")``
    (``track_policy_version=True``).
    """

    # False where the hook runs in the workers (multi-worker collectors)
    _runs_post_hook = True
    # TorchRL's attribute: False keeps private entries in the batches
    _exclude_private_keys = True
    # True where batches come from collectors that dropped them (workers)
    _sources_drop_private_keys = False
    # whether batches are dense TensorDicts (None: not known before the first)
    _use_buffers: bool | None = None
    # batches keep ("collector", "policy_version"/"worker_id") (and TorchRL's keys)
    track_policy_version = False
    # a worker's or node's collector: its batches keep the keys for the trainer to read
    keep_version_key = False
    # TorchRL's progress counters of stats() (``progress``) and the record of each batch
    # (``last_batch``, the frames per worker): kept by the collector the user iterates; off in a
    # collector whose batches a trainer counts and records again (a worker's, a node's local one)
    counts_progress = records_batches = True
    # the weights version every worker acknowledged (a multi-worker collector: None if they differ)
    policy_version = 0
    # frames collected and not handed out (multi-worker collectors drop some)
    dropped_frames = 0
    # what tells a batch's trajectories apart (stats() counters)
    _stream_key: str | tuple = TRAJ_IDS
    # of each batch handed out: set once by each collector, rounded up over its envs or workers
    frames_per_batch: int
    # which start of its run this is (RunCheckpoint counts them): its trajectory ids' range
    run_start = 0
    # TorchRL's: True in a subclass that writes its replay_buffer itself (TorchRL's runners):
    # batches are handed out as without one
    _ignore_rb = False
    # TorchRL's profile methods (:mod:`.profiling`)
    enable_profile, disable_profile = profiling.enable_profile, profiling.disable_profile
    _start_profile, profile_config = profiling.start_profile, property(profiling.profile_config)
    _profiler = property(profiling.profiler)
    # metrics(), and the evaluations reported for it (:mod:`.collector_metrics`)
    metrics, report_evaluation = collector_metrics.metrics, collector_metrics.report_evaluation
    metrics_on = property(collector_metrics.metrics_on)

    def __init__(self, batches: options.Batches, post_collect_hook: Any = None, *,
                 one_per_worker: bool = False) -> None:
        """``batches``: the options of what is handed out, each checked there; ``one_per_worker``:
        whether ``frames_per_batch`` may be TorchRL's list of one per worker (multi-worker
        collectors)."""
        frames = batches.frames_per_batch
        if isinstance(frames, list) and not one_per_worker:
            raise ValueError(f"frames_per_batch={frames!r} is invalid; accepted: an int > 0")
        # TorchRL's: as given; each collector sets frames_per_batch once,
        # rounded up over its envs or workers
        self.requested_frames_per_batch = sum(frames) if isinstance(frames, list) else frames
        self.total_frames, self.split_trajs = batches.total_frames, batches.split_trajs
        self.postproc = batches.postproc
        self.replay_buffer, self.extend_buffer = batches.replay_buffer, batches.extend_buffer
        self.post_collect_hook = options.check("post_collect_hook", post_collect_hook)
        self.trajs_per_batch, self.traj_format = batches.trajs_per_batch, batches.traj_format
        self.replay_write_mode = batches.replay_write_mode
        self.trajs_per_write = batches.trajs_per_write
        self.progress = TrajectoryProgress(self._stream_key)
        self._frames, self._iter = 0, 0
        # trajs_per_batch: the trajectories held back
        self._assembly = WholeTrajectories()
        self.last_batch: BatchRecord | None = None
        # of the last batch's steps, for extend_buffer=False
        self._worker_ids: torch.Tensor | None = None
        # frames and batches each worker delivered
        self._worker_totals: dict[int, list[int]] = {}
        self._iterator: Iterator | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._thread_error: BaseException | None = None
        # held by the background thread while it collects and writes a batch
        self._batch_lock = threading.RLock()
        # shutdown() completed
        self._closed = False
        self._iteration_started = False
        self._profile_config: ProfileConfig | None = None
        # shutdown() began: no new work, waits end
        self._closing = False
        # metrics=: checked before any worker starts
        self._meter = RunMeter(*metric_exports.check(batches.metrics))
        # where the frames its envs stepped went (metrics().accounts)
        self.ledger = Ledger()

    # ------------------------------------------------------------------ iteration
    @property
    def frames(self) -> int:
        """Frames collected so far in this run."""
        return self._frames

    @property
    def whole_trajectories(self) -> bool:
        """Whether batches are cut into whole trajectories (``trajs_per_batch``,
        ``replay_write_mode="trajectory"``)."""
        return self.trajs_per_batch is not None or self.replay_write_mode == "trajectory"

    @property
    def writes_buffer(self) -> bool:
        """Whether batches go to ``replay_buffer`` (iteration then yields None)."""
        return self.replay_buffer is not None and not self._ignore_rb

    @property
    def completed(self) -> bool:
        """Whether this run collected its ``total_frames`` (an endless one never does)."""
        return self.total_frames != -1 and self._frames >= self.total_frames

    def __len__(self) -> int:
        if self.total_frames == -1:
            raise TypeError("len() of an endless collector (total_frames=-1) is undefined")
        return -(-self.total_frames // self.frames_per_batch)

    def __iter__(self) -> Iterator[TensorDictBase | None]:
        return self.iterator()

    def iterator(self) -> Iterator[TensorDictBase | None]:
        """Yield batches until ``total_frames`` frames were collected (with ``trajs_per_batch``:
        batches of whole trajectories, from those frames)."""
        if self.whole_trajectories:
            yield from self._whole_trajectories()
            return
        for batch in self._processed_batches():
            if self.writes_buffer:
                self._extend(batch)
                self.progress.written_frames += valid_frames(batch)
                yield None
            else:
                yield batch

    def _processed_batches(self) -> Iterator[TensorDictBase]:
        self._iteration_started = True
        while not self.completed:
            if self._closing:
                raise RuntimeError(f"{type(self).__name__} was shut down")
            profiler = self._profiler
            if profiler is not None:
                profiler.before_batch()
            self._meter.begin()
            # a record of this batch replaces previous
            previous, batch = self.last_batch, self._collect_batch()
            self._meter.arrived(batch)
            shift_ids(batch, self.run_start)
            if profiler is not None:
                profiler.after_batch()
            # a batch cut short by the trainer counts what it holds
            frames = valid_frames(batch)
            self._frames += frames
            self._iter += 1
            if self.counts_progress:
                self.progress.add(batch)
            if self.records_batches:
                batch_record.record(self, batch, frames)
            if self._use_buffers is None and isinstance(batch, TensorDictBase):
                self._use_buffers = not isinstance(batch, LazyStackedTensorDict)
            batch = self._postprocess(self._place(batch))
            if self._runs_post_hook and self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            self._meter.handed_out(self,
                                   self.last_batch if self.last_batch is not previous else None)
            yield batch

    def _postprocess(self, batch: TensorDictBase) -> TensorDictBase:
        """``split_trajs``, ``postproc``, then private entries dropped, as
        TorchRL's collectors do."""
        if self.split_trajs:
            batch = split_trajectories(batch)
        if self.postproc is not None:
            batch = self.postproc(batch)
        kept_private = self.postproc is not None or not self._sources_drop_private_keys
        if self._exclude_private_keys and kept_private:
            batch = drop_private_keys(batch)
        return batch

    def _delivered_frames(self, worker: int) -> int:
        """The frames of worker ``worker`` in the batches handed out so far."""
        return self._worker_totals.get(worker, (0, 0))[0]

    def stats(self) -> dict[str, int | bool]:
        """TorchRL's progress snapshot, plain ints and bools (JSON-serializable): ``"frames"``,
        ``"batches"``, ``"requested_frames_per_batch"``, ``"total_frames"`` and ``"completed"`` (not
        for an endless run), ``"policy_version"`` with ``track_policy_version=True`` (while every
        worker acknowledged one), and the progress counters of TorchRL's next release:
        ``"stepped_frames"`` (``frames`` + ``dropped_frames``), ``"trajectory_completed_frames"``
        and ``"trajectory_pending_frames"`` (the frames handed out of ended and of running
        trajectories: they add up to ``frames``), ``"completed_trajectories"`` and
        ``"replay_written_frames"``."""
        stats: dict[str, int | bool] = {"frames": int(self._frames), "batches": int(self._iter)}
        if self.total_frames >= 0:
            stats.update(total_frames=int(self.total_frames),
                         completed=self.completed)
        stats["requested_frames_per_batch"] = int(self.requested_frames_per_batch)
        if self.track_policy_version and self.policy_version is not None:
            stats["policy_version"] = int(self.policy_version)
        return {**stats, "stepped_frames": int(self._frames + self.dropped_frames),
                **self.progress.counters()}

    def _account(self) -> FrameAccount:
        """Where the frames its envs stepped went (:mod:`.frame_ledger`)."""
        return self.ledger.account(self._serving_steps(), self._frames, int(self.dropped_frames))

    def _serving_steps(self) -> int:
        """Frames its envs stepped so far (one that does not count them: those it took in)."""
        return self._frames + int(self.dropped_frames)

    def _worker_metrics(self) -> tuple[WorkerMetrics, ...]:
        """Each worker process's metrics, from its phase clock (a single-process
        collector: its own)."""
        return ()

    def worker_policy_versions(self) -> list[int | None]:
        """TorchRL's: the weights version each worker acknowledged (None: a push to it is in
        flight, or its slot has no worker); a single-process collector is its own one worker."""
        return [self.policy_version]

    def _newest_version(self) -> int:
        """The version of the newest weights given to ``update_policy_weights_``
        (``BatchRecord.trainer_version``)."""
        return self.policy_version

    def get_distant_attr(self, attr: str) -> Any:
        """TorchRL's: the attribute at the dotted path ``attr`` (a multi-worker
        collector: each worker's)."""
        return remote_calls.attribute(self, attr)

    def map_fn(self, method_name: str, list_of_args: list | None = None,
               list_of_kwargs: list | None = None) -> list:
        """TorchRL's: ``method_name`` (a dotted path) called once per entry of ``list_of_args`` and
        ``list_of_kwargs``; the results in order (a multi-worker collector: one entry per
        worker)."""
        return remote_calls.call_entries(self, method_name, list_of_args, list_of_kwargs)

    def _whole_trajectories(self) -> Iterator[TensorDictBase | None]:
        """As TorchRL: batches of ``trajs_per_batch`` complete trajectories, or trajectories
        written to the replay buffer (:meth:`.WholeTrajectories.batches`)."""
        return self._assembly.batches(self)

    @property
    def _traj_assembly(self) -> tuple[dict, list]:
        """TorchRL's: the trajectories ``trajs_per_batch`` holds back, in flight and complete."""
        return self._assembly.in_flight, self._assembly.complete

    def _discards_in_flight(self) -> bool:
        """Whether every batch starts from a reset, so trajectories in flight never complete."""
        return False

    def _extend(self, batch: TensorDictBase) -> None:
        """Write a batch into ``replay_buffer`` (as TorchRL's single-process collector: as it is, or
        with ``extend_buffer=False`` step by step)."""
        write_batch(self.replay_buffer, batch, self.extend_buffer)

    def next(self) -> TensorDictBase | None:
        """The next batch (None with a replay buffer); StopIteration when the run is complete."""
        if self._iterator is None:
            self._iterator = self.iterator()
        return next(self._iterator)

    def _place(self, batch: TensorDictBase) -> TensorDictBase:
        """``batch``, counted where it was collected, where the user gets it (a storing device)."""
        return batch

    def _collect_batch(self) -> TensorDictBase:
        raise NotImplementedError

    # ------------------------------------------------------ background collection
    def start(self) -> None:
        """Collect in a background thread into ``replay_buffer`` until ``async_shutdown``."""
        background.start(self)

    def _run_background(self) -> None:
        background.run(self)

    def pause(self) -> contextlib.AbstractContextManager[None]:
        """Pause background collection (``start()``) for the ``with`` block, as TorchRL's
        ``pause()``: the batch in progress is written first, then nothing reaches the replay
        buffer until the block ends and collection resumes. A RuntimeError if it is not running.
        Pauses nest: an inner ``pause()`` in the same thread returns at once."""
        return background.paused(self)

    @contextlib.contextmanager
    def between_batches(self) -> Iterator[None]:
        """Hold background collection (``start()``) between two batches for the ``with`` block, as
        :meth:`pause` does, and do nothing when it is not running: the collector's state and the
        replay buffer's content then agree (``RunCheckpoint.save`` uses it)."""
        with self._batch_lock:
            yield

    def async_shutdown(self, timeout: float | None = None, close_env: bool = True) -> None:
        """Stop background collection after the current batch, then shut down.

        Raises the background thread's error, if it had one; batches already written to the
        replay buffer stay there.
        """
        background.shutdown(self, timeout, close_env)

    @property
    def running(self) -> bool:
        """Whether background collection (``start()``) is running."""
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ lifecycle
    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """Prepare weight updates ahead of the first ``update_policy_weights_`` call.

        Nothing is left to prepare here; the arguments of TorchRL's weight updaters are accepted
        and ignored, as TorchRL does when a collector has no updater.
        """

    def shutdown(self, close_env: bool = True) -> None:
        """Release workers and envs; bounded in time and safe to call more than once.

        A call interrupted (Ctrl-C) leaves the rest of the work to the next call.
        """
        if self._closed:
            return
        self._closing = True
        self._stop.set()
        # the batches profiled so far
        if self._profiler is not None:
            self._profiler.stop()
        self._meter.close()
        self._shutdown(close_env)
        self._closed = True

    def _shutdown(self, close_env: bool) -> None:
        raise NotImplementedError

    def __enter__(self) -> "BaseCollector":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def _base_state(self) -> dict:
        return {"frames": self._frames, "iteration": self._iter, "progress": self.progress.state(),
                "accounts": Ledger.state(self._account())}

    def _load_base_state(self, state: dict) -> None:
        self.ledger.load(state, self._frames + int(self.dropped_frames))
        self._frames, self._iter = int(state["frames"]), int(state["iteration"])
        self.progress.load(state.get("progress"))
