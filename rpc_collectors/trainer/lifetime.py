"""What a multi-worker collector owns outside its own object, and when that is released.

A collector's worker processes, RPC agent and weight plane are held by a :class:`Resources`
object that does not refer back to the collector. It is released by ``shutdown()``, at
interpreter exit, or when the collector is garbage-collected without a shutdown; callbacks
that outlive a call (worker deaths reported by the spawner's thread, RPC futures) reach the
collector only through weak references, so dropping the last reference to a collector is
enough to free it and its workers.
"""
from __future__ import annotations

import atexit
import os
import time
import warnings
import weakref
from typing import Any, Callable


class Resources:
    """The trainer's thread setting, workers, batch buffers and weight sender of one collector.

    :meth:`close` closes them in that order. It is idempotent, and resumable: each part is
    forgotten only once closed, so a call interrupted by Ctrl-C leaves the rest to the next one.
    """

    PARTS = ("threads", "workers", "batches", "sender")

    def __init__(self) -> None:
        self.threads: Any = None
        self.workers: Any = None
        self.batches: Any = None
        self.sender: Any = None

    def close(self) -> None:
        for name in self.PARTS:
            part = getattr(self, name)
            if part is not None:
                part.close()
                setattr(self, name, None)


def release_with(owner: object, resources: Resources) -> weakref.finalize:
    """Close ``resources`` when ``owner`` is garbage-collected or at interpreter exit, whichever
    is first."""
    return finalize_before_exit(owner, resources.close)


def finalize_before_exit(owner: object, close: Callable[..., Any], *args: Any) -> weakref.finalize:
    """Call ``close(*args)`` once: when ``owner`` is garbage-collected or at interpreter exit,
    whichever is first (or when the returned finalizer is called; ``detach()`` cancels it).

    At exit it runs before what ``owner`` uses stops: ``atexit`` runs its handlers last-registered
    first, and those of Ray (``ray.shutdown``) and of the shared spawner (which kills the workers
    it forked) were registered before ``owner`` was made. (``weakref.finalize`` alone runs every
    finalizer from one handler, registered when this process made its first one: maybe before
    those.)
    """
    finalizer = _ExitFinalizer(owner, close, *args)
    finalizer.atexit = False
    atexit.register(finalizer)
    return finalizer


class _ExitFinalizer(weakref.finalize):
    """A ``weakref.finalize`` that leaves ``atexit``'s list once called or detached: a process that
    makes many collectors keeps one exit finalizer per live one, not per one ever made."""

    __slots__ = ()

    def __call__(self, _: Any = None) -> Any:
        atexit.unregister(self)
        return super().__call__()

    def detach(self) -> Any:
        atexit.unregister(self)
        return super().detach()


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of an object, called only while that object is alive (and never keeping it alive).

    Returns the method's result, or None once the object is gone.
    """
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args)

    return call


def wait_gone(pids: list[int], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``pids`` to exit (processes of this host that are not this
    process's children: the local workers of its nodes, which a node takes down with it); warn
    naming those still running then."""
    deadline = time.monotonic() + timeout
    left = [pid for pid in pids if pid is not None and pid != os.getpid()]
    while left:
        left = [pid for pid in left if _running(pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    if left:
        warnings.warn(f"local worker processes {left} of this collector's nodes were still running "
                      f"{timeout} s after their nodes ended", RuntimeWarning, stacklevel=3)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        # gone (or no /proc: nothing to wait for)
        return False
