"""Handles on collector servers, as the trainer sees them: start, call, stop.

:class:`RPCWorkers` reaches servers over ``torch.distributed.rpc`` (local worker processes it
starts itself, or the other ranks of a torchrun/SLURM run); :class:`InProcessWorkers` runs
the same server code in the trainer's process (the debug launcher). Both return
``torch.futures.Future`` objects and report deaths through ``on_death(worker_id, reason)``.
"""
from __future__ import annotations

import functools
import os
import signal
import contextlib
import queue
import socket
import threading
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from . import membership, spawner, worker
from .errors import WorkerError
from .rendezvous import Rendezvous, serve_store, stopped_key, store_client
from .spawner import Spawner

OnDeath = Callable[[int, str], None]
_starting = threading.Lock()  # held while an RPC agent of this process starts


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"died with exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


class RPCWorkers:
    """Collector servers on ranks 1..N of an RPC world where this process is rank 0.

    Start-up is interruptible and bounded: the RPC agent starts in a thread while this one
    waits for it, for a local worker's exit (reported by the spawner at once) or for Ctrl-C;
    on either of the last two the rendezvous store is closed, which ends the agent's start.
    :meth:`close` is idempotent and, when interrupted, a second call finishes it.

    With ``replaceable=True`` (local workers only) the group is dynamic: the trainer's agent
    starts first, each worker joins it and announces itself (:mod:`rpc_collectors.membership`),
    and :meth:`replace` puts a fresh process, under a new rank, in a failed worker's place.
    """

    def __init__(
        self, rdv: Rendezvous | None, num_workers: int, rpc_timeout: float, on_death: OnDeath,
        replaceable: bool = False,
    ) -> None:
        """``rdv=None`` starts ``num_workers`` local processes; otherwise join a torchrun/SLURM world."""
        if rpc.api._is_current_rpc_agent_set() or _starting.locked():
            raise RuntimeError(
                "this process already runs an RPC agent (another RPCCollector?); shut it down first: "
                "one RPCCollector per process"
            )
        self.num_workers, self.rpc_timeout, self.on_death = num_workers, rpc_timeout, on_death
        self.spawner: Spawner | None = None
        self.pids: dict[int, int] = {}  # local worker pid -> worker id, until reaped
        self.worker_pids: dict[int, int] = {}  # worker id -> pid of a local worker (for error messages)
        self.ranks = list(range(1, num_workers + 1))  # worker id -> rank of the process serving it now
        self.rdv = rdv
        self._store: dist.TCPStore | None = None  # served here: closing it ends every wait on it
        self._client: dist.TCPStore | None = None
        self._agent: threading.Thread | None = None
        self._rpc_up = False
        self._closing = False
        self._wake = threading.Event()  # the agent started, or a worker exited during start-up
        self._exited = threading.Event()  # a worker exited during start-up
        self._start_exits: dict[int, str] = {}  # worker id -> exit reason, during start-up
        self._joining: set[int] = set()  # worker ids whose process has not joined the dynamic group yet
        self._quiet = contextlib.ExitStack()  # drops torch's C++ warnings while replaceable workers run
        self._generation = rpc_api_generation()  # before this process's agent starts
        spawner.rpc_starts_here()
        try:
            if rdv is None:
                self._store, port = serve_store("127.0.0.1", 0, rpc_timeout)
                self.rdv = Rendezvous(
                    "local", 0, num_workers + 1, "127.0.0.1", port, "lo", session=str(port), dynamic=replaceable
                )
                self.spawner = spawner.shared_spawner()
                if not replaceable:
                    for worker_id in range(num_workers):
                        self._spawn(worker_id)
            elif not rdv.agent_store:
                self._store, _ = serve_store(rdv.address(), rdv.master_port, rpc_timeout)
            self._client = store_client(self.rdv, rpc_timeout)
            self._start_agent()
            if self.rdv.dynamic:  # a death makes TensorPipe log each connection it had
                self._quiet.enter_context(worker.cpp_warnings_off())
            if self.rdv.dynamic and self.spawner is not None:  # the trainer's agent first: the workers join it
                membership.forget_arrivals()
                for worker_id in range(num_workers):
                    self._spawn(worker_id)
                self._await(set(range(num_workers)))
        except BaseException:
            self.close()
            raise

    def _spawn(self, worker_id: int) -> None:
        """Start a local process serving ``worker_id`` under rank ``self.ranks[worker_id]``."""
        rdv = self.rdv
        args = [self.ranks[worker_id], 0 if rdv.dynamic else rdv.world_size, rdv.master_port, self.rpc_timeout,
                self._generation, rdv.dynamic]
        if rdv.dynamic:
            self._joining.add(worker_id)
        pid = self.spawner.spawn(
            "rpc_collectors.worker:local_main", args, self.rpc_timeout, functools.partial(self._on_exit, worker_id)
        )
        self.pids[pid] = worker_id
        self.worker_pids[worker_id] = pid

    def _await(self, worker_ids: set[int]) -> None:
        """Wait until the servers of ``worker_ids`` joined the dynamic group; a death meanwhile raises."""
        waiting = {self.ranks[i]: i for i in worker_ids}
        deadline = time.monotonic() + self.rpc_timeout
        while waiting:
            dead = sorted(set(self._start_exits) & set(waiting.values()))
            if dead:
                reason = f"{self._start_exits.pop(dead[0])} during start-up, before it joined the trainer"
                raise WorkerError.from_info(dead[0], self.identity(dead[0]), reason)
            try:
                rank = membership.arrivals().get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                late = min(waiting.values())
                raise WorkerError.from_info(
                    late, self.identity(late), f"did not join the trainer within rpc_timeout={self.rpc_timeout} s"
                ) from None
            self._joining.discard(waiting.pop(rank, -1))

    def replace(self, worker_id: int) -> None:
        """Put a fresh local process in place of failed ``worker_id``, under a new rank; wait until it joined."""
        if self.spawner is None or not self.rdv.dynamic:
            raise RuntimeError("only a collector's own local workers can be replaced")
        pid = self.worker_pids.pop(worker_id, None)  # first: its exit, reported from another thread, is no failure
        if pid is not None:
            self.spawner.kill(pid)
        membership.evict(self._name(worker_id))
        self._start_exits.pop(worker_id, None)
        self.ranks[worker_id] = max(self.ranks) + 1
        membership.forget_arrivals()
        self._spawn(worker_id)
        self._await({worker_id})

    def _start_agent(self) -> None:
        """Start this process's RPC agent in a thread; raise a start-up death or Ctrl-C at once."""
        errors: list[BaseException] = []

        def start() -> None:
            try:
                worker.start_agent(worker.TRAINER, self.rdv, self.rpc_timeout)
            except BaseException as err:
                errors.append(err)
            finally:
                self._wake.set()

        with _starting:
            self._agent = threading.Thread(target=start, name="rpc-agent-start", daemon=True)
            self._agent.start()
            self._wake.wait()  # Ctrl-C interrupts this wait
            if errors and self.spawner is not None:  # a failed start may precede the exit report
                self._exited.wait(1.0)
            if self._start_exits:
                worker_id = min(self._start_exits)
                reason = f"{self._start_exits[worker_id]} during start-up, before the RPC rendezvous completed"
                raise WorkerError.from_info(worker_id, self.identity(worker_id), reason)
            self._agent.join()
            if errors:
                raise errors[0]
            self._rpc_up = True

    def identity(self, worker_id: int) -> dict:
        """What is known of ``worker_id`` before it answered: host, address and pid of a local worker."""
        pid = self.worker_pids.get(worker_id)
        rank = {"rank": self.ranks[worker_id]}
        return {**rank, "host": socket.gethostname(), "address": "127.0.0.1", "pid": pid} if pid else rank

    def kill(self, worker_id: int) -> None:
        """Kill a failed local worker at once (a remote one is left to :meth:`close`)."""
        pid = self.worker_pids.get(worker_id)
        if self.spawner is not None and pid is not None:
            self.spawner.kill(pid)

    def _name(self, worker_id: int) -> str:
        return worker.worker_name(self.ranks[worker_id], self.rdv.session)

    def serves(self, worker_id: int) -> bool:
        """Whether a server holds ``worker_id`` now (always, unless membership is elastic)."""
        return True

    def _server_names(self) -> list[str]:
        """Every server to stop at :meth:`close`."""
        return [self._name(i) for i in range(self.num_workers)]

    def _on_exit(self, worker_id: int, pid: int, code: int) -> None:
        self.pids.pop(pid, None)
        if self._closing or self.worker_pids.get(worker_id) != pid:  # expected: closing, or a replaced worker
            return
        if worker_id in self._joining:
            self._start_exits[worker_id] = describe_exit(code)
            membership.arrivals().put(-1)  # wakes _await
        elif not self._rpc_up:
            self._start_exits[worker_id] = describe_exit(code)
            self._exited.set()
            self._wake.set()
        self.on_death(worker_id, describe_exit(code))

    def call_async(self, worker_id: int, method: str, *args: Any, timeout: float | None = None) -> torch.futures.Future:
        return rpc.rpc_async(
            self._name(worker_id), worker.call, args=(method, *args),
            timeout=self.rpc_timeout if timeout is None else timeout,
        )

    def create(self, worker_id: int, spec: bytes, traj_id_start: int | None = None) -> torch.futures.Future:
        return rpc.rpc_async(
            self._name(worker_id), worker.create, args=(spec, worker_id, self.num_workers, traj_id_start),
            timeout=self.rpc_timeout,
        )

    def close(self, timeout: float = 2.0) -> None:
        """Stop every server within about ``timeout`` seconds, dead ones included.

        Each step is forgotten only once done, so a call interrupted by Ctrl-C leaves the rest
        to the next call.
        """
        self._closing = True
        if self._rpc_up:
            self._stop_servers(timeout)
            self._rpc_up = False
        if self.spawner is not None and self.pids:
            self.spawner.reap(list(self.pids), timeout)
        self.pids = {}
        self._client = self._store = None  # the store stops listening; a pending agent start fails
        if self._agent is not None:
            self._agent.join(timeout)  # the store is gone: a local start fails at once
            if rpc.api._is_current_rpc_agent_set():  # the start completed after all
                rpc.shutdown(graceful=False)
            self._agent = None
        self.spawner = None
        self._quiet.close()

    def _stop_servers(self, timeout: float) -> None:
        """Stop the servers, then this agent, then let them stop theirs (see ``worker.stop``)."""
        stops = []
        for name in self._server_names():
            try:
                stops.append(rpc.rpc_async(name, worker.stop, timeout=timeout))
            except RuntimeError:
                pass
        for fut in stops:
            try:
                fut.wait()
            except RuntimeError:
                pass
        with worker.cpp_warnings_off():
            rpc.shutdown(graceful=False)
        if self._client is not None:
            try:
                self._client.set(stopped_key(self.rdv), b"1")
            except RuntimeError:
                pass


