"""The collector front: what a multi-worker collector means, written once for every pool.

Sync rounds (one batch from every worker, combined in the class's layout), async first-come
batches with each worker's request depth, the weight-update cadence
(``update_after_each_batch``, ``max_weight_update_interval``), seeding and state. How the
workers exist is the pool's business (:mod:`rpc_collectors.pools`); batches arrive through the
data plane (:mod:`rpc_collectors.planes.data`), weights leave through the weight plane
(:class:`~rpc_collectors.planes.weight_sync.WeightPlane`). Every wait goes through one
:class:`~rpc_collectors.front.events.Events` and is bounded by ``rpc_timeout``; a failed worker
raises :class:`~rpc_collectors.core.errors.Failure` out of the wait, and the front hands it to its
:class:`~rpc_collectors.front.recovery.Recovery` before asking again.
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import torch
from tensordict import TensorDictBase

from rpc_collectors.collection import preemption
from rpc_collectors.collection.base import BaseCollector
from rpc_collectors.core import checks
from rpc_collectors.core.errors import Failure, WorkerError
from rpc_collectors.front import buffer_writes, node_restarts, policy_lag, saved_state
from rpc_collectors.front.continuity import Continuity
from rpc_collectors.front.events import BATCH, Answer, Events, Joined
from rpc_collectors.front.lifetime import Resources, release_with, wait_gone, weak_method
from rpc_collectors.front.recovery import Recovery
from rpc_collectors.front.roster import WorkerRecord
from rpc_collectors.front.settings import Settings
from rpc_collectors.front.threads import TrainerThreads
from rpc_collectors.front.torchrl_views import TorchRLViews
from rpc_collectors.front.waits import Call, Waits
from rpc_collectors.front.weight_pushes import WeightPushes
from rpc_collectors.planes import layouts
from rpc_collectors.planes.data import BatchPlane
from rpc_collectors.planes.membership import Restarts
from rpc_collectors.planes.rendezvous import host_id
from rpc_collectors.planes.weight_sync import WeightPlane
from rpc_collectors.worker.spawner import KILL_WAIT


class CollectorFront(TorchRLViews, WeightPushes, BaseCollector):
    """A multi-worker collector over a worker pool; public classes choose the pool and layout."""

    _default_cat_results: str | int = 0
    _no_push = False  # TorchRL's NoWeightSyncScheme: no weight plane, update_policy_weights_ does nothing
    _sources_drop_private_keys = True  # every worker runs one of our collectors
    max_policy_lag: int | None = None  # async: drop batches further behind (:mod:`.policy_lag`)
    dropped_frames = dropped_batches = 0
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
        self._transport, self._factory = s.weight_transport, s.policy_factory
        self._given: Any = None  # policy_factory: the weights pushed last, which a push without weights sends
        self.frames_per_batch, self.worker_frames = s.frames_per_batch, s.worker_frames
        if s.preemptive_threshold is None and (self.sync or self.frames_per_batch == self.worker_frames):
            checks.total_frames_fits(self.total_frames, self.frames_per_batch)  # not when batch sizes vary
        self._policy_device = s.policy_device
        self.specs = s.specs
        self.policy = policy
        self.pushed_version = 0  # the newest weights' version (policy_version: the one every worker acknowledged)
        self.events = Events()
        self.roster = [WorkerRecord() for _ in range(self.num_workers)]
        self.restarts = Restarts(s.max_worker_restarts, self.num_workers)
        self.recovery = Recovery(self)
        self.continuity = Continuity(self)
        self.ready = False  # failures are recovered only once the collector is up
        self.weights: WeightPlane | None = None
        self._batches: BatchPlane | None = None
        self._layout: dict | None = None  # elastic: keys, shapes and dtypes of the run's first batch
        self._last_async: int | None = None
        self._round: dict[int, Any] | None = None  # the answers of a sync round in progress
        self._push: dict[int, Call] = {}  # the weight push in progress: its calls and their futures
        self._pushed: dict[int, torch.futures.Future] = {}
        self._lock = threading.RLock()
        self._resources = Resources()
        self.workers = self._resources.workers = make_pool(weak_method(self._on_death), weak_method(self._on_arrival))
        self.waits = Waits(self.events, self.roster, self.workers, self.rpc_timeout, self.require_running,
                           self.recovery.recover)
        self.gather, self.deferred = self.waits.gather, self.waits.deferred
        self._release = release_with(self, self._resources)
        self._closed = self._closing = False
        try:
            if not self.elastic:  # elastic collectors are set up as they join (Recovery.admit)
                create = {i: functools.partial(self.workers.create, i, self.specs[i]) for i in range(self.num_workers)}
                for i, info in enumerate(self.gather(create)):
                    self.roster[i].served(info)
                    self.restarts.started(i, info["envs"])
            self._init_weights(s.weight_transport)
            infos = self.infos
            local = [not self.workers.in_process and info is not None and info["host_id"] == host_id() for info in infos]
            self._resources.threads = TrainerThreads(s.num_threads, sum(local))
            rdv = self.workers.rdv  # other hosts send their batches to its address
            address = rdv.address() if rdv is not None else None
            self._batches = self._resources.batches = BatchPlane(  # elastic: a buffer per member, who may be anywhere
                local, weak_method(self._join_batches), sync=self.sync and not self.elastic, keep_fds=self.restarts.budget > 0,
                device=s.storing_device, address=address, timeout=self.rpc_timeout,
                pipelined=not self.sync and not self.update_after_each_batch,
            )
            self.ready = True
        except BaseException:
            self.shutdown()
            raise

    def _join_batches(self, worker_id: int, spec: Any) -> bool:
        """Ask a worker to map a shared batch buffer; False if it cannot (a failure shows at its next request)."""
        recover = not self.restarts.budget and not self.elastic  # without restarts a failure raises its WorkerError here
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
            self.shared(self._batches.rejoin, worker_id)

    # ---------------------------------------------------------------- workers
    @property
    def infos(self) -> list[dict | None]:
        """What each worker's process reported of itself (rank, host, address, pid, ...); None: vacant."""
        return [record.info for record in self.roster]

    @property
    def worker_restarts(self) -> list[int]:
        """How many times each worker was replaced (``max_worker_restarts``), or how many
        collectors left each slot (``elastic``); with node collectors, plus the local workers each node replaced."""
        return [count + record.local_restarts for count, record in zip(self.restarts.counts, self.roster)]

    def _on_death(self, worker_id: int, reason: str) -> None:
        """A pool saw worker ``worker_id`` die (from its own thread)."""
        self.roster[worker_id].died(reason)
        self.events.wake()

    def _on_arrival(self, rank: int) -> None:
        """A collector joined (elastic; from an RPC thread): the collecting thread admits it."""
        self.events.put(Joined(rank))

    def admitted(self, worker_id: int) -> None:
        """A collector took ``worker_id``'s slot: a sync round that waits for the slot asks it at once."""
        if self._round is not None and worker_id not in self._round:
            self._request(worker_id, again=True)
        elif self._round is None and not self.sync:
            self._request(worker_id)

    def left(self, worker_id: int) -> None:
        """The collector in ``worker_id``'s slot left (elastic)."""
        if self._last_async == worker_id:
            self._last_async = None

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

    def shared(self, method: Any, *args: Any) -> Any:
        """Call a data-plane method; no room for a shared-memory buffer ends the run."""
        try:
            return method(*args)
        except OSError as err:
            raise self.fail(err) from None

    # ---------------------------------------------------------------- waits
    def require_running(self) -> None:
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} was shut down")

    def _deadline(self) -> float:
        """Until when to wait for the next batch: each outstanding request's answer within rpc_timeout
        of when its worker began on it (async too: one worker's answers never cover another's silence);
        with none outstanding (elastic, vacant slots), a collector within join_timeout."""
        oldest = self.waits.batch_deadline()
        if oldest is not None:
            return oldest[0]
        return self.waits.deadline() if not self.elastic else time.monotonic() + self.join_timeout

    def _next_batch(self) -> tuple[int, Any]:
        """The next worker's batch answer (worker id, batch or ``Ready``); collectors that join
        meanwhile (elastic) are admitted. Deaths and timeouts raise :class:`Failure`."""
        deadline = self._deadline()
        while True:
            item = self.events.take(lambda e: isinstance(e, Joined) or (isinstance(e, Answer) and e.tag == BATCH),
                                    deadline, self.waits.check)
            if item is None:
                oldest = self.waits.batch_deadline()
                if oldest is None:
                    raise self.recovery.no_collector()
                raise self.waits.late(oldest[1])
            if isinstance(item, Joined):
                self.recovery.admit(item.rank)
                deadline = self._deadline()
                continue
            record = self.roster[item.worker_id]
            if item.generation != record.generation:
                continue  # the answer of a replaced worker
            result = self.waits.result(item.worker_id, item.fut)  # a failure leaves it asked: its replacement redoes it
            record.answered()
            result, dropped = node_restarts.heard(record, item.worker_id, result)  # a node's restarts and drops come with it
            self.continuity.count(dropped.frames, dropped.batches)
            if self.weights is not None:
                self.weights.delivered(item.worker_id)
            if self.elastic:
                self._same_layout(item.worker_id, result)
            return item.worker_id, result

    def _same_layout(self, worker_id: int, result: Any) -> None:
        """Elastic: a member whose batch does not match the run's first one (keys, shapes,
        dtypes) fails, so its slot falls vacant, instead of mixing layouts in the run."""
        if not isinstance(result, TensorDictBase):  # in its own slots, laid out from its first batch
            return
        signature = layouts.signature_of(result)
        if self._layout is None:
            self._layout = signature
        differs = layouts.difference(signature, self._layout) if signature and self._layout else ""
        if differs:
            raise Failure(worker_id, f"delivered a batch unlike the run's: {differs}")

    def _next_answer(self) -> tuple[int, Any]:
        """:meth:`_next_batch`, recovering failed workers; a replacement is asked what its
        predecessor left unanswered."""
        while True:
            try:
                return self._next_batch()
            except Failure as failed:
                self.recovery.recover(failed)
                for worker_id, record in enumerate(self.roster):
                    for _ in range(record.redo):
                        self._request(worker_id)

    # ---------------------------------------------------------------- collection
    def _request(self, worker_id: int, again: bool = False) -> None:
        """Ask ``worker_id`` for its next batch (``again``, or a request its predecessor left:
        into the same slot); a vacant elastic slot is asked once a collector takes it."""
        if not self.workers.serves(worker_id):
            return
        record = self.roster[worker_id]
        again = again or record.redo > 0
        weights = self.weights
        if not again and weights is not None and weights.needs_update(
                worker_id, self.update_after_each_batch, self.max_weight_update_interval):
            self._push_weights(list(range(self.num_workers)) if self.sync else [worker_id])
        min_version = weights.min_version[worker_id] if weights is not None else 0
        slot = self._batches.slot_for(worker_id, again)
        fut = self._batches.ring(worker_id, min_version, slot)  # a worker with slots
        if fut is None:
            fut = self.workers.calls.collect(worker_id, min_version, slot)
        record.asked(again)
        self.restarts.asked(worker_id, self.worker_frames, record.info["envs"])
        self.events.watch(worker_id, record.generation, BATCH, fut)

    def _receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch of a worker's answer, labelled with its worker id."""
        batch = self.shared(self._batches.receive, worker_id, result)
        batch.set(layouts.WORKER_ID, torch.full(batch.shape, worker_id, dtype=torch.int64))
        return batch

    def _collect_batch(self) -> TensorDictBase:
        if self.sync:
            for worker_id in range(self.num_workers):
                self._request(worker_id)
            self._round = results = {}
            try:
                while len(results) < self.num_workers:
                    if len(results) == self.preempt_after:
                        self._preempt([i for i in range(self.num_workers) if i not in results])
                    worker_id, result = self._next_answer()
                    results[worker_id] = result
            finally:
                self._round = None
            batch = self._combine([results[i] for i in range(self.num_workers)])
            return batch if self.preempt_after is None else self._without_padding(batch)
        if self._last_async is not None:
            self._request(self._last_async)  # after the trainer's step, with fresh weights if asked
        for worker_id in range(self.num_workers):
            if worker_id != self._last_async:
                for _ in range(self._batches.depth(worker_id) - self.roster[worker_id].outstanding):
                    self._request(worker_id)
        batch = self._next_kept()
        if not self.update_after_each_batch:
            self._request(self._last_async)  # keep the worker busy while the trainer works
            self._last_async = None
        return batch

    def _place(self, batch: TensorDictBase) -> TensorDictBase:
        return self._batches.place(batch)

    def _next_kept(self) -> TensorDictBase:
        """The next async batch not dropped (:mod:`.continuity`): one asked before its worker's stream
        was cut, or collected with weights more than ``max_policy_lag`` behind (:mod:`.policy_lag`)."""
        while True:
            self._last_async, result = self._next_answer()
            worker_id, batch = self._last_async, self._receive(self._last_async, result)
            if self.continuity.kept(worker_id, batch):
                if not policy_lag.too_old(batch, self.pushed_version, self.max_policy_lag):
                    return batch
                if policy_lag.left_behind(self.weights, worker_id, self.pushed_version, self.max_policy_lag):
                    self._push_weights([worker_id], version=self.pushed_version)
                self.continuity.drop(batch, [worker_id])
            self._request(worker_id)

    def _preempt(self, worker_ids: list[int]) -> None:
        """Ask ``worker_ids`` to end the batch in progress at their next step (not waited for: a
        worker that died meanwhile shows in the round's wait)."""
        for worker_id in worker_ids:
            if self.workers.serves(worker_id):
                self.workers.calls.preempt(worker_id, self.roster[worker_id].requests)

    def _without_padding(self, batch: TensorDictBase) -> TensorDictBase:
        """As TorchRL: concatenated along time (``cat_results=-1``, or 0 over ``[T]`` batches),
        the steps a preempted worker did not collect are dropped; stacked, its mask marks them."""
        if self.cat_results == -1 or (self.cat_results == 0 and batch.batch_dims == 1):
            return preemption.drop_padding(batch)
        return batch

    def _combine(self, results: list) -> TensorDictBase:
        stacked = self.shared(self._batches.round, results)  # the round where the workers wrote it
        if stacked is None:
            return layouts.combine([self._receive(i, r) for i, r in enumerate(results)], self.cat_results)
        return layouts.lay_out(stacked, self.cat_results)

    def _extend(self, batch: TensorDictBase) -> None:
        buffer_writes.write(self.replay_buffer, batch, stacked=self.sync and self.cat_results == "stack",
                            extend_buffer=self.extend_buffer, split_trajs=self.split_trajs, worker_ids=self._worker_ids)

    def __len__(self) -> int:
        if self.preempt_after is not None:  # rounds cut short hold fewer frames: more of them come
            raise preemption.no_length(self.preemptive_threshold)
        return super().__len__()

    # ---------------------------------------------------------------- state
    def _serving(self) -> list[int]:
        return [i for i in range(self.num_workers) if self.workers.serves(i)]

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker's env and torch RNG with distinct seeds; returns the next free seed."""
        self.require_running()
        seed = checks.seed(seed)
        if self.elastic:  # slot i gets seed + i; each collector in it one drawn from that seed's sequence
            for worker_id in range(self.num_workers):
                self.restarts.seeds[worker_id] = seed + worker_id
            self.gather({i: self.deferred.set_seed(i, self.restarts.seed(i)) for i in self._serving()})
            return seed + self.num_workers
        for worker_id in range(self.num_workers):
            self.restarts.seeds[worker_id] = int(seed)
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
