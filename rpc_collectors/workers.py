"""Handles on collector servers, as the trainer sees them: start, call, stop.

:class:`RPCWorkers` reaches servers over ``torch.distributed.rpc`` (local worker processes it
starts itself, or the other ranks of a torchrun/SLURM run); :class:`InProcessWorkers` runs
the same server code in the trainer's process (the debug launcher). Both return
``torch.futures.Future`` objects and report deaths through ``on_death(worker_id, reason)``.
"""
from __future__ import annotations

import signal
from typing import Any, Callable

import torch
import torch.distributed.rpc as rpc

from . import spawner, worker
from .rendezvous import Rendezvous, interface_address, serve_store
from .spawner import Spawner

OnDeath = Callable[[int, str], None]


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"died with exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


class RPCWorkers:
    """Collector servers on ranks 1..N of an RPC world where this process is rank 0."""

    def __init__(self, rdv: Rendezvous | None, num_workers: int, rpc_timeout: float, on_death: OnDeath) -> None:
        """``rdv=None`` starts ``num_workers`` local processes; otherwise join a torchrun/SLURM world."""
        if rpc.api._is_current_rpc_agent_set():
            raise RuntimeError(
                "this process already runs an RPC agent (another RPCCollector?); shut it down first: "
                "one RPCCollector per process"
            )
        self.num_workers, self.rpc_timeout, self.on_death = num_workers, rpc_timeout, on_death
        self.spawner: Spawner | None = None
        self.pids: dict[int, int] = {}  # local worker pid -> worker id
        self._store = None
        self._rpc_up = False
        spawner.rpc_starts_here()
        try:
            if rdv is None:
                self._store, port = serve_store("127.0.0.1", 0, rpc_timeout)
                rdv = Rendezvous("local", 0, num_workers + 1, "127.0.0.1", port, "lo", session=str(port))
                self.spawner = spawner.shared_spawner()
                for rank in range(1, num_workers + 1):
                    pid = self.spawner.spawn(
                        "rpc_collectors.worker:local_main",
                        [rank, num_workers + 1, port, rpc_timeout, rpc_api_generation()], rpc_timeout, self._on_exit,
                    )
                    self.pids[pid] = rank - 1
            elif not rdv.agent_store:
                host = interface_address(rdv.interface) if rdv.interface else rdv.master_addr
                self._store, _ = serve_store(host, rdv.master_port, rpc_timeout)
            self.rdv = rdv
            worker.start_agent(worker.TRAINER, rdv, rpc_timeout)
        except BaseException:
            self.close()
            raise
        self._rpc_up = True

    def _name(self, worker_id: int) -> str:
        return worker.worker_name(worker_id + 1, self.rdv.session)

    def _on_exit(self, pid: int, code: int) -> None:
        worker_id = self.pids.pop(pid, None)
        if worker_id is not None:
            self.on_death(worker_id, describe_exit(code))

    def call_async(self, worker_id: int, method: str, *args: Any, timeout: float | None = None) -> torch.futures.Future:
        return rpc.rpc_async(
            self._name(worker_id), worker.call, args=(method, *args),
            timeout=self.rpc_timeout if timeout is None else timeout,
        )

    def create(self, worker_id: int, spec: bytes) -> torch.futures.Future:
        return rpc.rpc_async(self._name(worker_id), worker.create, args=(spec, worker_id, self.num_workers))

    def close(self, timeout: float = 2.0) -> None:
        """Stop every server within about ``timeout`` seconds, dead ones included."""
        pids, self.pids = list(self.pids), {}  # exits from here on are expected, not failures
        if self._rpc_up:
            self._rpc_up = False
            stops = []
            for worker_id in range(self.num_workers):
                try:
                    stops.append(rpc.rpc_async(self._name(worker_id), worker.stop, timeout=timeout))
                except RuntimeError:
                    pass
            for fut in stops:
                try:
                    fut.wait()
                except RuntimeError:
                    pass
            rpc.shutdown(graceful=False)
        if self.spawner is not None:
            self.spawner.reap(pids, timeout)
            self.spawner = None
        self._store = None


class InProcessWorkers:
    """The debug launcher: every collector server lives in this process, called directly."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.states: dict[int, worker.WorkerState] = {}

    def _done(self, fn: Callable[[], Any]) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        try:
            fut.set_result(fn())
        except Exception as err:  # delivered through the future, as over RPC
            fut.set_exception(err)
        return fut

    def call_async(self, worker_id: int, method: str, *args: Any, timeout: float | None = None) -> torch.futures.Future:
        return self._done(lambda: getattr(self.states[worker_id], method)(*args))

    def create(self, worker_id: int, spec: bytes) -> torch.futures.Future:
        def build() -> dict:
            self.states[worker_id] = worker.WorkerState(spec, worker_id, self.num_workers, worker_id + 1)
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

