"""Calls from the trainer to a worker process on its host, over a pair of pipes: no RPC agent.

The trainer makes two pipes per worker; the worker opens its ends through ``/proc/<trainer
pid>/fd`` (as it opens the doorbell and the shared batch buffer) and says hello. From then on
the trainer holds only its own ends, so a worker that dies shows as the end of the answer
pipe, and a trainer that goes away as the end of the request pipe: neither side ever waits on
a peer that is gone, and no port is opened.

A request is ``(call id, pickled (method, args))``; the worker runs each in a thread of its
own pool, so a weight push is answered while a batch is being collected, as RPC calls are. An
answer is ``(call id, OK or ERROR, pickled result or traceback text)``. The trainer's writes
never block: what the pipe cannot take at once goes out from a writer thread, so a stopped
worker holds up nothing but its own calls.
"""
from __future__ import annotations

import collections
import concurrent.futures
import copyreg
import io
import os
import pickle
import select
import struct
import threading
import traceback
from typing import Any, Callable

import torch

from rpc_collectors.transport.doorbell import Ends, _read_exactly, _write_all

# call id, payload bytes
REQUEST = struct.Struct("<qq")
# call id, kind, payload bytes
ANSWER = struct.Struct("<qBq")
OK, ERROR = 0, 1
# the id of the worker's first answer: it holds its ends now
HELLO = 0
# seconds the reader waits, after the answer pipe ended, for the worker's exit status
EXIT_WAIT = 1.0
# worker threads running calls at once
CALL_THREADS = 4


def _reduce_tensor(tensor: torch.Tensor) -> tuple:
    """A plain CPU tensor travels as a numpy array, pickled at memory speed (torch's own
    reduction serializes each storage with ``torch.save``: 5-20x slower on small batches)."""
    if type(tensor) is torch.Tensor and tensor.device.type == "cpu" and not tensor.requires_grad:
        try:
            return torch.from_numpy, (tensor.numpy(),)
        except (TypeError, RuntimeError):
            # what numpy cannot hold (bfloat16, sparse, conjugate bits ...)
            pass
    return tensor.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


class _Pickler(pickle.Pickler):
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[torch.Tensor] = _reduce_tensor


