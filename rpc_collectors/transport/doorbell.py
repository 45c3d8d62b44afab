"""A worker's doorbell: "write your next batch into slot s" and "it is there", over a pair of
pipes (a worker on the trainer's host) or one TCP connection (a worker on another host) instead
of an RPC round trip each.

A batch request and its answer cost about 20 us through pipes on one host, against about a
millisecond through TensorPipe's RPC, and a sync round waits for both. The trainer makes the
pipes; the worker opens its ends through ``/proc/<trainer pid>/fd`` while it maps the shared
batch buffer (:mod:`rpc_collectors.transport.data`), and from then on the trainer holds only its
own ends. So a worker that dies shows as the end of the answer pipe, and a trainer that goes
away as the end of the request pipe: neither side ever waits on a peer that is gone.

Across hosts the connection also carries the batch: "ready in slot s" is followed by the
slot's bytes, which the trainer's reader receives straight into slot s of its own buffer
(:class:`~rpc_collectors.transport.socket_doorbell.SocketDoorbell`). The worker dials the
trainer's address with a one-time token; a worker that dies, or a link that breaks, ends the
connection, and so fails its request.

Answers that are not "ready in slot s" (a batch that did not fit its slot, an error with its
traceback) travel pickled after a small header.
"""
from __future__ import annotations

import collections
import os
import pickle
import queue
import socket
import struct
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from rpc_collectors.core.protocol import Noted, Ready
from rpc_collectors.transport.shm import file_id, open_checked

# slot, the weights version to collect with (at least)
REQUEST = struct.Struct("<qq")
# kind, then the slot (READY) or the pickled payload's length
ANSWER = struct.Struct("<Bq")
READY, BATCH, ERROR = 0, 1, 2
# seconds close() waits for the reader of a closed connection to end
CLOSE_WAIT = 5.0


@dataclass(frozen=True)
class Ends:
    """Where a worker opens its ends of the pipes: the trainer's pid and descriptors, and which
    pipe each descriptor named (``file_id``) when the trainer handed them out."""

    pid: int
    request: int
    answer: int
    request_file: tuple[int, int]
    answer_file: tuple[int, int]

    @classmethod
    def of(cls, request: int, answer: int) -> Ends:
        """The ends of this process's descriptors ``request`` (read end) and
        ``answer`` (write end)."""
        return cls(os.getpid(), request, answer, file_id(request), file_id(answer))

    def open(self) -> tuple[int, int]:
        """The worker's descriptors: (request pipe to read, answer pipe to write).

        ``FileNotFoundError`` if the trainer no longer holds the pipes it handed out (it gave up
        on this worker): their numbers may name another worker's pipes by now."""
        request = open_checked(f"/proc/{self.pid}/fd/{self.request}", os.O_RDONLY | os.O_CLOEXEC,
                               self.request_file)
        try:
            return request, open_checked(f"/proc/{self.pid}/fd/{self.answer}",
                                         os.O_WRONLY | os.O_CLOEXEC, self.answer_file)
        except BaseException:
            os.close(request)
            raise


@dataclass(frozen=True)
class Dial:
    """Where a worker on another host connects its doorbell: the trainer's address, a port open
    for this worker only, and the token that proves the connection is the worker's."""

    address: str
    port: int
    token: bytes
    timeout: float

    def open(self) -> tuple[int, int]:
        """The worker's descriptors: one connected socket, read and written."""
        sock = socket.create_connection((self.address, self.port), timeout=self.timeout)
        try:
            # requests and headers are small
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(self.token)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        fd = sock.detach()
        return fd, fd


