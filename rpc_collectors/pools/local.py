"""Worker processes on the trainer's host, started by the spawner and driven over pipes.

No RPC agent and no port: each worker is called through its
:class:`~rpc_collectors.worker.channel.Channel`, so any number of collectors can run local workers
in one process. The spawner reports each exit at once; a worker that dies fails the calls it had in
flight with its exit status.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
import time
from typing import Any

import torch

from rpc_collectors.core.futures import outcome
from rpc_collectors.core.protocol import CREATE, KILL_WAIT
from rpc_collectors.pools.pool import OnDeath, WorkerPool, traceback_failure
from rpc_collectors.single_process.step_count import SharedCounts
from rpc_collectors.transport.rendezvous import Rendezvous, serve_store
from rpc_collectors.transport.shm import SharedBytes
from rpc_collectors.worker import spawner
from rpc_collectors.worker.channel import EXIT_WAIT, Channel, ChannelClosed

# seconds for a worker to end its batch, close its envs and exit once its channel closes (as
CLOSE_WAIT = 10.0
# TorchRL's shutdown: an env such as a ParallelEnv takes seconds to close its own processes)
# bytes: a larger spec is read by the workers from one shared-memory file, not sent down each pipe
SHARE_SPEC = 1 << 20
# a node reaps its own local workers first
NODE_CLOSE_WAIT = CLOSE_WAIT + KILL_WAIT + 0.5


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"died with exit code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"exited with code {code}"


@dataclasses.dataclass
class _SharedSpec:
    spec: bytes
    shared: SharedBytes
    fd: int
    # create calls not answered yet
    readers: int = 0


class LocalPool(WorkerPool):
    """``num_workers`` processes on this host; worker i runs as rank i + 1.

    Start-up is bounded by ``rpc_timeout`` and interruptible: it waits for every worker's hello,
    a worker's exit (reported by the spawner at once) or Ctrl-C. :meth:`close` is idempotent
    and, when interrupted, a second call finishes it.
    """

    replaceable = True

    def __init__(
        self, num_workers: int, rpc_timeout: float, on_death: OnDeath, port: int | None = None,
        nodes: bool = False,
    ) -> None:
        self.num_workers, self.rpc_timeout, self.on_death = num_workers, rpc_timeout, on_death
        # how long close() waits for the processes to exit: a node first
        # closes its own local workers
        self.close_wait = NODE_CLOSE_WAIT if nodes else CLOSE_WAIT
        # of the weight group's store (None: a free one)
        self.port = port
        self.spawner = spawner.shared_spawner()
        self.channels: dict[int, Channel] = {}
        # local worker pid -> worker id, until reaped
        self.pids: dict[int, int] = {}
        # worker id -> pid of the process serving it now
        self.worker_pids: dict[int, int] = {}
        self._closing = False
        # served on first use: the weight process group meets there
        self._store: Any = None
        # a hello or an exit during start-up
        self._changed = threading.Condition()
        # id(spec) -> the spec's shared-memory file, while workers read it
        self._shared: dict[int, _SharedSpec] = {}
        self._shared_lock = threading.Lock()
        # worker id -> exit reason, before it said hello
        self._start_exits: dict[int, str] = {}
        # worker ids whose current process said hello
        self._joined: set[int] = set()
        # what each worker's process stepped (not a node's: its local workers count their own);
        # once closed, their last values
        self.counts: SharedCounts | None = None if nodes else SharedCounts(num_workers)
        self._final: list[int] | None = None
        try:
            for worker_id in range(num_workers):
                self._spawn(worker_id)
            self._await(set(range(num_workers)))
        except BaseException:
            self.close()
            raise

    def _spawn(self, worker_id: int) -> None:
        bell = self.channels[worker_id] = Channel()
        bell.hello.add_done_callback(lambda _f: self._notify())
        pid = self.spawner.spawn(
            "rpc_collectors.worker.local_worker:local_main",
            [worker_id + 1, self.counts and self.counts.ends(worker_id),
             *dataclasses.astuple(bell.ends)],
            self.rpc_timeout, lambda pid, code, i=worker_id: self._on_exit(i, pid, code),
        )
        self.pids[pid] = worker_id
        self.worker_pids[worker_id] = pid

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _await(self, worker_ids: set[int]) -> None:
        """Wait until ``worker_ids`` said hello; an exit meanwhile raises its WorkerError."""
        deadline = time.monotonic() + self.rpc_timeout
        waiting = set(worker_ids)
        with self._changed:
            while waiting:
                dead = sorted(set(self._start_exits) & waiting)
                if dead:
                    reason = (f"{self._start_exits.pop(dead[0])} during start-up, before it "
                              "joined the trainer")
                    raise self.error(dead[0], reason)
                for worker_id in [i for i in waiting if self.channels[i].hello.done()]:
                    try:
                        # raises if it failed
                        outcome(self.channels[worker_id].hello)
                    except ChannelClosed:
                        # its pipe ended before the spawner reported the exit
                        self._changed.wait_for(lambda i=worker_id: i in self._start_exits,
                                               EXIT_WAIT)
                        reason = self._start_exits.pop(worker_id, "closed its channel")
                        reason = f"{reason} during start-up, before it joined the trainer"
                        raise self.error(worker_id, reason) from None
                    self.channels[worker_id].opened()
                    self._joined.add(worker_id)
                    waiting.discard(worker_id)
                remaining = deadline - time.monotonic()
                if waiting and remaining <= 0:
                    late = min(waiting)
                    raise self.error(late,
                                     "did not join the trainer within "
                                     f"rpc_timeout={self.rpc_timeout} s")
                if waiting:
                    # Ctrl-C interrupts this wait
                    self._changed.wait(remaining)

    def _on_exit(self, worker_id: int, pid: int, code: int) -> None:
        self.pids.pop(pid, None)
        # a replaced worker: its exit is no failure (replace() waits for it)
        if self.worker_pids.get(worker_id) != pid:
            self._notify()
            return
        reason = describe_exit(code)
        # first: a failure its calls raise finds the death reported
        if not self._closing:
            self.on_death(worker_id, reason)
        with self._changed:
            # before the hello: _await reports it
            if worker_id not in self._joined:
                self._start_exits[worker_id] = reason
            self.channels[worker_id].exited(reason)
            self._changed.notify_all()

    def create(self, worker_id: int, spec: bytes,
               traj_id_start: int | None = None) -> torch.futures.Future:
        """Build worker ``worker_id``'s collector from ``spec``; a large spec (a policy of many
        weights) is written once to shared memory for every worker given it, not to each pipe."""
        sent = self._share(spec) if len(spec) >= SHARE_SPEC else spec
        fut = self.channels[worker_id].call(CREATE, sent, worker_id, self.num_workers,
                                            traj_id_start)
        if sent is not spec:
            fut.add_done_callback(lambda _: self._unshare(spec))
        return fut

    def _share(self, spec: bytes) -> SharedBytes:
        with self._shared_lock:
            entry = self._shared.get(id(spec))
            if entry is None or entry.spec is not spec:
                shared, fd = SharedBytes.of(spec,
                                            "a worker's spec (its env factory, policy and options)",
                                            "pass a smaller policy (or a policy_factory)")
                entry = self._shared[id(spec)] = _SharedSpec(spec, shared, fd)
            entry.readers += 1
            return entry.shared

    def _unshare(self, spec: bytes) -> None:
        """A worker given ``spec`` answered: the file goes once no worker is left to read it."""
        with self._shared_lock:
            entry = self._shared.get(id(spec))
            if entry is not None and entry.spec is spec:
                entry.readers -= 1
                if entry.readers == 0:
                    os.close(entry.fd)
                    del self._shared[id(spec)]

    def call(self, worker_id: int, method: str, *args: Any) -> torch.futures.Future:
        return self.channels[worker_id].call(method, *args)

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        """A traceback: it raised. Otherwise its pipes closed: its exit status follows at once."""
        raised = traceback_failure(err)
        if raised is not None:
            return raised
        exit_reason = self.channels[worker_id].exit_reason()
        return (exit_reason or f"is unreachable: {err}"), ""

    def replace(self, worker_id: int) -> int | None:
        """Put a fresh process in place of failed ``worker_id``; wait until it said hello.
        Returns the frames the old process stepped (None: a node's, whose local workers count
        theirs)."""
        # first: its exit, reported from another thread, is no failure
        pid = self.worker_pids.pop(worker_id, None)
        if pid is not None:
            self.spawner.kill(pid)
        with self._changed:
            # its last step counted
            self._changed.wait_for(lambda: pid not in self.pids, EXIT_WAIT)
        stepped = None if self.counts is None else self.counts.restart(worker_id)
        self.channels.pop(worker_id).close()
        self._start_exits.pop(worker_id, None)
        self._joined.discard(worker_id)
        self._spawn(worker_id)
        self._await({worker_id})
        return stepped

    def stepped(self, worker_id: int) -> int | None:
        """Frames the process serving ``worker_id`` stepped so far; once closed, in all."""
        if self._final is not None:
            return self._final[worker_id]
        return None if self.counts is None else self.counts.value(worker_id)

    def kill(self, worker_id: int) -> None:
        pid = self.worker_pids.get(worker_id)
        if pid is not None:
            self.spawner.kill(pid)

    def identity(self, worker_id: int) -> dict:
        pid = self.worker_pids.get(worker_id)
        return {"rank": worker_id + 1, "host": socket.gethostname(), "address": "127.0.0.1",
                "pid": pid}

    def weight_rendezvous(self) -> Rendezvous:
        """Where the weight process group meets (``weight_transport="broadcast"``): a store on
        loopback, at ``tcp_port`` when given."""
        if self._store is None:
            self._store, port = serve_store("127.0.0.1", self.port or 0, self.rpc_timeout,
                                            argument="tcp_port")
            self.rdv = Rendezvous("local", 0, self.num_workers + 1, "127.0.0.1", port, "lo")
        return self.rdv

    def close(self, timeout: float | None = None) -> None:
        """Close every channel (each worker ends its batch in progress, closes its collector and
        exits), then reap the processes within ``timeout`` seconds (default ``close_wait``), killing
        those still there.
        Each step is forgotten only once done, so a call interrupted by Ctrl-C leaves the
        rest to the next call."""
        self._closing = True
        for bell in self.channels.values():
            bell.close()
        # specs of create calls that will never be answered
        with self._shared_lock:
            for entry in self._shared.values():
                os.close(entry.fd)
            self._shared.clear()
        if self.pids:
            self.spawner.reap(list(self.pids), self.close_wait if timeout is None else timeout)
        self.pids = {}
        if self.counts is not None:
            self._final, self.counts = self.counts.close(), None
        self._store = None
