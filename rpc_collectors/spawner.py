"""Fast, leak-free start of local worker processes.

A spawner is a helper process, forked from the trainer (or, once CUDA is initialised there,
started fresh), that has torch, tensordict and gymnasium imported and forks one worker per
request: eight workers start in well under a second instead of each paying the imports.
Unlike ``multiprocessing``'s spawn and forkserver, it never re-imports the user's
``__main__``, so scripts need no ``if __name__ == "__main__"`` guard.

Protocol over two pipes (JSON lines): the parent writes ``{"target": "module:function",
"args": [...]}`` and reads back ``{"pid": N}``; whenever a child exits the spawner writes
``{"exit": N, "code": C}``. When the parent goes away (its end of the requests pipe closes),
the spawner kills its children and exits; each child also dies with the spawner
(``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import atexit
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
from typing import Callable

import torch

PRELOAD = ("torch", "tensordict", "gymnasium", "numpy", "cloudpickle", "rpc_collectors.worker")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the stdin EOF path still cleans up
        pass


class Spawner:
    """Parent-side handle of a spawner process.

    Args:
        fresh_interpreter: start the spawner with a new interpreter instead of forking this
            process (needed once CUDA or an RPC agent was initialised here).
    """

    def __init__(self, fresh_interpreter: bool) -> None:
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        if fresh_interpreter:
            self.proc: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-c", f"from rpc_collectors.spawner import serve; serve({requests_r}, {replies_w})"],
                pass_fds=(requests_r, replies_w),
            )
            self.pid = self.proc.pid
        else:  # fork this process: torch and friends are already imported, start-up is instant
            self.proc = None
            self.pid = os.fork()
            if self.pid == 0:
                try:
                    os.close(requests_w)
                    os.close(replies_r)
                    serve(requests_r, replies_w)
                finally:
                    os._exit(0)
        os.close(requests_r)
        os.close(replies_w)
        self.requests = os.fdopen(requests_w, "w", buffering=1)
        self.replies = os.fdopen(replies_r, "r")
        self._replies: "list[int]" = []
        self._live: dict[int, Callable[[int, int], None]] = {}  # pid -> on_exit
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
                    self._replies.append(msg["pid"])
                    on_exit = None
                else:
                    on_exit = self._live.pop(msg["exit"], None)
                self._cond.notify_all()
            if on_exit is not None:
                on_exit(msg["exit"], msg["code"])
        with self._cond:
            self._exited = True
            self._cond.notify_all()

    def spawn(self, target: str, args: list, timeout: float, on_exit: Callable[[int, int], None]) -> int:
        """Fork a child running ``target(*args)`` (``"module:function"``); return its pid.

        ``on_exit(pid, exit_code)`` is called from a thread when the child exits.
        """
        with self._cond:
            self.requests.write(json.dumps({"target": target, "args": args}) + "\n")
            if not self._cond.wait_for(lambda: self._replies or self._exited, timeout):
                raise TimeoutError(f"the worker spawner did not start a process within {timeout} s")
            if not self._replies:
                raise RuntimeError("the worker spawner exited")
            pid = self._replies.pop(0)
            self._live[pid] = on_exit
            return pid

    def reap(self, pids: list[int], timeout: float) -> None:
        """Wait up to ``timeout`` for ``pids`` to exit, then kill the rest and wait for them."""
        with self._cond:
            self._cond.wait_for(lambda: self._exited or not set(pids) & set(self._live), timeout)
            for pid in set(pids) & set(self._live):
                self._live[pid] = lambda *_: None  # killed on purpose: not a failure
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not self._cond.wait_for(lambda: self._exited or not set(pids) & set(self._live), timeout):
                raise TimeoutError(f"worker processes {sorted(set(pids) & set(self._live))} did not exit")

    def close(self, timeout: float = 5.0) -> None:
        """Kill every child and the spawner (closing its requests tells it to); reap it."""
        try:
            self.requests.close()
        except OSError:
            pass
        self._reader.join(timeout)
        if self._reader.is_alive():  # the spawner did not finish in time
            os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout)
        else:
            os.waitpid(self.pid, 0)
        self.replies.close()


_shared: Spawner | None = None
_forked_safely = True  # False once this process started an RPC agent: forks would inherit it


def shared_spawner() -> Spawner:
    """This process's spawner, started on first use and kept for later collectors."""
    global _shared
    if _shared is None or not _shared.alive:
        _shared = Spawner(fresh_interpreter=torch.cuda.is_initialized() or not _forked_safely)
    return _shared


def shared_pid() -> int | None:
    """The pid of this process's spawner, if one runs (it outlives collectors, not workers)."""
    return _shared.pid if _shared is not None and _shared.alive else None


def rpc_starts_here() -> None:
    """Note that this process starts an RPC agent: from now on the spawner cannot be forked from it."""
    global _forked_safely
    shared_spawner()
    _forked_safely = False


@atexit.register
def _close_shared() -> None:
    if _shared is not None:
        _shared.close()


def serve(requests_fd: int, replies_fd: int) -> None:
    """The spawner process: fork a child per request line until the requests pipe closes.

    Child exits arrive as SIGCHLD through a wake-up pipe and are reaped in the main loop, so
    replies are only ever written from one place.
    """
    for name in PRELOAD:
        importlib.import_module(name)
    out = os.fdopen(replies_fd, "w", buffering=1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up byte is written
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops us
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
            pid = _fork_child(json.loads(line), (requests_fd, replies_fd, wake_r, wake_w))
            children.add(pid)
            out.write(json.dumps({"pid": pid}) + "\n")
    signal.set_wakeup_fd(-1)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


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
    except BaseException:  # report and exit: the child must never return into the spawner's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