def _read_exactly(fd: int, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = os.read(fd, n - got)
        if not part:
            raise EOFError("the pipe was closed")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Doorbell:
    """Trainer side of one worker's pipes: :meth:`ring` asks for a batch and returns the future
    that a reader thread completes with the answer (a :class:`Ready`, a batch,
    or the worker's error)."""

    def __init__(self) -> None:
        self._request_r, self._request_w = os.pipe()
        self._answer_r, self._answer_w = os.pipe()
        self.ends: Ends | Dial = Ends.of(self._request_r, self._answer_w)
        self._waiting()

    def _waiting(self) -> None:
        """Not open yet, nothing asked."""
        self._pending: collections.deque[torch.futures.Future] = collections.deque()
        self._lock = threading.Lock()
        self._open = False
        # the reader stopped: nothing will answer a request any more
        self._ended = False

    def opened(self) -> None:
        """The worker holds its ends now: close the trainer's copies and start reading answers."""
        os.close(self._request_r)
        os.close(self._answer_w)
        self._start_reading()

    def _start_reading(self) -> None:
        self._open = True
        self._reader = threading.Thread(target=self._read, name="rpc-collectors-doorbell",
                                        daemon=True)
        self._reader.start()

    def ring(self, slot: int, min_version: int) -> torch.futures.Future:
        """Ask for the next batch in ``slot``, collected with weights of at
        least ``min_version``."""
        fut: torch.futures.Future = torch.futures.Future()
        failed: OSError | None = None
        # not while close() runs: the descriptor could already name another file
        with self._lock:
            self._pending.append(fut)
            try:
                if self._request_w < 0 or self._ended:
                    raise OSError("the doorbell is closed")
                # 16 bytes: one write in practice
                _write_all(self._request_w, REQUEST.pack(slot, min_version))
            except OSError as err:
                failed = err
        if failed is not None:
            self._fail_pending(failed)
        return fut

    def _read(self) -> None:
        failure: BaseException = EOFError("the reader stopped")
        try:
            while True:
                kind, value = ANSWER.unpack(_read_exactly(self._answer_r, ANSWER.size))
                payload = b"" if kind == READY else _read_exactly(self._answer_r, value)
                try:
                    result = Ready(value) if kind == READY else pickle.loads(payload)
                except Exception as err:
                    # e.g. a class this process cannot import
                    kind, result = ERROR, f"the worker's answer could not be read: {err!r}"
                # a node's answer is pickled, its slot in it
                slot = value if kind == READY else _slot_of(result)
                if slot is not None:
                    self._land(slot)
                with self._lock:
                    fut = self._pending.popleft()
                if kind == ERROR:
                    fut.set_exception(RuntimeError(result))
                else:
                    fut.set_result(result)
        except (EOFError, OSError) as err:
            failure = err
        finally:
            # first no new request is taken, then every one still waiting fails:
            # none is left unanswered
            with self._lock:
                self._ended = True
            self._release()
            self._fail_pending(failure)

    def _land(self, slot: int) -> None:
        """The batch announced in ``slot`` is there already (shared memory)."""

    def _release(self) -> None:
        os.close(self._answer_r)

    def _fail_pending(self, err: BaseException) -> None:
        with self._lock:
            pending, self._pending = list(self._pending), collections.deque()
        for fut in pending:
            if not fut.done():
                fut.set_exception(RuntimeError(f"the worker's doorbell closed ({err})"))

    def close(self) -> None:
        """Close the request pipe: the worker's doorbell thread ends, then the reader here."""
        with self._lock:
            if self._request_w < 0:
                return
            os.close(self._request_w)
            self._request_w = -1
        # never handed over: the trainer holds every end
        if not self._open:
            for fd in (self._request_r, self._answer_r, self._answer_w):
                os.close(fd)


def _slot_of(result: Any) -> int | None:
    """The slot a worker's answer says its batch is in (also inside a node's
    :class:`Noted`); None: not in one."""
    inner = result.answer if isinstance(result, Noted) else result
    return inner.slot if isinstance(inner, Ready) else None


def _pickled(kind: int, value: Any) -> bytes:
    payload = pickle.dumps(value)
    return ANSWER.pack(kind, len(payload)) + payload


def _requests(request: int, announce: Callable[[int], None] | None) -> Iterator[tuple[int, int]]:
    """Each request read from ``request``, as (slot, min_version), until the trainer closes its end
    (EOFError or OSError). With ``announce``, a reader thread reads them as they arrive and
    announces each (``announce(min_version)``) before the answering thread comes to it."""
    if announce is None:
        while True:
            yield REQUEST.unpack(_read_exactly(request, REQUEST.size))
    read: queue.SimpleQueue = queue.SimpleQueue()

    def reader() -> None:
        try:
            while True:
                slot, min_version = REQUEST.unpack(_read_exactly(request, REQUEST.size))
                announce(min_version)
                read.put((slot, min_version))
        except Exception as err:  # the end (EOFError, OSError), raised again where answered
            read.put(err)

    threading.Thread(target=reader, name="rpc-collectors-doorbell-read", daemon=True).start()
    while not isinstance(item := read.get(), BaseException):
        yield item
    raise item


def answer(ends: Ends | Dial, collect: Callable[[int, int], Any],
           slots: Callable[[int], memoryview] | None = None,
           announce: Callable[[int], None] | None = None) -> None:
    """Worker side: open ``ends`` and answer each request with ``collect(min_version, slot)`` in a
    thread, until the trainer closes its end; ``announce(min_version)``, if given, hears of each
    request as soon as it arrives, while earlier ones are still being collected.

    With ``slots`` (a :class:`Dial`), each "ready in slot s" is followed by ``slots(s)``, the
    batch's bytes, sent by a second thread in order while the next request is collected: the
    trainer may keep two requests in flight, so that collection and the transfer overlap.
    """
    request, reply = ends.open()
    # (answer, slot whose bytes follow or None); None: the end
    outbox: queue.Queue = queue.Queue()

    def send() -> None:
        broken = False
        while (item := outbox.get()) is not None:
            message, slot = item
            if broken:
                # the trainer went away: serve() ends at its next read
                continue
            try:
                _write_all(reply, message)
                if slot is not None:
                    _write_all(reply, slots(slot))
            except OSError:
                broken = True

    def serve() -> None:
        sender = threading.Thread(target=send, name="rpc-collectors-doorbell-send", daemon=True)
        if slots is not None:
            sender.start()
        try:
            for slot, min_version in _requests(request, announce):
                try:
                    result = collect(min_version, slot)
                    # "ready in slot s", 9 bytes
                    if isinstance(result, Ready):
                        message, written = ANSWER.pack(READY, result.slot), result.slot
                    else:
                        message, written = _pickled(BATCH, result), _slot_of(result)
                except Exception:
                    message, written = _pickled(ERROR, traceback.format_exc()), None
                # shared memory: the answer alone, at once
                if slots is None:
                    _write_all(reply, message)
                else:
                    outbox.put((message, written))
        except (EOFError, OSError):
            # the trainer closed its end, or went away
            pass
        finally:
            if slots is not None:
                outbox.put(None)
                # prompt: the connection has ended, so its writes fail at once
                sender.join()
            os.close(request)
            if reply != request:
                os.close(reply)

    threading.Thread(target=serve, name="rpc-collectors-doorbell", daemon=True).start()
