"""The collector front: what a multi-worker collector means, written once for every pool.

Sync rounds (one batch from every worker, combined in the class's layout), async first-come
batches with each worker's request depth, the weight-update cadence
(``update_after_each_batch``, ``max_weight_update_interval``), seeding and state. How the
workers exist is the pool's business (:mod:`rpc_collectors.pools`); batches arrive through the
data plane (:mod:`rpc_collectors.data_plane`), weights leave through the weight plane
(:class:`~rpc_collectors.weight_sync.WeightPlane`). Every wait goes through one
:class:`~rpc_collectors.events.Events` and is bounded by ``rpc_timeout``; a failed worker
raises :class:`~rpc_collectors.errors.Failure` out of the wait, and the front hands it to its
:class:`~rpc_collectors.recovery.Recovery` before asking again.
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from torch import nn

from . import checks, factory_weights, layouts, preemption
from .base import BaseCollector
from .data_plane import BatchPlane
from .errors import Failure, WorkerError
from .events import BATCH, Answer, Events, Joined
from .lifetime import Resources, release_with, weak_method
from .membership import Restarts
from .policies import run_device
from .recovery import Recovery
from .rendezvous import host_id
from .roster import WorkerRecord
from .settings import Settings
from .threads import TrainerThreads
from .weight_sync import WeightPlane, choose_transport
from .waits import Call, Waits
from .weights import one_source, weights_of



class CollectorFront(BaseCollector):
    """A multi-worker collector over a worker pool; public classes choose the pool and layout."""

    _default_cat_results: str | int = 0
    _no_push = False  # TorchRL's NoWeightSyncScheme: no weight plane, update_policy_weights_ does nothing

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
        self._policy_device = s.policy_device
        self.specs = s.specs
        self.policy = policy
        self.policy_version = 0
        self.events = Events()
        self.roster = [WorkerRecord() for _ in range(self.num_workers)]
        self.restarts = Restarts(s.max_worker_restarts, self.num_workers)
        self.recovery = Recovery(self)
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
        self.gather = self.waits.gather
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

    def _init_weights(self, transport: str, given: Any = None) -> None:
        """The weight plane, for the trainer's policy or (``policy_factory``) the ``given`` weights."""
        module = self.policy if isinstance(self.policy, nn.Module) else given
        if module is None or self._no_push:
            return
        if self._factory:  # the workers' policies must hold what the trainer will push
            signatures = self.gather({i: self._call(i, "weights_signature") for i in self._serving()})
            factory_weights.check_workers(dict(zip(self._serving(), signatures)), module)
        same_host = all(info is not None and info["host_id"] == host_id() for info in self.infos)
        kind = choose_transport(
            transport, same_host, self.backend, self.elastic, self.workers.in_process, self.workers.process_groups,
        )
        rdv = self.workers.weight_rendezvous() if kind == "broadcast" else None
        self.weights = self._resources.sender = WeightPlane(
            module, kind, self.num_workers, self.rpc_timeout, keep_fd=self.restarts.budget > 0,
            backend=self.backend, rdv=rdv,
        )
        joins = {i: self._call(i, "join_weights", self.weights.spec) for i in range(self.num_workers) if self.roster[i].info}
        futures = {i: call() for i, call in joins.items()}
        self.weights.sender.connect()
        self.gather(joins, futures)
        self.weights.sender.joined()

    def _join_batches(self, worker_id: int, spec: Any) -> bool:
        """Ask a worker to map a shared batch buffer; False if it cannot (a failure shows at its next request)."""
        recover = not self.restarts.budget and not self.elastic  # without restarts a failure raises its WorkerError here
        try:
            return self.gather({worker_id: self._call(worker_id, "join_batches", spec)}, recover=recover)[0]
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

    def _call(self, worker_id: int, method: str, *args: Any) -> Call:
        return functools.partial(self.workers.call, worker_id, method, *args)

    # ---------------------------------------------------------------- workers
    @property
    def infos(self) -> list[dict | None]:
        """What each worker's process reported of itself (rank, host, address, pid, ...); None: vacant."""
        return [record.info for record in self.roster]

    @property
    def worker_restarts(self) -> list[int]:
        """How many times each worker was replaced (``max_worker_restarts``), or how many
        collectors left each slot (``elastic``)."""
        return list(self.restarts.counts)

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
        """Until when to wait for the next batch: an answer to an outstanding request within
        rpc_timeout; with none outstanding (elastic, vacant slots), a collector within join_timeout."""
        outstanding = any(r.outstanding for r in self.roster)
        return self.waits.deadline() if outstanding or not self.elastic else time.monotonic() + self.join_timeout

    def _next_batch(self) -> tuple[int, Any]:
        """The next worker's batch answer (worker id, batch or ``Ready``); collectors that join
        meanwhile (elastic) are admitted. Deaths and timeouts raise :class:`Failure`."""
        deadline = self._deadline()
        while True:
            item = self.events.take(lambda e: isinstance(e, Joined) or (isinstance(e, Answer) and e.tag == BATCH),
                                    deadline, self.waits.check)
            if item is None:
                late = [i for i, r in enumerate(self.roster) if r.outstanding]
                if not late:
                    raise self.recovery.no_collector()
                raise self.waits.late(late[0])
            if isinstance(item, Joined):
                self.recovery.admit(item.rank)
                deadline = self._deadline()
                continue
            record = self.roster[item.worker_id]
            if item.generation != record.generation:
                continue  # the answer of a replaced worker
            result = self.waits.result(item.worker_id, item.fut)  # a failure leaves it asked: its replacement redoes it
            record.answered()
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
            fut = self.workers.call(worker_id, "collect", min_version, slot)
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
            batch = self._batches.place(self._combine([results[i] for i in range(self.num_workers)]))
            return batch if self.preempt_after is None else self._without_padding(batch)
        if self._last_async is not None:
            self._request(self._last_async)  # after the trainer's step, with fresh weights if asked
        for worker_id in range(self.num_workers):
            if worker_id != self._last_async:
                for _ in range(self._batches.depth(worker_id) - self.roster[worker_id].outstanding):
                    self._request(worker_id)
        self._last_async, result = self._next_answer()
        batch = self._receive(self._last_async, result)
        if not self.update_after_each_batch:
            self._request(self._last_async)  # keep the worker busy while the trainer works
            self._last_async = None
        return self._batches.place(batch)

    def _preempt(self, worker_ids: list[int]) -> None:
        """Ask ``worker_ids`` to end the batch in progress at their next step (not waited for: a
        worker that died meanwhile shows in the round's wait)."""
        for worker_id in worker_ids:
            if self.workers.serves(worker_id):
                self.workers.call(worker_id, "preempt", self.roster[worker_id].requests)

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
        """Write a batch into ``replay_buffer`` as TorchRL's workers write theirs (see :func:`layouts.for_storage`);
        with ``extend_buffer=False`` each worker's steps one by one (``add``), worker after worker."""
        if not self.extend_buffer:
            for part in layouts.worker_parts(batch, self.sync and self.cat_results == "stack", self._worker_ids):
                if preemption.MASK in part.keys(True):
                    part = preemption.drop_padding(part)
                for step in part.unbind(part.batch_dims - 1):
                    self.replay_buffer.add(step)
            return
        if self.sync and self.cat_results == "stack" and not self.split_trajs:
            batch = layouts.for_storage(batch, getattr(getattr(self.replay_buffer, "storage", None), "ndim", None))
        self.replay_buffer.extend(batch)

    # ---------------------------------------------------------------- weights
    def init_updater(self, *args: Any, **kwargs: Any) -> None:
        """The weight plane is set up by the constructor; nothing is left to prepare (arguments ignored)."""

    def update_policy_weights_(
        self, policy_or_weights: Any = None, *, worker_ids: Any = None, non_blocking: bool = False,
        weights: Any = None, policy: Any = None,
    ) -> None:
        """Push new weights to all workers (one broadcast) or to ``worker_ids`` (0-based ids, or
        TorchRL's form: the ``torch.device`` the workers' policy runs on).

        ``policy_or_weights`` (or TorchRL's ``weights=``/``policy=``): an ``nn.Module``, a
        TensorDict of weights or a state dict; None pushes the tensors the policy given to the
        constructor holds at this call (also after its parameters were replaced), or, when the
        workers build their policies (``policy_factory``), the weights given last. The trainer's
        ``policy_version`` goes up by one; each worker applies the weights before its next batch,
        never in the middle of one. With ``non_blocking=True`` this returns once the weights
        are copied out of the policy, and the transfer completes in the background.
        """
        policy_or_weights = one_source(policy_or_weights, weights, policy)
        self.require_running()
        if self._no_push:
            return
        devices = self._policy_device if isinstance(self._policy_device, list) else [self._policy_device]
        device = [run_device(self.policy, d) for d in devices]  # where the workers run their policy
        device = device if isinstance(self._policy_device, list) else device[0]
        ids = [i for i in checks.worker_ids(worker_ids, self.num_workers, device) if self.workers.serves(i)]
        source = None if policy_or_weights is None else weights_of(policy_or_weights)
        self._open_given(source)
        self._push_weights(ids, source, non_blocking)

    def _open_given(self, source: TensorDictBase | None) -> None:
        """``policy_factory``: lay the weight plane out from the first weights pushed (checked
        against every worker's policy); they, or later ones, are what a push without weights sends."""
        if self.weights is None:
            if not self._factory:
                raise TypeError(factory_weights.NOT_A_MODULE)
            if source is None:
                raise TypeError(factory_weights.NO_WEIGHTS)
            with self._lock:
                self._init_weights(self._transport, given=source)
        if self._factory and source is not None and not isinstance(self.policy, nn.Module):
            self._given = source

    def push_version(self, version: int, source: TensorDictBase | None = None) -> None:
        """Push the policy's weights (or ``source``) to every worker as ``version`` (a node passing on its trainer's)."""
        self.require_running()
        self._open_given(source)
        self._push_weights(self._serving(), source, version=version)

    def _push_weights(
        self, worker_ids: list[int], source: Any = None, non_blocking: bool = False, version: int | None = None,
    ) -> None:
        with self._lock:
            self._finish_push()
            source = self._given if source is None else source
            version = self.policy_version + 1 if version is None else version
            receive = self.weights.push(worker_ids, source, version)
            self.policy_version = version
            self._push = {i: self._call(i, "receive_weights", *args) for i, args in receive.items()}
            self._pushed = {i: call() for i, call in self._push.items()}
            if not non_blocking:
                self._finish_push()

    def _finish_push(self) -> None:
        """Wait until the previous weight push reached its workers."""
        push, self._push = self._push, {}
        if push:
            self.gather(push, self._pushed)
            self.weights.sender.wait()

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
            self.gather({i: self._call(i, "set_seed", self.restarts.seed(i)) for i in self._serving()})
            return seed + self.num_workers
        for worker_id in range(self.num_workers):
            self.restarts.seeds[worker_id] = int(seed)
            seed = self.gather({worker_id: self._call(worker_id, "set_seed", int(seed))})[0]
        return seed

    def state_dict(self) -> dict:
        """Frames, iteration, weights version and every worker's collector state (``"workers"``, a
        list; also under TorchRL's ``"worker0"``, ``"worker1"``, ... keys, with its ``"policy_state_dict"``)."""
        self.require_running()
        with self._lock:
            self._finish_push()
        state = self._base_state()
        state["policy_version"] = self.policy_version
        if self.elastic:  # collectors come and go: keep where their trajectory ids continue from
            state["workers"], state["traj_id_bounds"] = None, self.restarts.bounds()
            return state
        state["workers"] = self.gather({i: self._call(i, "state_dict") for i in range(self.num_workers)})
        state.update({f"worker{i}": worker for i, worker in enumerate(state["workers"])})  # TorchRL's keys
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``; the workers' envs restart, trajectory ids keep increasing."""
        self.require_running()
        if self.elastic:
            if state.get("traj_id_bounds") is None or len(state["traj_id_bounds"]) != self.num_workers:
                raise ValueError(f"the state is not that of an elastic collector with {self.num_workers} slots")
            if self._serving():
                raise RuntimeError("load_state_dict on an elastic collector must come before its first batch")
            self._load_base_state(state)
            self.policy_version = int(state["policy_version"])
            self.restarts.restore(state["traj_id_bounds"])
            return
        if state["workers"] is None:
            raise ValueError("the state is an elastic collector's; load it into a collector with elastic=True")
        if len(state["workers"]) != self.num_workers:
            raise ValueError(f"the state holds {len(state['workers'])} workers; this collector has {self.num_workers}")
        self._load_base_state(state)
        self.policy_version = int(state["policy_version"])
        self.gather({i: self._call(i, "load_state_dict", s) for i, s in enumerate(state["workers"])})
        for i, worker_state in enumerate(state["workers"]):
            self.restarts.loaded(i, int(worker_state["traj_count"]))

    # ---------------------------------------------------------------- shutdown
    def _shutdown(self, close_env: bool) -> None:
        self.events.wake()  # a wait in another thread sees the shutdown
        self._resources.close()
        self._release.detach()
