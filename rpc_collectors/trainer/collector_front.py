"""The collector front: what a multi-worker collector means, written once for every pool.

The front holds its parts, each owning its state: the roster of its workers and their restarts
(:class:`~rpc_collectors.trainer.roster.Roster`), the request/wait loop with the sync
and async schedules (:class:`~rpc_collectors.trainer.schedule.Schedule`), the weight pushes
(:class:`~rpc_collectors.trainer.weight_pushes.WeightPusher`), trajectory continuity
(:class:`~rpc_collectors.trainer.continuity.Continuity`) and recovery
(:class:`~rpc_collectors.trainer.recovery.Recovery`); it keeps the run's settings, seeding, state
and shutdown. How the workers exist is the pool's business (:mod:`rpc_collectors.pools`);
batches arrive through the data plane (:mod:`rpc_collectors.transport.data`). Every wait goes
through one :class:`~rpc_collectors.trainer.waits.Events` and is bounded by ``rpc_timeout``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from tensordict import TensorDictBase

from rpc_collectors.core import checks
from rpc_collectors.core.errors import Failure, WorkerError
from rpc_collectors.core.metrics import Metrics, WorkerPhases
from rpc_collectors.core.protocol import KILL_WAIT
from rpc_collectors.single_process import preemption, remote_calls
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.trainer import buffer_writes, front_metrics, saved_state, torchrl_views
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.lifetime import Resources, release_with, wait_gone, weak_method
from rpc_collectors.trainer.recovery import Recovery
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.schedule import Schedule
from rpc_collectors.trainer.settings import Settings
from rpc_collectors.trainer.threads import TrainerThreads
from rpc_collectors.trainer.trace_window import MAX_SPANS, TraceWindow
from rpc_collectors.trainer.waits import Events, Joined, Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.transport.data import BatchPlane
from rpc_collectors.transport.rendezvous import host_id
from rpc_collectors.transport.weight_sync import WeightPlane
from rpc_collectors.transport.weights import one_source


class CollectorFront(BaseCollector):
    """A multi-worker collector over a worker pool; public classes choose the pool and layout."""

    _default_cat_results: str | int = 0
    _no_push = False  # TorchRL's NoWeightSyncScheme: no weight plane, update_policy_weights_ does nothing
    _schemes_given: Any = None  # TorchRL's weight_sync_schemes, as given to the constructor
    _ray_actors = False  # RayCollector: the "rpc" transport is one ray.put (TorchRL's RayWeightSyncScheme)
    _runs_post_hook = False  # the collect hooks run in the workers
    _hooks: dict | None = None  # the workers' collect hooks, as given to the constructor or set since
    _sources_drop_private_keys = True  # every worker runs one of our collectors
    max_policy_lag: int | None = None  # async: drop batches further behind (:mod:`.continuity`)
    preemptive_threshold: float | None = None  # TorchRL's, as given (1.0: no preemption, as None)

    def _open(self, settings: Settings, policy: Any, make_pool: Callable[..., Any]) -> None:
        """Start the workers (``make_pool(on_death, on_arrival)``), build their collectors and planes."""
        self._closed = self._closing = True  # until the workers are up
        s = settings
        self.launcher, self.elastic, self.join_timeout = s.launcher, s.elastic, s.join_timeout
        self.num_workers, self.sync, self.cat_results = s.num_workers, s.sync, s.cat_results
        # a sync round stops the other workers once this many handed in (TorchRL's preemptive_threshold)
        self.preempt_after = None if s.preemptive_threshold is None else int(s.num_workers * s.preemptive_threshold)
        self.backend, self.rpc_timeout = s.backend, s.rpc_timeout
        self.update_after_each_batch = s.update_after_each_batch
        self.max_weight_update_interval = s.max_weight_update_interval
        self.exploration_type = s.exploration_type
        self.track_policy_version = s.track_policy_version
        self.frames_per_batch, self._frames_per_batch_worker = s.frames_per_batch, s.frames_per_batch_worker
        if s.preemptive_threshold is None:  # preempted batches vary in size
            checks.total_frames_fits(self.total_frames, self.frames_per_batch)
        self.specs = s.specs
        self.policy = policy
        self.events = self._meter.waits = Events()
        self.tracing = TraceWindow(self, self._meter)
        self.roster = Roster(self.num_workers, s.max_worker_restarts)
        self.recovery = Recovery(self)
        self.continuity = Continuity(self)
        self.schedule = Schedule(self, self._meter)
        self.ready = False  # failures are recovered only once the collector is up
        self._batches: BatchPlane | None = None
        self._resources = Resources()
        self.workers = self._resources.workers = make_pool(weak_method(self._on_death), weak_method(self._on_arrival))
        self.waits = Waits(self.events, self.roster, self.workers, self.rpc_timeout, self.require_running,
                           self.recovery.recover)
        self.gather, self.deferred = self.waits.gather, self.waits.deferred
        self.pusher = WeightPusher(
            policy, self.workers, self.roster, self.deferred, self.gather, transport=s.weight_transport,
            factory=s.policy_factory, no_push=self._no_push, policy_device=s.policy_device, backend=self.backend,
            elastic=self.elastic, rpc_timeout=self.rpc_timeout, refill=self.roster.budget > 0 or self.elastic,
            resources=self._resources, meter=self._meter,
        )
        self._release = release_with(self, self._resources)
        self._closed = self._closing = False
        try:
            if not self.elastic:  # elastic collectors are set up as they join (Recovery.admit)
                create = {i: functools.partial(self.workers.create, i, self.specs[i]) for i in range(self.num_workers)}
                for i, info in enumerate(self.gather(create)):
                    self.roster.served(i, info)
            self.pusher.open()
            infos = self.infos
            local = [not self.workers.in_process and info is not None and info["host_id"] == host_id() for info in infos]
            self._resources.threads = TrainerThreads(s.num_threads, sum(local))
            rdv, pipelined = self.workers.rdv, not self.sync and not self.update_after_each_batch  # rdv: where hosts send batches
            self._batches = self._resources.batches = BatchPlane(  # elastic: a buffer per member, who may be anywhere
                local, weak_method(self._join_batches), sync=self.sync and not self.elastic, keep_fds=self.roster.budget > 0,
                device=s.storing_device, address=rdv.address() if rdv is not None else None, timeout=self.rpc_timeout,
                pipelined=pipelined,
                pipelined_here=pipelined and self.max_policy_lag is None and self.max_weight_update_interval < 0,
            )
            self.ready = True
        except BaseException:
            self.shutdown()
            raise

    def _join_batches(self, worker_id: int, spec: Any) -> bool:
        """Ask a worker to map a shared batch buffer; False if it cannot (a failure shows at its next request)."""
        recover = not self.roster.budget and not self.elastic  # without restarts a failure raises its WorkerError here
        try:
            return self.gather({worker_id: self.deferred.join_batches(worker_id, spec)}, recover=recover)[0]
        except Failure:
            return False

    def rejoin_batches(self, worker_id: int) -> None:
        """Give the process now serving ``worker_id`` its batch slots: a replacement maps its
        predecessor's, an elastic newcomer gets its own with its first batch."""
        if self._batches is None:
            return
        if self.elastic:
            self._batches.admit(worker_id, self.roster[worker_id].info["host_id"] == host_id())
        else:
            self.data_plane_call(self._batches.rejoin, worker_id)

    # ---------------------------------------------------------------- workers
    @property
    def infos(self) -> list[dict | None]:
        """What each worker's process reported of itself (rank, host, address, pid, ...); None: vacant."""
        return [record.info for record in self.roster]

    @property
    def worker_restarts(self) -> list[int]:
        """How many times each worker was replaced (``max_worker_restarts``), or how many
        collectors left each slot (``elastic``); with node collectors, plus the local workers each node replaced."""
        return self.roster.worker_restarts

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """TorchRL's: the frames of worker ``worker_idx``'s batches (None: the most any worker's hold)."""
        frames = self._frames_per_batch_worker
        return max(frames) if worker_idx is None else frames[worker_idx]

    def _on_death(self, worker_id: int, reason: str) -> None:
        """A pool saw worker ``worker_id`` die (from its own thread)."""
        self.roster.died(worker_id, reason)
        self.events.wake()

    def _on_arrival(self, rank: int) -> None:
        """A collector joined (elastic; from an RPC thread): the collecting thread admits it."""
        self.events.put(Joined(rank))

    def admitted(self, worker_id: int) -> None:
        """A collector took ``worker_id``'s slot (:meth:`.Schedule.admitted`)."""
        self.schedule.admitted(worker_id)

    def left(self, worker_id: int) -> None:
        """The collector in ``worker_id``'s slot left (elastic)."""
        self.schedule.left(worker_id)

    def worker_error(self, worker_id: int, reason: str, remote: str = "") -> WorkerError:
        info = self.roster[worker_id].info or self.workers.identity(worker_id)
        return WorkerError.from_info(worker_id, info, reason, remote)

    def fail(self, error: BaseException) -> BaseException:
        """Shut every worker down, then hand back ``error`` for the caller to raise."""
        if self._closing:  # the workers failed because shutdown() stopped them
            return RuntimeError(f"{type(self).__name__} was shut down")
        if isinstance(error, WorkerError):  # a hung worker would hold up the shutdown
            self.workers.kill(error.worker_id)
        self.shutdown()
        return error

    def data_plane_call(self, method: Any, *args: Any) -> Any:
        """Call a data-plane method; no room for a shared-memory buffer ends the run."""
        try:
            return method(*args)
        except OSError as err:
            raise self.fail(err) from None

    # ---------------------------------------------------------------- waits
    def require_running(self) -> None:
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} was shut down")

    # ---------------------------------------------------------------- collection
    def _collect_batch(self) -> TensorDictBase:
        batch = self.schedule.collect()
        if self.tracing.rounds_left:  # a trace window is open
            self.tracing.handed_out()
        return batch

    def trace(self, path: Any, rounds: int = 1, max_spans: int = MAX_SPANS) -> None:
        """Write the timeline of the next ``rounds`` batches, at most ``max_spans`` spans per thread,
        to ``path`` once they are handed out, as a Chrome trace file (:mod:`.trace_window`)."""
        self.require_running()
        self.tracing.start(path, rounds, max_spans)

    def _place(self, batch: TensorDictBase) -> TensorDictBase:
        return self._batches.to_storing_device(batch)

    def _extend(self, batch: TensorDictBase) -> None:
        buffer_writes.write(self.replay_buffer, batch, stacked=self.sync and self.cat_results == "stack",
                            extend_buffer=self.extend_buffer, split_trajs=self.split_trajs, worker_ids=self._worker_ids)

    def __len__(self) -> int:
        if self.preempt_after is not None:  # rounds cut short hold fewer frames: more of them come
            raise preemption.no_length(self.preemptive_threshold)
        return super().__len__()

    # ---------------------------------------------------------------- weights (:class:`.WeightPusher`)
    @property
    def weights(self) -> WeightPlane | None:
        """The weight plane (None until it is laid out, and without pushes)."""
        return self.pusher.plane

    @property
    def pushed_version(self) -> int:
        """The newest weights' version (``policy_version``: the one every worker acknowledged)."""
        return self.pusher.version

    @property
    def policy_version(self) -> int | None:
        """TorchRL's acknowledged version: the weights version every serving worker acknowledged
        (a vacant slot of an elastic collector does not count); None while they differ (after a
        push to some of them) or a push is in flight (``non_blocking``). The version that chose
        each frame is its ``("collector", "policy_version")``."""
        return self.pusher.acknowledged()

    def worker_policy_versions(self) -> list[int | None]:
        """TorchRL's: each worker's acknowledged weights version (0 before a push; None: in flight, or no worker)."""
        return self.pusher.worker_versions()

    def _newest_version(self) -> int:
        return self.pusher.version

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """The weight plane is set up by the constructor; nothing is left to prepare (arguments ignored)."""

    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, non_blocking: bool = False,
        weights: Any = None, policy: Any = None,
    ) -> None:
        """Push new weights to all workers (one broadcast) or to ``worker_ids`` (0-based ids, or
        TorchRL's form: the ``torch.device`` the workers' policy runs on).

        ``policy_or_weights`` (or TorchRL's ``weights=``/``policy=``): an ``nn.Module``, a
        TensorDict of weights or a state dict, or TorchRL's per-worker form ``{worker_id: weights}``
        (each of those workers gets its own; without ``worker_ids``); None pushes the tensors the policy given to the
        constructor holds at this call (also after its parameters were replaced), or, when the
        workers build their policies (``policy_factory``), the weights given last. The trainer's
        version (``pushed_version``) goes up by one; each worker applies the weights before its next batch,
        never in the middle of one. With ``non_blocking=True`` this returns once the weights
        are copied out of the policy, and the transfer completes in the background.
        """
        policy_or_weights = one_source(policy_or_weights, weights, policy)
        self.require_running()
        self.pusher.update(policy_or_weights, worker_ids, non_blocking)

    def push_version(self, version: int, source: TensorDictBase | None = None) -> None:
        """Push the policy's weights (or ``source``) to every worker as ``version`` (a node passing on its trainer's)."""
        self.require_running()
        self.pusher.push_version(version, source)

    def metrics(self) -> Metrics:
        """``BaseCollector.metrics`` with each worker's phases, restarts, joins and leaves (:mod:`.front_metrics`)."""
        return front_metrics.of(self)

    def worker_phases(self) -> tuple[WorkerPhases, ...]:
        """Each worker process's frames, batches and time in each phase (one call to each)."""
        return front_metrics.phases_of(self)

    @property
    def dropped_frames(self) -> int:
        """Frames collected and not handed out (:mod:`.continuity`)."""
        return self.continuity.dropped_frames

    @property
    def dropped_batches(self) -> int:
        """Batches collected and not handed out (:mod:`.continuity`)."""
        return self.continuity.dropped_batches

    # ---------------------------------------------------------------- TorchRL's views (:mod:`.torchrl_views`)
    def get_distant_attr(self, attr: str) -> list:
        """TorchRL's: each worker's collector's attribute at the dotted path ``attr``, in worker order
        (``"worker_idx"``: the worker ids; ``"replay_buffer..."``: the trainer's buffer, which the workers share)."""
        self.require_running()
        if torchrl_views.in_trainer(attr, self.replay_buffer):
            return [remote_calls.attribute(self, attr) for _ in self.roster.serving()]
        return self.gather({i: self.deferred.get_distant_attr(i, attr) for i in self.roster.serving()})

    def map_fn(self, method_name: str, list_of_args: list | None = None, list_of_kwargs: list | None = None) -> list:
        """TorchRL's: each worker's collector's ``method_name`` (a dotted path) called with its entry of
        ``list_of_args``/``list_of_kwargs`` (one per worker; None: no arguments); the results in worker order."""
        args, kwargs = remote_calls.entries(list_of_args, list_of_kwargs, self.num_workers)
        self.require_running()
        if torchrl_views.in_trainer(method_name, self.replay_buffer):
            return [remote_calls.attribute(self, method_name)(*args[i], **kwargs[i]) for i in self.roster.serving()]
        return self.gather({i: self.deferred.map_fn(i, method_name, args[i], kwargs[i]) for i in self.roster.serving()})

    def fake_tensordict(self) -> Any:
        """Not implemented, as in TorchRL: each worker's batch has its own layout (``Collector`` has it)."""
        raise NotImplementedError(f"{type(self).__name__}.fake_tensordict is not implemented, as in TorchRL; "
                                  "accepted: Collector(...).fake_tensordict() with one of the workers' envs")

    @property
    def interruptor(self) -> None:
        """TorchRL's flag that stops a sync round's other workers: None (preemption stops them by a call)."""
        return None

    def _start_profile(self, config: Any) -> None:
        raise ValueError(f"enable_profile(workers={config.workers!r}) on {type(self).__name__}: profiling inside "
                         "worker processes is not supported; accepted: enable_profile on a single-process Collector")

    @property
    def pre_collect_hook(self) -> Any:
        """Called in each worker before each batch; setting it sets it in every worker (as TorchRL's setter)."""
        return (self._hooks or {}).get("pre_collect_hook")

    @pre_collect_hook.setter
    def pre_collect_hook(self, hook: Any) -> None:
        self._set_hook("pre_collect_hook", hook)

    @property
    def post_collect_hook(self) -> Any:
        """Called in each worker with each of its batches; setting it sets it in every worker."""
        return (self._hooks or {}).get("post_collect_hook")

    @post_collect_hook.setter
    def post_collect_hook(self, hook: Any) -> None:
        self._set_hook("post_collect_hook", hook)

    def _set_hook(self, name: str, hook: Any) -> None:
        hook = checks.optional_callable(name, hook)
        self._hooks = {**(self._hooks or {}), name: hook}
        if getattr(self, "specs", None) is None:  # the constructor: the workers get it with their options
            return
        self.require_running()
        self.specs[:], pickled = torchrl_views.with_hook(self.specs, name, hook)
        self.gather({i: self.deferred.set_hook(i, name, pickled) for i in self.roster.serving()})

    @property
    def _weight_sync_schemes(self) -> dict:
        """``{"policy": scheme}``: TorchRL's scheme for how weights travel here (:func:`.torchrl_views.weight_schemes`)."""
        return torchrl_views.weight_schemes(self._schemes_given, self._no_push, self.pusher.plane, self.pusher.transport,
                                            self._ray_actors)

    def stats(self, workers: str = "aggregate") -> dict[str, int | bool]:
        """TorchRL's progress snapshot (see :meth:`BaseCollector.stats
        <rpc_collectors.single_process.base_collector.BaseCollector.stats>`), with ``"workers"`` and
        ``"workers_alive"``. ``workers="per_worker"`` or ``"both"`` adds ``"worker_<i>/frames"``
        and ``"worker_<i>/batches"``: what each worker delivered to this collector (counted
        here, without a call to the workers); ``"per_worker"`` leaves the aggregate entries out."""
        torchrl_views.check_workers_view(workers)
        alive = 0 if self._closing else sum(record.serving and record.dead is None for record in self.roster)
        stats = super().stats() if workers != "per_worker" else {}
        return torchrl_views.worker_stats(stats, workers, alive, self._worker_totals, self.num_workers)

    # ---------------------------------------------------------------- state
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker's env and torch RNG with distinct seeds; returns the next free seed."""
        self.require_running()
        seed = checks.seed(seed)
        if self.elastic:  # slot i gets seed + i; each collector in it one drawn from that seed's sequence
            for worker_id in range(self.num_workers):
                self.roster.seeds[worker_id] = seed + worker_id
            self.gather({i: self.deferred.set_seed(i, self.roster.seed(i)) for i in self.roster.serving()})
            return seed + self.num_workers
        for worker_id in range(self.num_workers):
            self.roster.seeds[worker_id] = int(seed)
            seed = self.gather({worker_id: self.deferred.set_seed(worker_id, int(seed))})[0]
        return seed

    def state_dict(self) -> dict:
        """Frames, iteration, weights version, the trainer's policy weights and every worker's collector
        state (``"workers"``, a list; also under TorchRL's ``"worker0"``, ``"worker1"``, ... keys)."""
        return saved_state.state_of(self)

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``: the trainer's policy and the workers get the saved weights, the
        workers' envs restart, trajectory ids keep increasing."""
        saved_state.load(self, state)

    # ---------------------------------------------------------------- shutdown
    def _shutdown(self, close_env: bool) -> None:
        self.events.wake()  # a wait in another thread sees the shutdown
        here = host_id()
        local_workers = [pid for info in self.infos if info is not None and info.get("host_id") == here
                         for pid in info.get("local_pids", ())]  # of nodes on this host
        self._resources.close()
        wait_gone(local_workers, KILL_WAIT)
        self._release.detach()