class InProcessWorkers:
    """The debug launcher: every collector server lives in this process, called directly."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.states: dict[int, worker.WorkerState] = {}

    def _done(self, fn: Callable[[], Any]) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        try:
            fut.set_result(fn())
        except Exception:  # delivered through the future with its traceback, as over RPC
            fut.set_exception(RuntimeError(traceback.format_exc()))
        return fut

    def kill(self, worker_id: int) -> None:
        """Nothing to kill: the workers live in this process."""

    def serves(self, worker_id: int) -> bool:
        return True

    def replace(self, worker_id: int) -> None:
        """Drop ``worker_id``'s collector (its env may be broken); :meth:`create` builds a fresh one."""
        state = self.states.pop(worker_id, None)
        if state is not None:
            with contextlib.suppress(Exception):
                state.close()

    def identity(self, worker_id: int) -> dict:
        return {"host": f"{socket.gethostname()}, in the trainer process (debug launcher)", "pid": os.getpid()}

    def call_async(self, worker_id: int, method: str, *args: Any, timeout: float | None = None) -> torch.futures.Future:
        return self._done(lambda: getattr(self.states[worker_id], method)(*args))

    def create(self, worker_id: int, spec: bytes, traj_id_start: int | None = None) -> torch.futures.Future:
        def build() -> dict:
            self.states[worker_id] = worker.WorkerState(spec, worker_id, self.num_workers, worker_id + 1, traj_id_start)
            return self.states[worker_id].info()

        return self._done(build)

    def close(self, timeout: float = 2.0) -> None:
        for state in self.states.values():
            state.close()
        self.states.clear()


def rpc_api_generation() -> int:
    """How many RPC agents this process started before: ``init_rpc`` prefixes its store keys with it.

    Local workers are fresh processes; they must use the trainer's prefix to meet it.
    """
    return rpc._init_counter


