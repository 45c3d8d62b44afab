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
from rpc_collectors.single_process import preemption
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.single_process.frame_ledger import Ledger
from rpc_collectors.trainer import buffer_writes, front_metrics, legacy_updater, worker_views
from rpc_collectors.trainer.batch_slots import BatchSlots
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.lifetime import Resources, release_with, wait_gone
from rpc_collectors.trainer.plan import Plan
from rpc_collectors.trainer.recovery import Recovery
from rpc_collectors.trainer.roster import Roster
from rpc_collectors.trainer.saved_state import SavedState
from rpc_collectors.trainer.schedule import Schedule
from rpc_collectors.trainer.threads import TrainerThreads
from rpc_collectors.trainer.trace_window import MAX_SPANS, TraceParts, TraceWindow
from rpc_collectors.trainer.waits import Events, Joined, Waits
from rpc_collectors.trainer.weight_pushes import WeightPusher
from rpc_collectors.trainer.worker_views import Planned
from rpc_collectors.transport.rendezvous import host_id
from rpc_collectors.transport.weight_sync import WeightPlane
from rpc_collectors.transport.weights import one_source


class CollectorFront(BaseCollector):
    """A multi-worker collector over a worker pool; public classes choose the pool and layout.

    Its options are read from its :class:`~rpc_collectors.trainer.plan.Plan` (``plan``); TorchRL's
    views of its workers are the functions of :mod:`.worker_views`, named here.
    """

    _default_cat_results: str | int = 0
    # the collect hooks run in the workers
    _runs_post_hook = False
    # every worker runs one of our collectors
    _sources_drop_private_keys = True
    # RayCollector: the "rpc" transport is one ray.put (TorchRL's RayWeightSyncScheme)
    _ray_actors = False
    # the workers' collect hooks, as given to the constructor or set since
    _hooks: dict | None = None
    plan: Plan | None = None
    # TorchRL's legacy WeightUpdaterBase, which pushes through self.pipes (:mod:`.legacy_updater`)
    weight_updater: Any = None
    _legacy_weight_updater = property(lambda front: front.weight_updater is not None)
    # TorchRL's attributes, read from the plan
    num_workers, sync, cat_results, frames_per_batch = Planned(), Planned(), Planned(), Planned()
    launcher, elastic, rpc_timeout, exploration_type = Planned(), Planned(), Planned(), Planned()
    max_policy_lag, preemptive_threshold = Planned(), Planned()
    # TorchRL's views of the workers (:mod:`.worker_views`)
    get_distant_attr = worker_views.get_distant_attr
    map_fn = worker_views.map_fn
    stats = worker_views.stats
    fake_tensordict, _start_profile = worker_views.fake_tensordict, worker_views.start_profile
    _weight_sync_schemes = property(worker_views.weight_sync_schemes)
    pre_collect_hook = worker_views.hook(
        "pre_collect_hook", "Called in each worker before each batch; setting it sets it in every "
        "worker (as TorchRL's setter).")
    post_collect_hook = worker_views.hook(
        "post_collect_hook", "Called in each worker with each of its batches; setting it sets it "
        "in every worker.")

    @property
    def interruptor(self) -> None:
        """TorchRL's flag that stops a sync round's other workers: None (preemption stops them by
        a call)."""
        return None

    def _open(self, plan: Plan, policy: Any, make_pool: Callable[..., Any]) -> None:
        """Start the workers (``make_pool(on_death, on_arrival)``), build their collectors and
        planes."""
        # until the workers are up
        self._closed = self._closing = True
        self.plan, self.policy = plan, policy
        # read with every batch (BaseCollector), so an attribute of its own: the plan's, which is
        # frozen
        self.track_policy_version = plan.track_policy_version
        collect = plan.options.collect
        self._use_buffers = collect.use_buffers
        self._hooks = {"pre_collect_hook": collect.pre_collect_hook,
                       "post_collect_hook": collect.post_collect_hook}
        self.events = self._meter.waits = Events()
        self.roster = roster = Roster(plan.num_workers, plan.max_worker_restarts)
        self._resources = Resources()
        self.workers = self._resources.workers = make_pool(
            _on_death(roster, self.events), _on_arrival(self.events))
        self.waits = Waits(self.events, roster, self.workers, plan.rpc_timeout,
                           self.require_running, self._recover)
        self.slots = BatchSlots(roster, self.waits, plan.elastic, self.fail)
        self.pusher = WeightPusher(
            policy, self.workers, roster, self.waits.deferred, self.waits.gather,
            transport=plan.weight_transport, factory=plan.policy_factory, no_push=plan.no_push,
            policy_device=plan.policy_device, backend=plan.backend, elastic=plan.elastic,
            rpc_timeout=plan.rpc_timeout, refill=roster.budget > 0 or plan.elastic,
            resources=self._resources, meter=self._meter,
        )
        self.continuity = Continuity(roster, self.waits, plan.max_policy_lag)
        self.ledger = Ledger(plan.num_workers)
        self.recovery = Recovery(
            plan, roster, self.workers, self.waits, self.pusher, self.slots, self.ledger,
            fail=self.fail,
            admitted=self._admitted, left=self._left, delivered_frames=self._delivered_frames,
        )
        self.schedule = Schedule(plan, roster, self.events, self.waits, self.workers, self.pusher,
                                 self.slots, self.continuity, self.recovery, self.ledger, self.fail,
                                 self._meter)
        self.saved = SavedState(plan, policy, roster, self.waits, self.pusher, self.continuity,
                                self._delivered_frames)
        self.tracing = TraceWindow(
            TraceParts(roster, self.waits.deferred, self.waits.gather, self.workers), self._meter)
        self._release = release_with(self, self._resources)
        legacy_updater.register(self, plan.options.weights.weight_updater)
        self._closed = self._closing = False
        try:
            self._start_workers()
            self.recovery.ready = True
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self) -> None:
        """Build every worker's collector, lay out the weight plane, the trainer's threads and the
        batch plane."""
        plan, roster = self.plan, self.roster
        if not plan.elastic:
            # elastic collectors are set up as they join (Recovery.admit)
            create = {i: functools.partial(self.workers.create, i, plan.specs[i])
                      for i in range(plan.num_workers)}
            for i, info in enumerate(self.waits.gather(create)):
                roster.served(i, info)
        self.pusher.open()
        here = host_id()
        local = [not self.workers.in_process and info is not None and info["host_id"] == here
                 for info in self.infos]
        self._resources.threads = TrainerThreads(plan.num_threads, sum(local))
        # rdv: where hosts send batches
        rdv, pipelined = self.workers.rdv, not plan.sync and not plan.update_after_each_batch
        # an admitted async node: a request in flight per local worker (worker.node_credits)
        depth = plan.node.num_workers if plan.node is not None and plan.node.credits else None
        # elastic: a buffer per member, who may be anywhere
        self.slots.open(
            local, self._resources, sync=plan.sync and not plan.elastic, keep_fds=roster.budget > 0,
            device=plan.storing_device, address=rdv.address() if rdv is not None else None,
            timeout=plan.rpc_timeout, pipelined=pipelined,
            pipelined_here=(pipelined and plan.max_policy_lag is None
                            and plan.max_weight_update_interval < 0), depth=depth,
        )

    # ---------------------------------------------------------------- workers
    @property
    def infos(self) -> list[dict | None]:
        """What each worker's process reported of itself (rank, host, address, pid, ...); None:
        vacant."""
        return [record.info for record in self.roster]

    @property
    def worker_restarts(self) -> list[int]:
        """How many times each worker was replaced (``max_worker_restarts``), or how many
        collectors left each slot (``elastic``); with node collectors, plus the local workers each
        node replaced."""
        return self.roster.worker_restarts

    def frames_per_batch_worker(self, *, worker_idx: int | None = None) -> int:
        """TorchRL's: the frames of worker ``worker_idx``'s batches (None: the most any worker's
        hold)."""
        frames = self.plan.frames_per_batch_worker
        return max(frames) if worker_idx is None else frames[worker_idx]

    def _recover(self, failed: Failure) -> bool:
        """A wait saw a worker fail (:meth:`.Recovery.recover`)."""
        return self.recovery.recover(failed)

    def _admitted(self, worker_id: int) -> None:
        """A collector took ``worker_id``'s slot (:meth:`.Schedule.admitted`)."""
        self.schedule.admitted(worker_id)

    def _left(self, worker_id: int) -> None:
        """The collector in ``worker_id``'s slot left (elastic)."""
        self.schedule.left(worker_id)

    def fail(self, error: BaseException) -> BaseException:
        """Shut every worker down, then hand back ``error`` for the caller to raise."""
        # the workers failed because shutdown() stopped them
        if self._closing:
            return RuntimeError(f"{type(self).__name__} was shut down")
        # a hung worker would hold up the shutdown
        if isinstance(error, WorkerError):
            self.workers.kill(error.worker_id)
        self.shutdown()
        return error

    def require_running(self) -> None:
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} was shut down")

    # ---------------------------------------------------------------- collection
    def _collect_batch(self) -> TensorDictBase:
        batch = self.schedule.collect()
        # a trace window is open
        if self.tracing.rounds_left:
            self.tracing.handed_out()
        return batch

    def trace(self, path: Any, rounds: int = 1, max_spans: int = MAX_SPANS) -> None:
        """Write the timeline of the next ``rounds`` batches, at most ``max_spans`` spans per
        thread, to ``path`` once they are handed out, as a Chrome trace file
        (:mod:`.trace_window`)."""
        self.require_running()
        self.tracing.start(path, rounds, max_spans)

    def _place(self, batch: TensorDictBase) -> TensorDictBase:
        return self.slots.plane.to_storing_device(batch)

    def _extend(self, batch: TensorDictBase) -> None:
        stacked = self.plan.sync and self.plan.cat_results == "stack"
        buffer_writes.write(self.replay_buffer, batch, stacked=stacked,
                            extend_buffer=self.extend_buffer, split_trajs=self.split_trajs,
                            worker_ids=self._worker_ids)

    def __len__(self) -> int:
        if self.plan.preempt_after is not None:
            # rounds cut short hold fewer frames: more of them come
            raise preemption.no_length(self.preemptive_threshold)
        return super().__len__()

    # ------------------------------------------------------- weights (:class:`.WeightPusher`)
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
        """TorchRL's: each worker's acknowledged weights version (0 before a push; None: in flight,
        or no worker)."""
        return self.pusher.worker_versions()

    def _newest_version(self) -> int:
        return self.pusher.version

    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """The weight plane is set up by the constructor; nothing is left to prepare (arguments
        ignored)."""

    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, non_blocking: bool = False,
        weights: Any = None, policy: Any = None,
    ) -> None:
        """Push new weights to all workers (one broadcast) or to ``worker_ids`` (0-based ids, or
        TorchRL's form: the ``torch.device`` the workers' policy runs on).

        ``policy_or_weights`` (or TorchRL's ``weights=``/``policy=``): an ``nn.Module``, a
        TensorDict of weights or a state dict, or TorchRL's per-worker form ``{worker_id: weights}``
        (each of those workers gets its own; without ``worker_ids``); None pushes the tensors the
        policy given to the constructor holds at this call (also after its parameters were
        replaced), or, when the workers build their policies (``policy_factory``), the weights given
        last. Given a ``weight_updater`` (TorchRL's legacy ``WeightUpdaterBase``), it is called
        instead and pushes through ``pipes``. The trainer's version (``pushed_version``) goes up by
        one; each worker applies the weights before its next batch, never in the middle of one.
        With ``non_blocking=True`` this returns once the weights are copied out of the policy, and
        the transfer completes in the background."""
        policy_or_weights = one_source(policy_or_weights, weights, policy)
        self.require_running()
        if self.weight_updater is not None:
            self.weight_updater(policy_or_weights=policy_or_weights, worker_ids=worker_ids)
            return
        self.pusher.update(policy_or_weights, worker_ids, non_blocking)

    def push_version(self, version: int, source: TensorDictBase | None = None) -> None:
        """Push the policy's weights (or ``source``) to every worker as ``version`` (a node passing
        on its trainer's)."""
        self.require_running()
        self.pusher.push_version(version, source)

    def metrics(self) -> Metrics:
        """``BaseCollector.metrics`` with each worker's phases, restarts, joins and leaves
        (:mod:`.front_metrics`)."""
        return front_metrics.of(self._meter, self.frames, self.roster, self.waits, self.continuity,
                                self.workers, self.ledger, self._closing)

    def _serving_steps(self) -> int:
        phases = None if self._closing else front_metrics.phases_by_worker(self.roster, self.waits)
        return front_metrics.serving_steps(self.workers, self.roster, self.ledger, phases)

    def worker_phases(self) -> tuple[WorkerPhases, ...]:
        """Each worker process's frames, batches and time in each phase (one call to each)."""
        return front_metrics.phases_of(self.roster, self.waits)

    @property
    def dropped_frames(self) -> int:
        """Frames collected and not handed out (:mod:`.continuity`)."""
        return self.continuity.dropped_frames

    @property
    def dropped_batches(self) -> int:
        """Batches collected and not handed out (:mod:`.continuity`)."""
        return self.continuity.dropped_batches

    # ---------------------------------------------------------------- state
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker's env and torch RNG with distinct seeds; returns the next free seed."""
        self.require_running()
        seed = checks.seed(seed)
        roster, gather, deferred = self.roster, self.waits.gather, self.waits.deferred
        num_workers = self.plan.num_workers
        if self.plan.elastic:
            # slot i gets seed + i; each collector in it one drawn from that seed's sequence
            for worker_id in range(num_workers):
                roster.seeds[worker_id] = seed + worker_id
            gather({i: deferred.set_seed(i, roster.seed(i)) for i in roster.serving()})
            return seed + num_workers
        for worker_id in range(num_workers):
            roster.seeds[worker_id] = int(seed)
            seed = gather({worker_id: deferred.set_seed(worker_id, int(seed))})[0]
        return seed

    def state_dict(self) -> dict:
        """Frames, iteration, weights version, the trainer's policy weights and every worker's
        collector state (``"workers"``, a list; also under TorchRL's ``"worker0"``, ``"worker1"``,
        ... keys)."""
        return self.saved.state(self._base_state(), self.run_start)

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``: the trainer's policy and the workers get the saved weights,
        the workers' envs restart, trajectory ids keep increasing."""
        self.saved.check(state)
        self._load_base_state(state)
        self.saved.load(state)

    # ---------------------------------------------------------------- shutdown
    def _shutdown(self, close_env: bool) -> None:
        # a wait in another thread sees the shutdown
        self.events.wake()
        here = host_id()
        # the local workers of nodes on this host
        local_workers = [pid for info in self.infos
                         if info is not None and info.get("host_id") == here
                         for pid in info.get("local_pids", ())]
        self._resources.close()
        wait_gone(local_workers, KILL_WAIT)
        self._release.detach()


def _on_death(roster: Roster, events: Events) -> Callable[[int, str], None]:
    """What a pool calls (from its own thread) when it sees a worker die."""
    def died(worker_id: int, reason: str) -> None:
        roster.died(worker_id, reason)
        events.wake()
    return died


def _on_arrival(events: Events) -> Callable[[int], None]:
    """What a pool calls (elastic; from an RPC thread) when a collector joined: the collecting
    thread admits it."""
    def joined(rank: int) -> None:
        events.put(Joined(rank))
    return joined
