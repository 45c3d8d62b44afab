"""Collector workers as Ray actors, on any node of a Ray cluster.

Each actor serves one :class:`~rpc_collectors.worker.server.WorkerState`, the same code that every
other pool serves; the trainer's calls (:mod:`~rpc_collectors.core.protocol`) reach it as
``actor.handle.remote(name, *args)``. Actors run their calls in threads (a weight push is
answered while a batch is being collected), are created with ``max_restarts=0`` (Ray never
restarts one behind the trainer's back: :meth:`RayPool.replace` does, under
``max_worker_restarts``) and are asked for the resources in ``remote_configs``.

What crosses Ray's object store: a batch's leaves travel as numpy arrays (pickled out of band,
so without torch's per-storage serialization) and are copied into fresh tensors on the trainer,
so no batch handed to the user lies in store memory. Weights for actors that do not share the
trainer's memory are put into the store once per version (:meth:`RayPool.call`). Actors on the
trainer's node share memory with it: the front's shared-memory data and weight planes serve
them as they serve local workers (see :mod:`rpc_collectors.transport.data`).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import re
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import ray
import torch
from tensordict import TensorDict, TensorDictBase

from rpc_collectors.core import protocol
from rpc_collectors.pools.pool import WorkerPool, traceback_failure
from rpc_collectors.pools.ray_head import _reachable
from rpc_collectors.worker import server as worker

# TorchRL's default per actor
DEFAULT_REMOTE_CONFIG = {"num_cpus": 1, "memory": 2 * 1024**3}
# calls an actor runs at once
CALL_THREADS = 4
# Ray colours the actor's name in a task error
ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")
# seconds to ask Ray how an actor that stopped answering died
DEATH_CHECK = 5.0
# of close()'s timeout, spent waiting for the actors to close their envs
CLOSE_SHARE = 0.8
# its payload travels through the object store
RECEIVE_WEIGHTS = protocol.WorkerCalls.receive_weights.__name__


@dataclass
class NumpyBatch:
    """A TensorDict's leaves as numpy arrays, for Ray's zero-copy pickling."""

    batch_size: tuple
    leaves: list[tuple[tuple[str, ...], np.ndarray]]


def to_numpy(result: Any) -> Any:
    """A TensorDict of plain CPU tensors as a :class:`NumpyBatch`; anything else as it is."""
    if not isinstance(result, TensorDictBase):
        return result
    leaves = []
    for key, value in result.items(include_nested=True, leaves_only=True):
        if type(value) is not torch.Tensor or value.device.type != "cpu" or value.requires_grad:
            return result
        try:
            array = value.numpy()
        except (TypeError, RuntimeError):
            # bfloat16 and other types numpy cannot hold
            return result
        leaves.append((key if isinstance(key, tuple) else (key,), array))
    return NumpyBatch(tuple(result.batch_size), leaves)


def from_numpy(result: Any) -> Any:
    """A :class:`NumpyBatch` as a TensorDict of tensors of its own (copies
    of the store's arrays)."""
    if not isinstance(result, NumpyBatch):
        return result
    batch = TensorDict({}, batch_size=result.batch_size)
    for key, array in result.leaves:
        batch.set(key, torch.from_numpy(np.array(array, copy=True)))
    return batch


class RayWorker:
    """The actor: one collector server, serving the calls of
    :mod:`~rpc_collectors.core.protocol`."""

    def __init__(self, rank: int) -> None:
        torch.set_num_threads(1)
        self.rank = rank
        self.state: worker.WorkerState | None = None
        self.address = ray.util.get_node_ip_address()

    def handle(self, method: str, *args: Any) -> Any:
        """Serve the call ``method`` (or ``create``); Ray resolves object refs among ``args``."""
        if method == protocol.CREATE:
            spec, worker_id, num_workers, traj_id_start = args
            self.state = worker.WorkerState(spec, worker_id, num_workers, self.rank, traj_id_start,
                                            self.address)
            return self.state.info()
        if self.state is None:
            raise RuntimeError(f"collector worker {self.rank - 1} has no collector yet")
        if method == RECEIVE_WEIGHTS and len(args) == 3 and isinstance(args[2], np.ndarray):
            # the store's copy is read-only
            args = (*args[:2], torch.from_numpy(np.array(args[2], copy=True)))
        return to_numpy(protocol.serve(self.state, method, args))

    def close(self) -> None:
        state, self.state = self.state, None
        if state is not None:
            state.close()


_REMOTE_WORKER = ray.remote(RayWorker)


def _torch_future(ref: ray.ObjectRef,
                  then: Callable[[Any], Any] = from_numpy) -> torch.futures.Future:
    """A torch future of ``then(result)`` of a call (default: its batch copied out of the store)."""
    fut: torch.futures.Future = torch.futures.Future()

    def done(ray_fut: concurrent.futures.Future) -> None:
        try:
            fut.set_result(then(ray_fut.result()))
        except BaseException as err:
            # without its traceback: this frame, holding the future, would keep it for ever
            fut.set_exception(err.with_traceback(None))

    ref.future().add_done_callback(done)
    return fut


class RayPool(WorkerPool):
    """``num_workers`` Ray actors, worker i with ``remote_configs[i]``'s resources.

    Start-up waits at most ``start_timeout`` for every actor to be placed and running; an actor
    still pending for resources then is a ``RuntimeError`` naming what it asked for and what the
    cluster has free. ``shared_memory=False``: actors on the trainer's node are treated as
    remote ones (batches and weights through the object store).
    """

    replaceable = True
    # seconds close() gives the actors to close their envs
    close_timeout = 5.0
    # weights reach other nodes as call arguments: no process group to set up
    process_groups = False

    def __init__(
        self, num_workers: int, rpc_timeout: float, remote_configs: list[dict],
        start_timeout: float, shared_memory: bool = True,
    ) -> None:
        self.num_workers, self.rpc_timeout = num_workers, rpc_timeout
        self.remote_configs = remote_configs
        self.start_timeout, self.shared_memory = start_timeout, shared_memory
        self.actors: dict[int, Any] = {}
        # what each actor said of itself at its creation
        self.infos: dict[int, dict] = {}
        # the latest version put in the store
        self._weights: tuple[int, ray.ObjectRef] | None = None
        self._lock = threading.Lock()
        try:
            for worker_id in range(num_workers):
                self._spawn(worker_id)
            self._await(list(range(num_workers)))
        except BaseException:
            self.close()
            raise

    def _spawn(self, worker_id: int) -> None:
        options = dict(self.remote_configs[worker_id], max_restarts=0, max_concurrency=CALL_THREADS)
        self.actors[worker_id] = _REMOTE_WORKER.options(**options).remote(worker_id + 1)

    def _await(self, worker_ids: list[int]) -> None:
        """Wait until the actors of ``worker_ids`` run (bounded by ``start_timeout``)."""
        refs = {self.actors[i].__ray_ready__.remote(): i for i in worker_ids}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.start_timeout)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                raise self.error(refs[ref], f"did not start: {_first_line(err)}") from None
        if pending:
            worker_id = refs[pending[0]]
            free = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
            raise RuntimeError(
                f"collector worker {worker_id}'s Ray actor was not running within "
                f"{self.start_timeout} s: it asked for {self.remote_configs[worker_id]} "
                f"(remote_configs); the cluster has free {free}"
            )

    def create(self, worker_id: int, spec: bytes,
               traj_id_start: int | None = None) -> torch.futures.Future:
        ref = self.actors[worker_id].handle.remote(protocol.CREATE, spec, worker_id,
                                                   self.num_workers, traj_id_start)
        # a call still on its way once the collector failed must not keep the pool
        pool = weakref.ref(self)

        def created(info: dict) -> dict:
            alive = pool()
            return info if alive is None else alive._created(worker_id, info)

        return _torch_future(ref, created)

    def _created(self, worker_id: int, info: dict) -> dict:
        info = dict(info, actor_id=self.actors[worker_id]._actor_id.hex())
        # the front sees another node: no shared-memory planes
        if not self.shared_memory:
            info["host_id"] = f"{info['host_id']}/ray-actor-{info['actor_id']}"
        self.infos[worker_id] = info
        return info

    def call(self, worker_id: int, method: str, *args: Any) -> torch.futures.Future:
        # "rpc" mode: one store object per version
        if method == RECEIVE_WEIGHTS and len(args) == 3 and args[2] is not None:
            args = (args[0], args[1], self._weights_ref(args[0], args[2]))
        return _torch_future(self.actors[worker_id].handle.remote(method, *args))

    def _weights_ref(self, version: int, payload: torch.Tensor) -> ray.ObjectRef:
        with self._lock:
            if self._weights is None or self._weights[0] != version:
                self._weights = (version, ray.put(payload.detach().cpu().numpy()))
            return self._weights[1]

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        if isinstance(err, ray.exceptions.RayTaskError):
            return "raised an error", ANSI_CODES.sub("", str(err))
        raised = traceback_failure(err)
        if raised is not None:
            return raised
        actor = self.infos.get(worker_id,
                               {}).get("actor_id") or self.actors[worker_id]._actor_id.hex()
        # e.g. its doorbell closed: ask Ray why
        if not isinstance(err, ray.exceptions.RayActorError):
            err = self._death(worker_id) or err
        if isinstance(err, ray.exceptions.RayActorError):
            return f"(Ray actor {actor}) died: {_first_line(err)}", ""
        return f"(Ray actor {actor}) is unreachable: {_first_line(err)}", ""

    def _death(self, worker_id: int) -> ray.exceptions.RayActorError | None:
        """How ``worker_id``'s actor died, if Ray says so within ``DEATH_CHECK`` seconds."""
        actor = self.actors.get(worker_id)
        if actor is None:
            return None
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=DEATH_CHECK)
        except ray.exceptions.RayActorError as err:
            return err
        except ray.exceptions.RayError:
            pass
        return None

    def replace(self, worker_id: int) -> None:
        """Kill ``worker_id``'s actor and start a fresh one in its place."""
        self.kill(worker_id)
        self.infos.pop(worker_id, None)
        self._spawn(worker_id)
        self._await([worker_id])

    def kill(self, worker_id: int) -> None:
        actor = self.actors.get(worker_id)
        if actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    def identity(self, worker_id: int) -> dict:
        info = self.infos.get(worker_id, {})
        actor = self.actors.get(worker_id)
        host = info.get("host") or "a Ray node"
        if actor is not None:
            host += f", Ray actor {actor._actor_id.hex()}"
        return {"rank": worker_id + 1, "host": host, "pid": info.get("pid")}

    def close(self, timeout: float | None = None) -> None:
        """Ask every actor to close its collector (and envs) within ``timeout`` seconds (default
        ``close_timeout``), then kill them all; nothing if this process's Ray was stopped (it took
        its actors along)."""
        timeout = self.close_timeout if timeout is None else timeout
        actors, self.actors = self.actors, {}
        # Ray stopped: the actors went with it, and a call would start a new Ray
        if not actors or not ray.is_initialized():
            self._weights = None
            return
        closes = []
        for actor in actors.values():
            with contextlib.suppress(Exception):
                closes.append(actor.close.remote())
        with contextlib.suppress(Exception):
            ray.wait(closes, num_returns=len(closes), timeout=timeout * CLOSE_SHARE)
        for actor in actors.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._weights = None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# ---------------------------------------------------------------- Ray's lifetime
