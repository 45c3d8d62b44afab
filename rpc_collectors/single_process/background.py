"""Background collection (a collector's ``start()``): a thread that collects into the replay buffer
until ``async_shutdown``, and the batch lock that ``pause()`` holds between two batches.

Each function takes the collector (a
:class:`~rpc_collectors.single_process.base_collector.BaseCollector`), whose attributes hold the
thread, its stop event, its error and the batch lock.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator


def start(collector: Any) -> None:
    """Start the thread that runs ``collector._run_background``."""
    if not collector.writes_buffer:
        raise RuntimeError("start() needs a replay_buffer: pass "
                           "replay_buffer=... to the constructor")
    if collector._thread is not None:
        raise RuntimeError("start() was already called")
    collector._thread = threading.Thread(target=collector._run_background, name="collector",
                                         daemon=True)
    collector._thread.start()


def run(collector: Any) -> None:
    """The thread's work: batch after batch, each under the batch lock, until it is stopped or the
    run is complete; an error is kept for ``async_shutdown`` to raise."""
    batches = collector.iterator()
    try:
        while not collector._stop.is_set():
            # pause() waits for the batch in progress, then holds the thread here
            with collector._batch_lock:
                if collector._stop.is_set() or next(batches, StopIteration) is StopIteration:
                    break
    except BaseException as err:
        # reported by async_shutdown
        collector._thread_error = err


@contextlib.contextmanager
def paused(collector: Any) -> Iterator[None]:
    """The batch lock held for the ``with`` block, once the thread is between two batches; a
    RuntimeError if it is not running."""
    while not (collector.running and collector._batch_lock.acquire(timeout=0.1)):
        if not collector.running:
            raise RuntimeError(
                f"{type(collector).__name__} cannot be paused: it is not collecting in "
                "the background (call start() first)"
            )
    try:
        yield
    finally:
        collector._batch_lock.release()


def shutdown(collector: Any, timeout: float | None, close_env: bool) -> None:
    """Stop the thread after its current batch (waiting at most ``timeout`` seconds), shut the
    collector down, then raise the thread's error, if it had one."""
    collector._stop.set()
    thread, collector._thread = collector._thread, None
    if thread is not None:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError("async_shutdown: the collection thread did not "
                               f"stop within {timeout} s")
    collector.shutdown(close_env=close_env)
    if collector._thread_error is not None:
        error, collector._thread_error = collector._thread_error, None
        raise error