def dumps(value: Any) -> bytes:
    """``value`` pickled for the other end of a channel (tensors as numpy arrays)."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


class RemoteError(RuntimeError):
    """The worker raised; the message is its traceback."""


class ChannelClosed(RuntimeError):
    """The worker went away (the message says how, when its exit status is known)."""


class Channel:
    """Trainer side of one worker's pipes: :meth:`call` returns a future of the worker's answer."""

    def __init__(self) -> None:
        self._request_r, self._request_w = os.pipe()
        self._answer_r, self._answer_w = os.pipe()
        os.set_blocking(self._request_w, False)
        self.ends = Ends.of(self._request_r, self._answer_w)
        self.hello: torch.futures.Future = torch.futures.Future()
        self._pending: dict[int, torch.futures.Future] = {HELLO: self.hello}
        self._next_id = HELLO + 1
        self._lock = threading.Lock()
        # what the pipe did not take yet
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._writer: threading.Thread | None = None
        # the worker's exit status is known
        self._exit = threading.Event()
        self._exit_reason = ""
        self._failure: str | None = None
        self._reader = threading.Thread(target=self._read, name="rpc-collectors-channel",
                                        daemon=True)
        self._reader.start()

    def opened(self) -> None:
        """The worker said hello: it holds its ends, so close the trainer's copies of them."""
        with self._lock:
            for fd in (self._request_r, self._answer_w):
                if fd >= 0:
                    os.close(fd)
            self._request_r = self._answer_w = -1

    def call(self, method: str, *args: Any) -> torch.futures.Future:
        """Run ``method(*args)`` on the worker; the future holds its result, or fails with
        :class:`RemoteError` (it raised) or :class:`ChannelClosed` (it went away)."""
        fut: torch.futures.Future = torch.futures.Future()
        payload = dumps((method, args))
        with self._lock:
            if self._failure is not None:
                fut.set_exception(ChannelClosed(self._failure))
                return fut
            call_id, self._next_id = self._next_id, self._next_id + 1
            self._pending[call_id] = fut
            self._send(memoryview(REQUEST.pack(call_id, len(payload)) + payload))
        return fut

    def _send(self, data: memoryview) -> None:
        """Write what the pipe takes now; queue the rest for the writer
        thread (holding the lock)."""
        if not self._backlog:
            try:
                data = data[os.write(self._request_w, data):]
            except BlockingIOError:
                pass
            except OSError:
                # the worker went away: the reader fails the call
                return
        if data:
            self._backlog.append(data)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write,
                                                name="rpc-collectors-channel-write", daemon=True)
                self._writer.start()

    def _write(self) -> None:
        """Send the backlog as the pipe drains; ends once it is empty, or the pipe is gone.

        Writes happen under the lock, so never into a descriptor that close() gave back."""
        while True:
            with self._lock:
                if not self._backlog or self._request_w < 0:
                    self._backlog.clear()
                    self._writer = None
                    return
                fd = self._request_w
            try:
                select.select([], [fd], [], 1.0)
            except (OSError, ValueError):
                # closed meanwhile: seen under the lock
                pass
            with self._lock:
                if not self._backlog or self._request_w < 0:
                    continue
                data = self._backlog[0]
                try:
                    rest = data[os.write(self._request_w, data):]
                except BlockingIOError:
                    continue
                except OSError:
                    # the worker went away: the reader fails the calls
                    self._backlog.clear()
                    continue
                if rest:
                    self._backlog[0] = rest
                else:
                    self._backlog.popleft()

    def _read(self) -> None:
        try:
            while True:
                call_id, kind, size = ANSWER.unpack(_read_exactly(self._answer_r, ANSWER.size))
                payload = _read_exactly(self._answer_r, size)
                with self._lock:
                    fut = self._pending.pop(call_id, None)
                # failed already (the worker's exit was reported first)
                if fut is None:
                    continue
                try:
                    result = pickle.loads(payload)
                except Exception as err:
                    # e.g. a class this process cannot import
                    fut.set_exception(RemoteError(
                        f"the worker's answer could not be read: {err!r}"))
                    continue
                if kind == ERROR:
                    fut.set_exception(RemoteError(result))
                else:
                    fut.set_result(result)
        except (EOFError, OSError):
            pass
        # a dead worker's exit status follows the end of its pipe
        self._exit.wait(EXIT_WAIT)
        self.fail(self._exit_reason or "its channel closed")
        os.close(self._answer_r)

    def exit_reason(self) -> str | None:
        """How the worker's process exited, waiting up to ``EXIT_WAIT`` s for the
        report; None: it did not."""
        return self._exit_reason if self._exit.wait(EXIT_WAIT) else None

    def exited(self, reason: str) -> None:
        """The worker's process exited (``reason`` says how): every call in flight fails with it."""
        self._exit_reason = reason
        self._exit.set()
        self.fail(reason)

    def fail(self, reason: str) -> None:
        """Fail every call in flight and every later one with :class:`ChannelClosed`."""
        with self._lock:
            if self._failure is None:
                self._failure = reason
            pending, self._pending = list(self._pending.values()), {}
        for fut in pending:
            if not fut.done():
                fut.set_exception(ChannelClosed(reason))

    def close(self) -> None:
        """Close the request pipe: the worker finishes its calls and exits; then the reader ends."""
        with self._lock:
            fds = [fd for fd in (self._request_w, self._request_r, self._answer_w) if fd >= 0]
            self._request_w = self._request_r = self._answer_w = -1
            self._backlog.clear()
        for fd in fds:
            os.close(fd)
        self.fail("the collector closed its channel")


def run_channel(
    ends: Ends, handle: Callable[[str, tuple], Any], on_end: Callable[[], None],
    interrupt: Callable[[], None] | None = None,
) -> None:
    """Worker side: open ``ends``, say hello, and answer each request with ``handle(method, args)``
    (in a thread of a pool) until the trainer closes its end; then ``interrupt()`` (the calls in
    progress end early) and ``on_end()`` once they have ended."""
    request, reply = ends.open()
    lock = threading.Lock()

    def answer(call_id: int, kind: int, value: Any) -> None:
        payload = dumps(value)
        with lock:
            try:
                _write_all(reply, ANSWER.pack(call_id, kind, len(payload)) + payload)
            except OSError:
                # the trainer went away: the read loop ends at its next read
                pass

    def run(call_id: int, method: str, args: tuple) -> None:
        try:
            result = handle(method, args)
        except Exception:
            answer(call_id, ERROR, traceback.format_exc())
        else:
            try:
                answer(call_id, OK, result)
            except Exception:
                # the result cannot be pickled
                answer(call_id, ERROR, traceback.format_exc())

    answer(HELLO, OK, os.getpid())
    pool = concurrent.futures.ThreadPoolExecutor(CALL_THREADS,
                                                 thread_name_prefix="rpc-collectors-call")
    try:
        while True:
            call_id, size = REQUEST.unpack(_read_exactly(request, REQUEST.size))
            method, args = pickle.loads(_read_exactly(request, size))
            pool.submit(run, call_id, method, args)
    except (EOFError, OSError):
        # the trainer closed its end, or went away
        pass
    finally:
        if interrupt is not None:
            interrupt()
        pool.shutdown(wait=True)
        on_end()
        os.close(request)
        os.close(reply)
