"""Multi-worker collectors: ``RPCCollector`` (workers over torch.distributed.rpc) and ``MultiCollector``.

The trainer (rank 0) asks each collector server for batches, combines them (sync) or hands
them out first-ready-first-served (async), and pushes policy weights through the weight
plane. Batches of workers on the trainer's host arrive through shared memory, the others'
as RPC results (:mod:`rpc_collectors.data_plane`). Every wait is event-driven (future
callbacks feed one queue) and bounded by ``rpc_timeout``; a failing worker stops the whole
collector with one :class:`WorkerError`, unless ``max_worker_restarts`` lets it be replaced
(the budget and bookkeeping live in :mod:`rpc_collectors.membership`).
"""
from __future__ import annotations

import collections
import functools
import inspect
import os
import queue
import sys
import threading
import time
import uuid
from typing import Any, Callable

import cloudpickle
import torch
from tensordict import TensorDictBase
from torch import nn

from . import checks
from .base import BaseCollector
from .collector import Collector
from .data_plane import BatchPlane
from .envs import check_env_id
from .errors import Failure, WorkerError, remote_summary
from .lifetime import Resources, release_with, weak_method
from .elastic import JOIN_VARIABLE, ElasticSlots, ElasticWorkers, join_rendezvous, member_rendezvous
from .membership import Restarts
from .policies import StepPolicy, run_device
from .rendezvous import detect_launcher, from_environment, host_id
from .threads import TrainerThreads
from .weight_sync import TRANSPORTS, TransportSpec, WeightSender, shm_file
from .weights import FlatWeights, one_source, weights_of
from .worker import serve
from .workers import InProcessWorkers, RPCWorkers

WORKER_ID = ("collector", "worker_id")
TIMEOUT_MARGIN = 1.0  # seconds past rpc_timeout before a wait gives up (the RPC's own timeout comes first)
RPC_TIMED_OUT = "ran for more than set timeout"  # torch's message for an RPC past its timeout
CAT_RESULTS = ("stack", 0, -1)
Call = Callable[[], torch.futures.Future]  # a request to one worker, that can be sent again


_COLLECTOR_KWARGS = set(inspect.signature(Collector.__init__).parameters) - {
    "self", "create_env_fn", "policy", "frames_per_batch", "total_frames", "traj_id_start", "traj_id_stride",
    "split_trajs", "postproc", "replay_buffer",
}


