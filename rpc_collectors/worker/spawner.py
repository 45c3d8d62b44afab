"""Fast, leak-free start of local worker processes.

A spawner is a helper process, forked from the trainer (or started fresh where a fork could not
run CUDA or RPC: a CUDA build of torch, an RPC agent in this process), that has torch, tensordict
and gymnasium imported and forks one worker per request: eight workers start in well under a
second instead of each paying the imports.
Unlike ``multiprocessing``'s spawn and forkserver, it never re-imports the user's
``__main__``, so scripts need no ``if __name__ == "__main__"`` guard.

Protocol over two pipes (JSON lines): the parent writes ``{"id": R, "target":
"module:function", "args": [...]}`` and reads back ``{"id": R, "pid": N}``; whenever a child
exits the spawner writes ``{"exit": N, "code": C}``. A reply to a request the parent gave up
on (a timeout, Ctrl-C) is never handed to a later request: its child is killed. When the
parent goes away (its end of the requests pipe closes), the spawner kills its children and
exits; each child also dies with the spawner (``PR_SET_PDEATHSIG``). The spawner keeps none
of the parent's descriptors (sockets, files) but its two pipes and the standard streams, and
calls itself ``rpc-spawner`` in ``ps``/``top``.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from typing import Callable, NoReturn

import torch

from rpc_collectors.core.protocol import KILL_WAIT

PRELOAD = ("torch", "tensordict", "gymnasium", "numpy", "cloudpickle",
           "rpc_collectors.worker.local_worker")
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
SPAWNER_NAME = "rpc-spawner"


def _prctl(option: int, arg: object) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg)
    except (OSError, AttributeError):
        # not Linux: the stdin EOF path still cleans up
        pass


def _die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def name_process(name: str) -> None:
    """Show this process as ``name`` (at most 15 bytes) in ``ps -o comm``, top, /proc/<pid>/comm."""
    _prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))


def drop_inherited_fds(keep: tuple[int, ...]) -> None:
    """Let go of every descriptor this process inherited but the standard streams and ``keep``.

    They are pointed at /dev/null rather than closed: Python objects of the parent (a logging
    handler, a test runner's capture file) may still write to their numbers, which must not
    come to name a socket this process opens later. ``sys.stdout``/``sys.stderr`` are
    rebound to descriptors 1 and 2.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        # no /proc: the usual range
        fds = list(range(3, 1024))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd > 2 and fd != devnull and fd not in keep:
            try:
                os.dup2(devnull, fd)
            except OSError:
                # not open (any more)
                pass
    os.close(devnull)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            same = stream.fileno() == fd
        except (AttributeError, OSError, ValueError):
            same = False
        if not same:
            setattr(sys, name, open(fd, "w", buffering=1, closefd=False))


class Spawner:
    """Parent-side handle of a spawner process.

    Args:
        fresh_interpreter: start the spawner with a new interpreter instead of forking this
            process (needed where a fork could not run CUDA or RPC).
    """

    def __init__(self, fresh_interpreter: bool) -> None:
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        if fresh_interpreter:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-c",
                 "from rpc_collectors.worker.spawner import run_spawner; "
                 f"run_spawner({requests_r}, {replies_w})"],
                pass_fds=(requests_r, replies_w),
            )
            self.pid = self.proc.pid
        else:
            # fork this process: torch and friends are already imported, start-up is instant
            self.proc = None
            self.pid = os.fork()
            if self.pid == 0:
                try:
                    # the parent's file objects came with the fork: not this process's to close
                    warnings.simplefilter("ignore", ResourceWarning)
                    drop_inherited_fds((requests_r, replies_w))
                    run_spawner(requests_r, replies_w)
                finally:
                    os._exit(0)
        os.close(requests_r)
        os.close(replies_w)
        self.requests = os.fdopen(requests_w, "w", buffering=1)
        self.replies = os.fdopen(replies_r, "r")
        # _requests: ids of requests sent so far; _replies: request id -> pid, until spawn() takes
        # it; _abandoned: ids of requests whose spawn() gave up waiting; _live: pid -> on_exit;
        # _early: pid -> exit code of a child that exited before spawn() returned
        self._requests = 0
        self._replies: dict[int, int] = {}
        self._abandoned: set[int] = set()
        self._live: dict[int, Callable[[int, int], None]] = {}
        self._early: dict[int, int] = {}
        self._exited = False
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="spawner-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return not self._exited

    def _read(self) -> None:
        for line in self.replies:
            msg = json.loads(line)
            with self._cond:
                if "pid" in msg:
                    if msg["id"] in self._abandoned:
                        self._abandoned.discard(msg["id"])
                        # nobody waits for it: its exit is reported and ignored
                        _kill(msg["pid"])
                    else:
                        self._replies[msg["id"]] = msg["pid"]
                    on_exit = None
                else:
                    on_exit = self._live.pop(msg["exit"], None)
                    if on_exit is None and msg["exit"] in self._replies.values():
                        self._early[msg["exit"]] = msg["code"]
                self._cond.notify_all()
            if on_exit is not None:
                on_exit(msg["exit"], msg["code"])
        with self._cond:
            self._exited = True
            self._cond.notify_all()

    def spawn(self, target: str, args: list, timeout: float,
              on_exit: Callable[[int, int], None]) -> int:
        """Fork a child running ``target(*args)`` (``"module:function"``); return its pid.

        ``on_exit(pid, exit_code)`` is called from a thread when the child exits.
        """
        with self._cond:
            self._requests += 1
            request = self._requests
            self.requests.write(json.dumps({"id": request, "target": target, "args": args}) + "\n")
            try:
                if not self._cond.wait_for(
                        lambda: request in self._replies or self._exited, timeout):
                    raise TimeoutError("the worker spawner did not start a process within "
                                       f"{timeout} s")
                if request not in self._replies:
                    raise RuntimeError("the worker spawner exited")
                pid = self._replies[request]
                code = self._early.pop(pid, None)
                if code is None:
                    self._live[pid] = on_exit
                del self._replies[request]
            except BaseException:
                # a timeout or Ctrl-C: the child is killed, now or when it comes
                pid = self._replies.pop(request, None)
                if pid is None:
                    self._abandoned.add(request)
                else:
                    self._live.pop(pid, None)
                    _kill(pid)
                raise
        if code is not None:
            on_exit(pid, code)
        return pid

    def kill(self, pid: int) -> None:
        """Kill child ``pid`` if it still runs (a pid that exited may name
        another process by now)."""
        with self._cond:
            if pid in self._live:
                _kill(pid)

    def reap(self, pids: list[int], timeout: float, kill_wait: float = KILL_WAIT) -> None:
        """Wait up to ``timeout`` for ``pids`` to exit, then kill the rest and wait up to
        ``kill_wait`` for their exits; never raises: those that had to be killed are named
        in a warning (those whose exit is still not reported are reaped by the spawner
        when it gets to them)."""
        with self._cond:
            def gone() -> bool:
                return self._exited or not set(pids) & set(self._live)

            self._cond.wait_for(gone, timeout)
            slow = sorted(set(pids) & set(self._live))
            for pid in slow:
                # killed on purpose: not a failure
                self._live[pid] = lambda *_: None
                _kill(pid)
            reported = self._cond.wait_for(gone, kill_wait)
        if slow:
            late = ("" if reported
                    else f", and their exits were not reported within {kill_wait} s more")
            warnings.warn(f"worker processes {slow} did not exit within {timeout} s of shutdown; "
                          f"they were killed (SIGKILL){late}", RuntimeWarning, stacklevel=2)

    def close(self, timeout: float = 5.0) -> None:
        """Kill every child and the spawner (closing its requests tells it to); reap it."""
        try:
            self.requests.close()
        except OSError:
            pass
        self._reader.join(timeout)
        # the spawner did not finish in time
        if self._reader.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout)
        else:
            os.waitpid(self.pid, 0)
        self.replies.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_shared: Spawner | None = None
