"""The other ranks of a torchrun/SLURM world, each serving one collector over
``torch.distributed.rpc``.

This process (rank 0) starts its RPC agent; every other rank runs the same script, whose
collector constructor serves a collector until the trainer stops it
(:func:`rpc_collectors.worker.rpc_rank.serve_rank`). An RPC agent belongs to its process, so one
such pool can live in a process at a time.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from rpc_collectors.pools.pool import WorkerPool, traceback_failure
from rpc_collectors.transport.rendezvous import Rendezvous, serve_store, stopped_key, store_client
from rpc_collectors.worker import cpp_log, rpc_rank, spawner

# torch's message for an RPC past its timeout
RPC_TIMED_OUT = "ran for more than set timeout"
# held while an RPC agent of this process starts
_starting = threading.Lock()


class RankPool(WorkerPool):
    """Collector servers on ranks 1..N of the RPC world of ``rdv``, where this process is rank 0.

    Start-up is interruptible and bounded: the RPC agent starts in a thread while this one
    waits for it or for Ctrl-C. :meth:`close` is idempotent and, when interrupted, a second
    call finishes it.
    """

    # what sets the rendezvous port, for the error when it is taken
    port_argument = "MASTER_PORT"

    def __init__(self, rdv: Rendezvous, num_workers: int, rpc_timeout: float) -> None:
        if rpc.api._is_current_rpc_agent_set() or _starting.locked():
            raise RuntimeError(
                "this process already runs an RPC agent (another torchrun/SLURM RPCCollector?); "
                "shut it down first: one collector over torchrun/SLURM ranks per process "
                "(collectors with local workers can run beside it)"
            )
        self.rdv, self.num_workers, self.rpc_timeout = rdv, num_workers, rpc_timeout
        # worker id -> rank of the process serving it now
        self.ranks: list[Any] = list(range(1, num_workers + 1))
        # served here: closing it ends every wait on it
        self._store: dist.TCPStore | None = None
        self._client: dist.TCPStore | None = None
        self._agent: threading.Thread | None = None
        self._rpc_up = False
        # drops torch's C++ warnings while members may die (dynamic groups)
        self._quiet = contextlib.ExitStack()
        # init_rpc prefixes its store keys with it; joiners must match
        self._generation = rpc._init_counter
        spawner.rpc_starts_here()
        try:
            if not rdv.agent_store:
                self._store, _ = serve_store(rdv.address(), rdv.master_port, rpc_timeout,
                                             self.port_argument)
            self._client = store_client(rdv, rpc_timeout)
            self._start_agent()
            # a death makes TensorPipe log each connection it had
            if rdv.dynamic:
                self._quiet.enter_context(cpp_log.warnings_off())
        except BaseException:
            self.close()
            raise

    def _start_agent(self) -> None:
        """Start this process's RPC agent in a thread; Ctrl-C interrupts the wait for it."""
        errors: list[BaseException] = []
        done = threading.Event()

        def start() -> None:
            try:
                rpc_rank.start_agent(rpc_rank.TRAINER, self.rdv, self.rpc_timeout)
            except BaseException as err:
                errors.append(err)
            finally:
                done.set()

        with _starting:
            self._agent = threading.Thread(target=start, name="rpc-agent-start", daemon=True)
            self._agent.start()
            done.wait()
            self._agent.join()
            if errors:
                raise errors[0]
            self._rpc_up = True

    def _name(self, worker_id: int) -> str:
        return rpc_rank.worker_name(self.ranks[worker_id], self.rdv.session)

    def identity(self, worker_id: int) -> dict:
        return {"rank": self.ranks[worker_id]}

    def create(self, worker_id: int, spec: bytes,
               traj_id_start: int | None = None) -> torch.futures.Future:
        return rpc.rpc_async(
            self._name(worker_id), rpc_rank.create,
            args=(spec, worker_id, self.num_workers, traj_id_start), timeout=self.rpc_timeout,
        )

    def call(self, worker_id: int, method: str, *args: Any) -> torch.futures.Future:
        return rpc.rpc_async(self._name(worker_id), rpc_rank.call, args=(method, *args),
                             timeout=self.rpc_timeout)

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        raised = traceback_failure(err)
        if raised is not None:
            return raised
        text = str(err)
        if RPC_TIMED_OUT in text:
            return f"did not answer within rpc_timeout={self.rpc_timeout} s", ""
        return f"is unreachable: {text.splitlines()[0] if text else type(err).__name__}", ""

    def _server_names(self) -> list[str]:
        """Every server to stop at :meth:`close`."""
        return [self._name(i) for i in range(self.num_workers)]

    def close(self, timeout: float = 2.0) -> None:
        """Stop every server within about ``timeout`` seconds, dead ones included.

        Each step is forgotten only once done, so a call interrupted by Ctrl-C leaves the rest
        to the next call.
        """
        if self._rpc_up:
            self._stop_servers(timeout)
            self._rpc_up = False
        # the store stops listening; a pending agent start fails
        self._client = self._store = None
        if self._agent is not None:
            self._agent.join(timeout)
            # the start completed after all
            if rpc.api._is_current_rpc_agent_set():
                rpc.shutdown(graceful=False)
            self._agent = None
        self._quiet.close()

    def _stop_servers(self, timeout: float) -> None:
        """Stop the servers, then this agent, then let them stop theirs (see ``rpc_rank.stop``)."""
        stops = []
        for name in self._server_names():
            try:
                stops.append(rpc.rpc_async(name, rpc_rank.stop, timeout=timeout))
            except RuntimeError:
                pass
        for fut in stops:
            try:
                fut.wait()
            except RuntimeError:
                pass
        with cpp_log.warnings_off():
            rpc.shutdown(graceful=False)
        if self._client is not None:
            try:
                self._client.set(stopped_key(self.rdv), b"1")
            except RuntimeError:
                pass