class RPCCollector(ElasticSlots, BaseCollector):
    """Collects with N collector servers on other processes or nodes, over ``torch.distributed.rpc``.

    Args:
        create_env_fn: an env or env factory for every worker, or a list of them, one per worker.
        policy: as for :class:`~rpc_collectors.Collector`; each worker gets a copy, and
            ``update_policy_weights_`` pushes the trainer's current weights to them.
        frames_per_batch: frames per batch; in sync mode split over the workers, rounded
            up with a warning when it does not divide evenly (as TorchRL does).
        total_frames: frames in the whole run, -1 for endless.
        num_collectors: number of workers when ``create_env_fn`` is not a list (local and debug
            launchers); under torchrun/SLURM it must be None or ``WORLD_SIZE - 1``.
        sync: True: every batch holds all workers' frames of one round, in worker order.
            False: each batch is one worker's, first ready first served, and workers keep going.
        cat_results: sync batches stacked (``"stack"``: ``[N, (B,) T]``) or concatenated along
            dim 0 (``0``: ``[N*T]`` or ``[N*B, T]``) or the time dim (``-1``). None: the layout
            of TorchRL's class of the same name, ``0`` for ``RPCCollector`` (TorchRL's
            concatenates its workers' batches) and ``"stack"`` for the ``Multi*`` classes.
        launcher: ``"auto"`` (torchrun or SLURM if their variables are set, else local),
            ``"local"`` (spawn N processes on this host), ``"torchrun"``, ``"slurm"`` or
            ``"debug"`` (workers in this process, no RPC). Under torchrun/SLURM the constructor
            serves collectors on every rank but 0 and exits those processes with code 0 when
            the trainer shuts down.
        backend: weight process group backend, ``"gloo"`` (CPU) or ``"nccl"`` (CUDA).
        rpc_timeout: seconds any single wait on a worker may take (at most 10^6).
        collector_kwargs: extra keyword arguments for every worker's :class:`Collector`.
        exploration_type: TorchRL's ``ExplorationType`` the workers set around every policy
            call; default ``RANDOM``, as TorchRL's collectors.
        num_threads: torch threads of the trainer process while the collector runs (restored at
            shutdown); None: as TorchRL, the threads it had less one per worker on its host,
            at least 1, so the trainer does not compete with its own workers for cores.
        max_worker_restarts: how many times in the run a failed local or debug worker (it died,
            did not answer within ``rpc_timeout``, or its env or policy raised) is replaced by a
            fresh one, with the same worker id, the current weights and new trajectory ids; a
            warning names each. 0: the first failure raises :class:`WorkerError`.
        elastic: torchrun/SLURM only. Collector processes may join the running trainer (any
            process that runs this script with ``RPC_COLLECTORS_JOIN=<host>:<port>`` of the
            trainer's rendezvous set) and leave it. ``num_collectors`` is then the number of
            slots (worker ids), each held by one collector at a time; a failed collector leaves
            its slot vacant (:class:`WorkerLeftWarning`) for the next to join, and collectors
            beyond the slots wait as spares. Weights travel as RPC arguments
            (``weight_transport="rpc"``) and batches as RPC results. See README "Elastic runs".
        join_timeout: with ``elastic``, seconds a sync round waits for a vacant slot to be taken
            (async: for any collector at all) before raising ``TimeoutError``; also how long a
            collector waits for its trainer to come up.
        update_after_each_batch: push the trainer's weights before each worker's next batch.
        max_weight_update_interval: push weights to a worker after it delivered more than this
            many batches with the same weights (-1: never on its own).
        weight_transport: ``"auto"`` (shared memory when every worker shares the trainer's host,
            else ``"broadcast"`` over the weight process group; ``"rpc"`` when elastic), ``"shm"``,
            ``"broadcast"`` or ``"rpc"`` (the flat weights as the argument of each worker's call).
        max_frames_per_traj, init_random_frames, reset_at_each_iter, split_trajs, postproc,
        device, storing_device, env_device, policy_device, replay_buffer: as for ``Collector``
            (``init_random_frames`` is shared out over the workers). Workers hand batches over in
            host memory; the trainer puts them on ``storing_device`` (from page-locked shared
            memory straight to a CUDA device, see :mod:`rpc_collectors.data_plane`).

    Sync batches and async batches carry ``("collector", "worker_id")``.
    """

    _default_cat_results: str | int = 0  # TorchRL's RPCCollector: torch.cat of the workers' batches

    def __init__(
        self,
        create_env_fn: Any,
        policy: Any = None,
        *,
        frames_per_batch: int,
        total_frames: int = -1,
        num_collectors: int | None = None,
        sync: bool = True,
        cat_results: str | int | None = None,
        launcher: str = "auto",
        backend: str = "gloo",
        rpc_timeout: float = 60.0,
        collector_kwargs: dict | None = None,
        exploration_type: Any = None,
        num_threads: int | None = None,
        max_worker_restarts: int = 0,
        elastic: bool = False,
        join_timeout: float = 300.0,
        update_after_each_batch: bool = False,
        max_weight_update_interval: int = -1,
        weight_transport: str = "auto",
        max_frames_per_traj: int | None = None,
        init_random_frames: int | None = 0,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        postproc: Any = None,
        device: Any = None,
        storing_device: Any = None,
        env_device: Any = None,
        policy_device: Any = None,
        replay_buffer: Any = None,
    ) -> None:
        super().__init__(
            frames_per_batch=frames_per_batch, total_frames=total_frames, split_trajs=split_trajs,
            postproc=postproc, replay_buffer=replay_buffer,
        )
        self._closed = self._closing = True  # until the workers are up
        self.elastic = checks.boolean("elastic", elastic)
        self.launcher = detect_launcher(launcher, self.elastic)
        self.join_timeout = checks.timeout("join_timeout", join_timeout)
        joining = join_rendezvous()
        if joining is not None:  # a collector process started to join a running trainer
            if not self.elastic:
                raise ValueError(f"{JOIN_VARIABLE} is set, so this process joins a trainer as a collector; that needs elastic=True")
            self._serve(member_rendezvous(joining, self.join_timeout), rpc_timeout)
        rdv = None
        if self.launcher in ("torchrun", "slurm"):
            rdv = from_environment(self.launcher)
            if rdv.rank != 0:
                self._serve(member_rendezvous(rdv, self.join_timeout) if self.elastic else rdv, rpc_timeout)
        elif self.elastic:
            raise ValueError(
                f"elastic=True needs a trainer that collectors can join over the network; accepted with "
                f"launcher={launcher!r} (resolved to {self.launcher!r}): False (elastic launchers: 'torchrun', 'slurm')"
            )
        env_fns = self._env_fns(create_env_fn, num_collectors, rdv)
        self.num_workers = len(env_fns)
        self.sync = checks.boolean("sync", sync)
        self.cat_results = checks.choice(
            "cat_results", self._default_cat_results if cat_results is None else cat_results, CAT_RESULTS
        )
        num_threads = checks.optional_positive_int("num_threads", num_threads)
        self.backend = checks.choice("backend", backend, ("gloo", "nccl"))
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA, which this machine does not have; accepted here: 'gloo'")
        self.rpc_timeout = checks.timeout("rpc_timeout", rpc_timeout)
        self.update_after_each_batch = checks.boolean("update_after_each_batch", update_after_each_batch)
        interval = max_weight_update_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < -1:
            raise ValueError(f"max_weight_update_interval={interval!r} is invalid; accepted: -1 (never) or an int >= 0")
        self.max_weight_update_interval = interval
        checks.choice("weight_transport", weight_transport, TRANSPORTS)
        if self.elastic:
            checks.elastic(weight_transport, self.backend)
        restarts = checks.max_worker_restarts(max_worker_restarts, self.launcher, weight_transport, self.backend)
        if self.sync:
            per_worker = checks.frames_per_batch_fits(self.frames_per_batch, self.num_workers, "workers")
            self.frames_per_batch = per_worker * self.num_workers
        else:
            per_worker = self.frames_per_batch
        if policy is not None and not callable(policy):
            StepPolicy(policy)  # raises the TypeError naming the argument
        kwargs = dict(
            frames_per_batch=per_worker, max_frames_per_traj=max_frames_per_traj,
            init_random_frames=-(-checks.init_random_frames(init_random_frames) // self.num_workers),
            reset_at_each_iter=reset_at_each_iter, device=device, storing_device=storing_device,
            env_device=env_device, policy_device=policy_device, exploration_type=exploration_type,
        )
        kwargs.update(self._collector_kwargs(collector_kwargs))
        checks.max_frames_per_traj(kwargs["max_frames_per_traj"])
        checks.boolean("reset_at_each_iter", kwargs["reset_at_each_iter"])
        kwargs["exploration_type"] = checks.exploration_type(kwargs["exploration_type"])
        self.exploration_type = kwargs["exploration_type"]
        devices = checks.devices(kwargs["device"], kwargs["storing_device"], kwargs["env_device"], kwargs["policy_device"])
        self._policy_device, self._storing_device = devices["policy_device"], devices["storing_device"]
        kwargs["storing_device"] = "cpu"  # batches travel in host memory; the trainer places them (data_plane)
        specs = self._specs(env_fns, policy, kwargs)
        self.policy = policy
        self.policy_version = 0

        self._events: queue.Queue = queue.Queue()
        self.restarts = Restarts(restarts, self.num_workers)
        self._running = False  # failures are replaced only once the collector is up
        self._specs = specs
        self._worker_frames = per_worker
        self._generation = [0] * self.num_workers  # which process serves a worker id: answers of old ones are dropped
        self._dead: dict[int, str] = {}
        self._deaths = [threading.Event() for _ in range(self.num_workers)]
        self._waiters: set[queue.Queue] = set()  # queues of _wait_all calls in progress
        self._min_version = [0] * self.num_workers
        self._since_update = [0] * self.num_workers
        self._outstanding: collections.Counter[int] = collections.Counter()  # requests in flight per worker
        self._last_async: int | None = None
        self._push: dict[int, Call] = {}  # the weight push in progress: its calls and their futures
        self._pushed: dict[int, torch.futures.Future] = {}
        self._sender: WeightSender | None = None
        self._batches: BatchPlane | None = None
        self._lock = threading.RLock()
        self._resources = Resources()
        if self.launcher == "debug":
            self.workers: Any = InProcessWorkers(self.num_workers)
        elif self.elastic:  # collectors are admitted as they join, while collecting (see _admit)
            self.workers = ElasticWorkers(rdv, self.num_workers, self.rpc_timeout, weak_method(self._on_arrival))
        else:
            self.workers = RPCWorkers(
                rdv, self.num_workers, self.rpc_timeout, weak_method(self._on_death), replaceable=restarts > 0
            )
        self._resources.workers = self.workers
        self._release = release_with(self, self._resources)
        self._closed = self._closing = False
        self._round: dict[int, Any] | None = None  # the answers of a sync round in progress
        try:
            if self.elastic:
                self.infos: list = [None] * self.num_workers
            else:
                self.infos = self._wait_all({i: functools.partial(self.workers.create, i, specs[i]) for i in range(self.num_workers)})
            for i, info in enumerate(self.infos):
                if info is not None:
                    self.restarts.started(i, info["envs"])
            self._init_weights(weight_transport)
            local_hosts = [self.launcher != "debug" and info is not None and info["host_id"] == host_id() for info in self.infos]
            self._resources.threads = TrainerThreads(num_threads, sum(local_hosts))
            rdv = getattr(self.workers, "rdv", None)  # other hosts send their batches to its address
            address = rdv.address() if rdv is not None and not self.elastic else None
            self._batches = self._resources.batches = BatchPlane(
                local_hosts, weak_method(self._join_batches), sync=self.sync, keep_fds=restarts > 0,
                device=self._storing_device, address=address, timeout=self.rpc_timeout,
                pipelined=not self.sync and not self.update_after_each_batch,
            )
            self._running = True
        except BaseException:
            self.shutdown()
            raise

    # ---------------------------------------------------------------- set-up
    @staticmethod
    def _serve(rdv: Any, rpc_timeout: float) -> None:
        """Serve a collector in this process until the trainer stops it, then exit the process."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(serve(rdv, float(rpc_timeout)))

    def _env_fns(self, create_env_fn: Any, num_collectors: int | None, rdv: Any) -> list:
        if num_collectors is not None:
            checks.positive_int("num_collectors", num_collectors)
        if isinstance(create_env_fn, (list, tuple)):
            if not create_env_fn:
                raise ValueError("create_env_fn=[] is empty; accepted: an env factory or a non-empty list of them")
            if num_collectors is not None and num_collectors != len(create_env_fn):
                raise ValueError(
                    f"num_collectors={num_collectors} does not match the {len(create_env_fn)} entries of create_env_fn"
                )
            fns = list(create_env_fn)
        else:
            n = num_collectors if num_collectors is not None else (rdv.world_size - 1 if rdv else None)
            if not n:
                raise ValueError(
                    "num_collectors=None: give the number of workers (with elastic=True: of collector slots), "
                    "or a list of env factories as create_env_fn"
                )
            fns = [create_env_fn] * n
        for i, fn in enumerate(fns):
            if fn is None or not (callable(fn) or isinstance(fn, str) or hasattr(fn, "step")):
                raise TypeError(f"create_env_fn[{i}]={fn!r} is not an env or env factory")
            if isinstance(fn, str):
                check_env_id(fn, "create_env_fn")
        if rdv is not None and not self.elastic and rdv.world_size - 1 != len(fns):
            raise ValueError(
                f"{len(fns)} collectors were asked for, but the {rdv.launcher} world has WORLD_SIZE="
                f"{rdv.world_size} (one trainer + {rdv.world_size - 1} collector ranks)"
            )
        return fns

    @staticmethod
    def _collector_kwargs(collector_kwargs: dict | None) -> dict:
        if collector_kwargs is None:
            return {}
        if not isinstance(collector_kwargs, dict):
            raise TypeError(f"collector_kwargs={collector_kwargs!r} is invalid; accepted: None or a dict")
        unknown = set(collector_kwargs) - _COLLECTOR_KWARGS
        if unknown:
            raise ValueError(
                f"collector_kwargs has unknown keys {sorted(unknown)}; accepted: {sorted(_COLLECTOR_KWARGS)}"
            )
        checks.collector_kwargs(collector_kwargs)
        return dict(collector_kwargs)

    @staticmethod
    def _specs(env_fns: list, policy: Any, kwargs: dict) -> list[bytes]:
        """What each worker builds its collector from, pickled here so that failures name the argument."""
        try:
            return [cloudpickle.dumps((fn, policy, kwargs)) for fn in env_fns]
        except Exception:
            for name, value in [(f"create_env_fn[{i}]", fn) for i, fn in enumerate(env_fns)] + [("policy", policy)]:
                checks.picklable(name, value)
            raise

    def _trainer_module(self) -> nn.Module | None:
        policy = self.policy
        return policy if isinstance(policy, nn.Module) else None

    def _init_weights(self, transport: str) -> None:
        module = self._trainer_module()
        if module is None:
            return
        flat = FlatWeights(module)
        same_host = all(info is not None and info["host_id"] == host_id() for info in self.infos)
        kind = transport if transport != "auto" else ("shm" if same_host and self.backend == "gloo" else "broadcast")
        if self.elastic:
            kind = "rpc"
        if kind != "shm" and self.launcher == "debug":  # in-process workers would share the trainer's buffer
            raise ValueError(f"weight_transport={kind!r} needs worker processes; the debug launcher uses 'shm'")
        if kind == "rpc":
            buffer, fd = flat.new_buffer(None), None
            spec = TransportSpec("rpc", flat.nbytes, timeout=self.rpc_timeout)
        elif kind == "shm":
            if not same_host:
                raise ValueError("weight_transport='shm' needs every worker on the trainer's host")
            path, fd, buffer = shm_file(flat.nbytes)
            spec = TransportSpec("shm", flat.nbytes, path=path, timeout=self.rpc_timeout)
        else:
            rdv = self.workers.rdv
            spec = TransportSpec(
                "broadcast", flat.nbytes, addr=rdv.master_addr, port=rdv.master_port,
                prefix=f"rpc_collectors/weights/{uuid.uuid4().hex}", world_size=self.num_workers + 1,
                backend=self.backend, interface=rdv.interface, timeout=self.rpc_timeout,
            )
            buffer, fd = flat.new_buffer(torch.device("cuda") if self.backend == "nccl" else None), None
        self._sender = self._resources.sender = WeightSender(flat, spec, buffer, fd, keep_fd=self.restarts.budget > 0)
        joins = {i: self._call(i, "join_weights", spec) for i in range(self.num_workers) if self.infos[i] is not None}
        futures = {i: call() for i, call in joins.items()}
        self._sender.connect()
        self._wait_all(joins, futures)
        self._sender.joined()

    def _join_batches(self, worker_id: int, spec: Any) -> bool:
        """Ask a worker to map a shared batch buffer; False if it cannot (a failure shows at its next request)."""
        try:  # without restarts a failure raises its WorkerError here
            return self._wait_all({worker_id: self._call(worker_id, "join_batches", spec)}, recover=not self.restarts.budget)[0]
        except Failure:
            return False

    def _call(self, worker_id: int, method: str, *args: Any) -> Call:
        return functools.partial(self.workers.call_async, worker_id, method, *args)

    # ---------------------------------------------------------------- restarts
    @property
    def worker_restarts(self) -> list[int]:
        """How many times each worker was replaced (``max_worker_restarts``), or how many
        collectors left each slot (``elastic``)."""
        return list(self.restarts.counts)

    def _recover(self, failed: Failure) -> bool:
        """Replace a failed worker while the budget lasts (a replacement that fails too costs
        another restart); else shut down and raise its WorkerError. Elastic: the worker's slot
        falls vacant (returns False) for the next collector to join."""
        if self.elastic:
            self._leave(failed.worker_id, failed.reason + remote_summary(failed.remote))
            return False
        while True:
            if self._closing:
                raise RuntimeError(f"{type(self).__name__} was shut down")
            worker_id = failed.worker_id
            reason = failed.reason if failed.remote else self._dead.get(worker_id, failed.reason)  # a raise comes first
            if not self._running or not self.restarts.take(worker_id, reason + remote_summary(failed.remote)):
                raise self._fail(self._worker_error(worker_id, failed.reason, failed.remote)) from failed.__cause__
            try:
                self._replace(worker_id)
                return True
            except Failure as again:
                failed = again
            except WorkerError as err:  # the replacement did not start
                failed = Failure(worker_id, err.reason)

    def _replace(self, worker_id: int) -> None:
        """A fresh process (or in-process collector) for ``worker_id``, set up as the others are:
        new trajectory ids and seed, the latest weights, the shared batch buffer."""
        self._generation[worker_id] += 1
        del self._outstanding[worker_id]
        self.workers.replace(worker_id)
        self._dead.pop(worker_id, None)
        self._deaths[worker_id].clear()
        self._set_up(worker_id)

    def _set_up(self, worker_id: int) -> None:
        """Build the collector of the process that now serves ``worker_id`` (replaced or newly joined)."""
        start = self.restarts.traj_id_start(worker_id)
        create = functools.partial(self.workers.create, worker_id, self._specs[worker_id], start)
        self.infos[worker_id] = info = self._wait_all({worker_id: create}, recover=False)[0]
        self.restarts.started(worker_id, info["envs"])
        steps = []
        seed = self.restarts.seed(worker_id)
        if seed is not None:
            steps.append(self._call(worker_id, "set_seed", seed))
        if self._sender is not None:
            steps.append(self._call(worker_id, "join_weights", self._sender.spec))
            if self._sender.latest is not None:
                steps.append(self._weights_call(worker_id, self.policy_version, self._sender.latest))
            self._min_version[worker_id] = self.policy_version
            self._since_update[worker_id] = 0
        for step in steps:
            self._wait_all({worker_id: step}, recover=False)
        self._shared(self._batches.rejoin, worker_id)

    # ---------------------------------------------------------------- faults
    def _on_death(self, worker_id: int, reason: str) -> None:
        self._dead[worker_id] = reason
        self._deaths[worker_id].set()
        self._events.put(("died", worker_id, reason))
        for waiter in list(self._waiters):
            waiter.put(None)

    def _worker_error(self, worker_id: int, reason: str, remote: str = "") -> WorkerError:
        info = self.infos[worker_id] if hasattr(self, "infos") else self.workers.identity(worker_id)
        return WorkerError.from_info(worker_id, info, self._dead.get(worker_id, reason), remote)

    def _fail(self, error: BaseException) -> BaseException:
        """Shut every worker down, then hand back ``error`` for the caller to raise."""
        if self._closing:  # the workers failed because shutdown() stopped them
            return RuntimeError(f"{type(self).__name__} was shut down")
        if isinstance(error, WorkerError):  # a hung worker would hold up the shutdown
            self.workers.kill(error.worker_id)
        self.shutdown()
        return error

    def _result(self, worker_id: int, fut: torch.futures.Future) -> Any:
        """The answer in ``fut``; a failed call raises :class:`Failure` with what went wrong."""
        try:
            return fut.wait()
        except Exception as err:
            if getattr(self.workers, "spawner", None) is not None and not self._closing:
                self._deaths[worker_id].wait(1.0)  # a dead local worker's exit code follows its reset connection
            text = str(err)
            remote = text if "Traceback" in text else ""
            if remote:
                reason = "raised an error"
            elif RPC_TIMED_OUT in text:
                reason = f"did not answer within rpc_timeout={self.rpc_timeout} s"
            else:
                reason = f"is unreachable: {text.splitlines()[0] if text else type(err).__name__}"
            raise Failure(worker_id, reason, remote) from err

    def _wait_all(
        self, calls: dict[int, Call], futures: dict[int, torch.futures.Future] | None = None, recover: bool = True,
    ) -> list:
        """Results of ``{worker_id: call}`` in worker order (``futures``: the calls already sent).

        A failed worker is replaced and asked again while the restart budget lasts (with
        ``recover=False`` its failure propagates as :class:`Failure`); then it raises WorkerError.
        """
        calls = dict(calls)
        futures = dict(futures) if futures is not None else {i: call() for i, call in calls.items()}
        done: "queue.Queue[tuple | None]" = queue.Queue()  # None: a worker died

        def watch(worker_id: int) -> None:
            fut = futures[worker_id]
            fut.add_done_callback(lambda _f: done.put((worker_id, fut)))

        self._waiters.add(done)
        try:
            for worker_id in futures:
                watch(worker_id)
            results: dict[int, Any] = {}
            deadline = time.monotonic() + self.rpc_timeout + TIMEOUT_MARGIN
            while len(results) < len(calls):
                try:
                    self._raise_if_dead()
                    try:
                        item = done.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        late = min(set(calls) - set(results))
                        raise Failure(late, f"did not answer within rpc_timeout={self.rpc_timeout} s") from None
                    if item is not None and item[1] is futures[item[0]]:  # not an answer of a replaced worker
                        results[item[0]] = self._result(*item)
                except Failure as failed:
                    if not recover:
                        raise
                    if not self._recover(failed):  # an elastic collector left: its slot has no answer
                        calls.pop(failed.worker_id, None)
                    elif failed.worker_id in calls and failed.worker_id not in results:
                        futures[failed.worker_id] = calls[failed.worker_id]()
                        watch(failed.worker_id)
                    deadline = time.monotonic() + self.rpc_timeout + TIMEOUT_MARGIN
            return [results[i] for i in sorted(results)]
        finally:
            self._waiters.discard(done)

    def _raise_if_dead(self) -> None:
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} was shut down")
        if self._dead:
            worker_id = min(self._dead)
            raise Failure(worker_id, self._dead[worker_id])

    # ---------------------------------------------------------------- collection
    def _request(self, worker_id: int, again: bool = False) -> None:
        """Ask ``worker_id`` for its next batch (``again``: a replacement redoes the failed one's);
        a vacant elastic slot is asked once a collector takes it (:meth:`_admit`)."""
        if not self.workers.serves(worker_id):
            return
        if not again and self._needs_update(worker_id):
            self.update_policy_weights_(worker_ids=None if self.sync else [worker_id])
        slot = self._batches.slot_for(worker_id, again)
        fut = self._batches.ring(worker_id, self._min_version[worker_id], slot)  # a worker with slots
        if fut is None:
            fut = self.workers.call_async(worker_id, "collect", self._min_version[worker_id], slot)
        self._outstanding[worker_id] += 1
        self.restarts.asked(worker_id, self._worker_frames, self.infos[worker_id]["envs"])
        events, generation = self._events, self._generation[worker_id]  # not self: a pending future must not keep the collector alive
        fut.add_done_callback(lambda f, i=worker_id: events.put(("batch", i, (generation, f))))

    def _needs_update(self, worker_id: int) -> bool:
        if self._sender is None:
            return False
        if self.update_after_each_batch:
            return self._since_update[worker_id] > 0
        return 0 <= self.max_weight_update_interval < self._since_update[worker_id]

    def _deadline(self) -> float:
        """Until when to wait for the next event: an answer to an outstanding request within
        rpc_timeout; with none outstanding (elastic, vacant slots), a collector within join_timeout."""
        wait = self.rpc_timeout + TIMEOUT_MARGIN if self._outstanding or not self.elastic else self.join_timeout
        return time.monotonic() + wait

    def _next_event(self) -> tuple[int, Any]:
        """The next worker's answer (worker id, batch or ``Ready``); deaths and timeouts raise Failure.

        Collectors that join meanwhile (elastic) are admitted here."""
        deadline = self._deadline()
        while True:
            self._raise_if_dead()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not self._outstanding:
                    raise self._no_collector()
                late = min(self._outstanding)
                raise Failure(late, f"did not answer within rpc_timeout={self.rpc_timeout} s")
            try:
                kind, worker_id, payload = self._events.get(timeout=remaining)
            except queue.Empty:
                continue
            if kind == "joined":
                self._admit(worker_id)
                deadline = self._deadline()
                continue
            if kind in ("died", "closed"):
                continue  # _raise_if_dead reports it
            generation, fut = payload
            if generation != self._generation[worker_id]:
                continue  # the answer of a replaced worker
            result = self._result(worker_id, fut)  # a failure leaves the worker asked: its replacement is asked again
            self._outstanding[worker_id] -= 1
            if not self._outstanding[worker_id]:
                del self._outstanding[worker_id]
            self._since_update[worker_id] += 1
            return worker_id, result

    def _next_answer(self) -> tuple[int, Any]:
        """:meth:`_next_event`, replacing failed workers while the budget lasts; a replaced
        worker that had been asked for a batch is asked again."""
        while True:
            try:
                return self._next_event()
            except Failure as failed:
                asked = failed.worker_id in self._outstanding
                if self._recover(failed) and asked:
                    self._request(failed.worker_id, again=True)

    def _receive(self, worker_id: int, result: Any) -> TensorDictBase:
        """The batch of a worker's answer, labelled with its worker id."""
        batch = self._shared(self._batches.receive, worker_id, result)
        batch.set(WORKER_ID, torch.full(batch.shape, worker_id, dtype=torch.int64))
        return batch

    def _collect_batch(self) -> TensorDictBase:
        if self.sync:
            for worker_id in range(self.num_workers):
                self._request(worker_id)
            self._round = results = {}
            try:
                while len(results) < self.num_workers:
                    worker_id, result = self._next_answer()
                    results[worker_id] = result
            finally:
                self._round = None
            return self._batches.place(self._combine([results[i] for i in range(self.num_workers)]))
        if self._last_async is not None:
            self._request(self._last_async)  # after the trainer's step, with fresh weights if asked
        for worker_id in range(self.num_workers):
            if worker_id != self._last_async:
                for _ in range(self._batches.depth(worker_id) - self._outstanding[worker_id]):
                    self._request(worker_id)
        self._last_async, result = self._next_answer()
        batch = self._receive(self._last_async, result)
        if not self.update_after_each_batch:
            self._request(self._last_async)  # keep the worker busy while the trainer works
            self._last_async = None
        return self._batches.place(batch)

    def _shared(self, method: Any, *args: Any) -> Any:
        """Call a data-plane method; no room for a shared-memory buffer ends the run."""
        try:
            return method(*args)
        except OSError as err:
            raise self._fail(err) from None

    def _combine(self, results: list) -> TensorDictBase:
        stacked = self._shared(self._batches.round, results)  # the round where the workers wrote it
        if stacked is None:
            batches = [self._receive(i, r) for i, r in enumerate(results)]
            if self.cat_results == "stack":
                out = torch.stack(batches, 0)
            else:
                out = torch.cat(batches, 0 if self.cat_results == 0 else batches[0].batch_dims - 1)
        else:
            shape = stacked.shape
            ids = torch.arange(self.num_workers).reshape(-1, *[1] * (len(shape) - 1))
            stacked.set(WORKER_ID, ids.expand(shape).clone())
            if self.cat_results == "stack":
                out = stacked
            elif self.cat_results == 0 or len(shape) == 2:  # [N, T] or [N, B, T] -> [N*B, T]
                out = stacked.reshape(-1, *shape[2:])
            else:  # [N, B, T] along time -> [B, N*T]
                out = torch.cat(stacked.unbind(0), -1)
        out.names = [None] * (out.batch_dims - 1) + ["time"]
        return out

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
        constructor holds at this call (also after its parameters were replaced). The trainer's
        ``policy_version`` goes up by one; each worker applies the weights before its next batch,
        never in the middle of one. With ``non_blocking=True`` this returns once the weights
        are copied out of the policy, and the transfer completes in the background.
        """
        policy_or_weights = one_source(policy_or_weights, weights, policy)
        self._require_open()
        ids = [i for i in self._worker_ids(worker_ids) if self.workers.serves(i)]  # elastic: a newcomer catches up
        if self._sender is None:
            raise TypeError("update_policy_weights_: the policy is not an nn.Module, so it has no weights to push")
        source = None if policy_or_weights is None else weights_of(policy_or_weights)
        with self._lock:
            self._finish_push()
            self._sender.flat.pack(self._sender.buffer, source)
            self.policy_version += 1
            version = self.policy_version
            mode = self._sender.push([i + 1 for i in ids], version, all_workers=len(ids) == self.num_workers)
            self._push = {i: self._weights_call(i, version, mode) for i in ids}
            self._pushed = {i: call() for i, call in self._push.items()}
            for i in ids:
                self._min_version[i] = version
                self._since_update[i] = 0
            if not non_blocking:
                self._finish_push()

    def _weights_call(self, worker_id: int, version: int, mode: str) -> Call:
        """``receive_weights`` on ``worker_id``; the "rpc" transport sends the packed buffer with it."""
        payload = (self._sender.buffer,) if mode == "rpc" else ()
        return self._call(worker_id, "receive_weights", version, mode, *payload)

    def _worker_ids(self, worker_ids: Any) -> list[int]:
        if worker_ids is None:
            return list(range(self.num_workers))
        device = run_device(self.policy, self._policy_device)  # every worker runs its policy there
        on_device = checks.worker_devices(worker_ids, [device] * self.num_workers)
        if on_device is not None:
            if not on_device:
                raise ValueError(f"worker_ids={worker_ids!r}: no worker runs its policy there; the workers' policy device is {device}")
            return on_device
        ids = [worker_ids] if isinstance(worker_ids, int) else list(worker_ids)
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.num_workers]
        if bad or not ids:
            raise ValueError(f"worker_ids={worker_ids!r} is invalid; accepted: None or ids in 0..{self.num_workers - 1}")
        return sorted(set(ids))

    def _finish_push(self) -> None:
        """Wait until the previous weight push reached its workers."""
        push, self._push = self._push, {}
        if push:
            self._wait_all(push, self._pushed)
            self._sender.wait()

    # ---------------------------------------------------------------- state
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed every worker's env and torch RNG with distinct seeds; returns the next free seed."""
        self._require_open()
        seed = checks.seed(seed)
        if self.elastic:  # slot i gets seed + i; each collector in it one drawn from that seed's sequence
            for worker_id in range(self.num_workers):
                self.restarts.seeds[worker_id] = seed + worker_id
            self._wait_all({i: self._call(i, "set_seed", self.restarts.seed(i)) for i in self._serving()})
            return seed + self.num_workers
        for worker_id in range(self.num_workers):
            self.restarts.seeds[worker_id] = int(seed)
            seed = self._wait_all({worker_id: self._call(worker_id, "set_seed", int(seed))})[0]
        return seed

    def state_dict(self) -> dict:
        """Frames, iteration, weights version and every worker's collector state."""
        self._require_open()
        with self._lock:
            self._finish_push()
        state = self._base_state()
        state["policy_version"] = self.policy_version
        if self.elastic:  # collectors come and go: keep where their trajectory ids continue from
            state["workers"], state["traj_id_bounds"] = None, self.restarts.bounds()
            return state
        state["workers"] = self._wait_all({i: self._call(i, "state_dict") for i in range(self.num_workers)})
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``; the workers' envs restart, trajectory ids keep increasing."""
        self._require_open()
        if self.elastic:
            self._load_elastic_state(state)
            return
        if state["workers"] is None:
            raise ValueError("the state is an elastic collector's; load it into a collector with elastic=True")
        if len(state["workers"]) != self.num_workers:
            raise ValueError(f"the state holds {len(state['workers'])} workers; this collector has {self.num_workers}")
        self._load_base_state(state)
        self.policy_version = int(state["policy_version"])
        self._wait_all({i: self._call(i, "load_state_dict", s) for i, s in enumerate(state["workers"])})
        for i, worker_state in enumerate(state["workers"]):
            self.restarts.loaded(i, int(worker_state["traj_count"]))

    # ---------------------------------------------------------------- shutdown
    def _require_open(self) -> None:
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} was shut down; build a new collector to go on")

    def _shutdown(self, close_env: bool) -> None:
        self._events.put(("closed", -1, None))  # wakes a next() waiting in another thread
        for waiter in list(self._waiters):
            waiter.put(None)
        self._resources.close()
        self._release.detach()


class MultiCollector(RPCCollector):
    """N worker processes on this host (``RPCCollector`` with ``launcher="local"``).

    ``create_env_fn`` is a list with one env factory per worker; ``sync`` chooses between
    round-based batches of all workers and first-ready batches of one. Sync batches are
    stacked ``[N, (B,) T]`` by default, as TorchRL's ``MultiSyncCollector``.
    """

    _default_cat_results: str | int = "stack"

    def __init__(self, create_env_fn: Any, policy: Any = None, *, sync: bool = True, **kwargs: Any) -> None:
        if kwargs.get("launcher", "local") not in ("local", "debug"):
            raise ValueError(f"launcher={kwargs['launcher']!r} is invalid for MultiCollector; accepted: 'local' or 'debug'")
        kwargs.setdefault("launcher", "local")
        super().__init__(create_env_fn, policy, sync=sync, **kwargs)


class MultiSyncCollector(MultiCollector):
    """``MultiCollector`` with ``sync=True`` (TorchRL's name)."""

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        super().__init__(create_env_fn, policy, sync=True, **kwargs)


class MultiAsyncCollector(MultiCollector):
    """``MultiCollector`` with ``sync=False`` (TorchRL's name)."""

    def __init__(self, create_env_fn: Any, policy: Any = None, **kwargs: Any) -> None:
        super().__init__(create_env_fn, policy, sync=False, **kwargs)
