"""The doorbell of a worker on the trainer's host: "write your next batch into slot s" and "it
is there", over a pair of pipes instead of an RPC round trip each.

A batch request and its answer cost about 20 us through pipes on one host, against about a
millisecond through TensorPipe's RPC, and a sync round waits for both. The trainer makes the
pipes; the worker opens its ends through ``/proc/<trainer pid>/fd`` while it maps the shared
batch buffer (:mod:`rpc_collectors.data_plane`), and from then on the trainer holds only its
own ends. So a worker that dies shows as the end of the answer pipe, and a trainer that goes
away as the end of the request pipe: neither side ever waits on a peer that is gone.

Answers that are not "ready in slot s" (a batch that did not fit its slot, an error with its
traceback) travel pickled after a small header.
"""
from __future__ import annotations

import collections
import os
import pickle
import struct
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

REQUEST = struct.Struct("<qq")  # slot, the weights version to collect with (at least)
ANSWER = struct.Struct("<Bq")  # kind, then the slot (READY) or the pickled payload's length
READY, BATCH, ERROR = 0, 1, 2


@dataclass(frozen=True)
class Ready:
    """A worker's answer: its batch is in ``slot`` of its shared buffer."""

    slot: int


@dataclass(frozen=True)
class Ends:
    """Where a worker opens its ends of the pipes: the trainer's pid and descriptors."""

    pid: int
    request: int
    answer: int

    def open(self) -> tuple[int, int]:
        """The worker's descriptors: (request pipe to read, answer pipe to write)."""
        request = os.open(f"/proc/{self.pid}/fd/{self.request}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return request, os.open(f"/proc/{self.pid}/fd/{self.answer}", os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            os.close(request)
            raise


def _read_exactly(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            raise EOFError("the pipe was closed")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Doorbell:
    """Trainer side of one worker's pipes: :meth:`ring` asks for a batch and returns the future
    that a reader thread completes with the answer (a :class:`Ready`, a batch, or the worker's error)."""

    def __init__(self) -> None:
        self._request_r, self._request_w = os.pipe()
        self._answer_r, self._answer_w = os.pipe()
        self.ends = Ends(os.getpid(), self._request_r, self._answer_w)
        self._pending: collections.deque[torch.futures.Future] = collections.deque()
        self._lock = threading.Lock()
        self._open = False

    def opened(self) -> None:
        """The worker holds its ends now: close the trainer's copies and start reading answers."""
        os.close(self._request_r)
        os.close(self._answer_w)
        self._open = True
        threading.Thread(target=self._read, name="rpc-collectors-doorbell", daemon=True).start()

    def ring(self, slot: int, min_version: int) -> torch.futures.Future:
        """Ask for the next batch in ``slot``, collected with weights of at least ``min_version``."""
        fut: torch.futures.Future = torch.futures.Future()
        failed: OSError | None = None
        with self._lock:  # not while close() runs: the descriptor could already name another file
            self._pending.append(fut)
            try:
                if self._request_w < 0:
                    raise OSError("the doorbell is closed")
                os.write(self._request_w, REQUEST.pack(slot, min_version))  # 16 bytes: one atomic write
            except OSError as err:
                failed = err
        if failed is not None:
            self._fail_pending(failed)
        return fut

    def _read(self) -> None:
        try:
            while True:
                kind, value = ANSWER.unpack(_read_exactly(self._answer_r, ANSWER.size))
                payload = b"" if kind == READY else _read_exactly(self._answer_r, value)
                with self._lock:
                    fut = self._pending.popleft()
                try:
                    result = Ready(value) if kind == READY else pickle.loads(payload)
                except Exception as err:  # e.g. a class this process cannot import
                    fut.set_exception(RuntimeError(f"the worker's answer could not be read: {err!r}"))
                    continue
                if kind == ERROR:
                    fut.set_exception(RuntimeError(result))
                else:
                    fut.set_result(result)
        except (EOFError, OSError) as err:
            self._fail_pending(err)
        finally:
            os.close(self._answer_r)

    def _fail_pending(self, err: BaseException) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
        for fut in pending:
            if not fut.done():
                fut.set_exception(RuntimeError(f"the worker's doorbell pipe closed ({err})"))

    def close(self) -> None:
        """Close the request pipe: the worker's doorbell thread ends, then the reader here."""
        with self._lock:
            if self._request_w < 0:
                return
            os.close(self._request_w)
            self._request_w = -1
        if not self._open:  # never handed over: the trainer holds every end
            for fd in (self._request_r, self._answer_r, self._answer_w):
                os.close(fd)


def _pickled(kind: int, value: Any) -> bytes:
    payload = pickle.dumps(value)
    return ANSWER.pack(kind, len(payload)) + payload


def answer(ends: Ends, collect: Callable[[int, int], Any]) -> None:
    """Worker side: open ``ends`` and answer each request with ``collect(min_version, slot)`` in a
    thread, until the trainer closes the request pipe."""
    request, reply = ends.open()

    def serve() -> None:
        try:
            while True:
                slot, min_version = REQUEST.unpack(_read_exactly(request, REQUEST.size))
                try:
                    result = collect(min_version, slot)
                    message = ANSWER.pack(READY, result.slot) if isinstance(result, Ready) else _pickled(BATCH, result)
                except Exception:
                    message = _pickled(ERROR, traceback.format_exc())
                _write_all(reply, message)
        except (EOFError, OSError):
            pass  # the trainer closed the request pipe, or went away
        finally:
            os.close(request)
            os.close(reply)

    threading.Thread(target=serve, name="rpc-collectors-doorbell", daemon=True).start()