# a Ray of this collector's own: for this host only, no dashboard
LOCAL_RAY = {"include_dashboard": False, "_node_ip_address": "127.0.0.1"}


def connect(ray_init_config: dict | None, timeout: float) -> bool:
    """Attach to Ray, or start it; returns whether this call started it (and so must stop it).

    None: this process's Ray if it runs, else a cluster Ray can find (``RAY_ADDRESS`` or the
    newest one on this machine), else a local instance on 127.0.0.1. A config with an ``address``
    attaches there (an address that does not answer as a Ray head within ``timeout`` is a
    ``ConnectionError``: see :func:`_reachable`); one without starts a local instance with those
    arguments.
    """
    if ray.is_initialized():
        # TorchRL always passes its full default dict: use the running Ray, as it does
        if ray_init_config:
            warnings.warn(
                f"ray_init_config={ray_init_config!r} is not applied: Ray already runs in this "
                "process, and the collector uses it (pass ray_init_config=None to silence this)",
                UserWarning, stacklevel=3,
            )
        return False
    config = dict(ray_init_config or {})
    address = config.pop("address", None)
    if ray_init_config is None:
        try:
            ray.init(address="auto")
            return False
        except ConnectionError:
            ray.init(address="local", **LOCAL_RAY)
            return True
    if address in (None, "local"):
        ray.init(address="local", **{**LOCAL_RAY, **config})
        return True
    _reachable(str(address), timeout)
    ray.init(address=address, **config)
    return False


def check_resources(remote_configs: list[dict]) -> None:
    """Refuse actors that ask for more of a resource than the whole cluster
    has (before any starts)."""
    total = ray.cluster_resources()
    names = {"num_cpus": "CPU", "num_gpus": "GPU", "memory": "memory"}
    for i, config in enumerate(remote_configs):
        asked = {names[k]: v for k, v in config.items() if k in names and v}
        asked.update(config.get("resources") or {})
        for name, amount in asked.items():
            if amount > total.get(name, 0):
                key = next((k for k, v in names.items() if v == name), f"resources[{name!r}]")
                raise ValueError(
                    f"remote_configs[{i}][{key!r}]={amount!r}: the Ray cluster has "
                    f"{total.get(name, 0)} {name} in all; accepted: at most that"
                )