# False once this process started an RPC agent: forks would inherit it
_forked_safely = True


def shared_spawner() -> Spawner:
    """This process's spawner, started on first use and kept for later collectors."""
    global _shared
    if _shared is None or not _shared.alive:
        _shared = Spawner(fresh_interpreter=_fork_unsafe())
    return _shared


def _fork_unsafe() -> bool:
    """Whether a fork of this process could not run CUDA or RPC. With a CUDA build, any device query
    (``torch.cuda.is_available()``, which the trainer's checks make) marks later forks unable to use
    CUDA, and no API tells whether one was made: such a build starts the spawner fresh."""
    return torch.backends.cuda.is_built() or torch.cuda.is_initialized() or not _forked_safely


def shared_pid() -> int | None:
    """The pid of this process's spawner, if one runs (it outlives collectors, not workers)."""
    return _shared.pid if _shared is not None and _shared.alive else None


def rpc_starts_here(fork_now: bool = True) -> None:
    """Note that this process starts an RPC agent: from now on the spawner cannot be forked from it.

    ``fork_now``: fork the spawner before the agent starts; otherwise one needed later (a node
    collector's local workers, on a collector server) starts a fresh interpreter.
    """
    global _forked_safely
    if fork_now:
        shared_spawner()
    _forked_safely = False


@atexit.register
def _close_shared() -> None:
    if _shared is not None:
        _shared.close()


def run_spawner(requests_fd: int, replies_fd: int) -> NoReturn:
    """The spawner process: fork a child per request line until the requests pipe closes, then kill
    and reap its children and leave by ``os._exit``: tearing torch down (0.6 s of CPU, seconds on a
    loaded host), which its parent would wait for, cleans up nothing a spawner holds.

    Child exits arrive as SIGCHLD through a wake-up pipe and are reaped in the main loop, so
    replies are only ever written from one place.
    """
    name_process(SPAWNER_NAME)
    for name in PRELOAD:
        importlib.import_module(name)
    out = os.fdopen(replies_fd, "w", buffering=1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    # a handler, so the wake-up byte is written
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # Ctrl-C is the trainer's to handle; it stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a requeueable SLURM job signals every process before it stops
    if "RPC_COLLECTORS_REQUEUE" in os.environ:
        # the trainer handles it, and stops us (cluster/requeue.py)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([requests_fd, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children, out)
        if requests_fd not in ready:
            continue
        chunk = os.read(requests_fd, 65536)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = _fork_child(request, (requests_fd, replies_fd, wake_r, wake_w))
            children.add(pid)
            out.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
    signal.set_wakeup_fd(-1)
    for pid in children:
        _kill(pid)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    for stream in (out, sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def _reap(children: set[int], out: "object") -> None:
    """Collect every exited child and report it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        out.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")


def _fork_child(request: dict, spawner_fds: tuple[int, ...]) -> int:
    """Fork a child that runs ``request["target"](*request["args"])`` and exits with its result."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _die_with_parent()
        for fd in spawner_fds:
            os.close(fd)
        module, func = request["target"].split(":")
        code = getattr(importlib.import_module(module), func)(*request["args"]) or 0
    except BaseException:
        # report and exit: the child must never return into the spawner's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
