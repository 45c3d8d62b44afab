"""The doorbell of a worker on another host: one TCP connection that carries the requests, the
answers and each batch's bytes.

The trainer listens on its interface for this worker only (:class:`SocketDoorbell`); the worker
dials it (:class:`~rpc_collectors.transport.doorbell.Dial`) with a one-time token, and "ready in
slot s" is followed by the slot's bytes, which the trainer's reader receives straight into slot s
of its own buffer. A worker that dies, or a link that breaks, ends the connection, and so fails
its request.
"""
from __future__ import annotations

import contextlib
import secrets
import selectors
import socket
import threading
import time
from typing import Callable

from rpc_collectors.transport.doorbell import CLOSE_WAIT, Dial, Doorbell


class SocketDoorbell(Doorbell):
    """Trainer side of a worker on another host: one TCP connection, and each batch's bytes
    received straight into ``slots(s)``, the memory of slot s, before its request completes."""

    def __init__(self, address: str, slots: Callable[[int], memoryview], timeout: float) -> None:
        """Listen on ``address`` (the trainer's interface) for this worker's connection
        within ``timeout`` s."""
        self._listener = socket.create_server((address, 0))
        self.ends = Dial(address, self._listener.getsockname()[1], secrets.token_bytes(16), timeout)
        self._slots, self._timeout = slots, timeout
        self._sock: socket.socket | None = None
        self._waiting()
        # the socket's descriptor, once connected
        self._request_w = self._answer_r = -1

    def opened(self) -> None:
        """The worker said it connected: take its connection (its token
        checked), start reading answers.

        Other connections (silent, or with a wrong token) are read side by side with it and turned
        away; all of them together hold the trainer at most ``timeout`` s, then ``TimeoutError``.
        """
        token, deadline = self.ends.token, time.monotonic() + self._timeout
        # accepted, their token not all there yet
        pending: dict[socket.socket, bytes] = {}
        try:
            with selectors.DefaultSelector() as selector:
                self._listener.setblocking(False)
                selector.register(self._listener, selectors.EVENT_READ)
                while self._sock is None:
                    left = deadline - time.monotonic()
                    ready = selector.select(left) if left > 0 else []
                    if not ready:
                        raise TimeoutError(
                            f"no connection to port {self.ends.port} presented this worker's token "
                            f"within {self._timeout:g} s"
                        )
                    for key, _ in ready:
                        if key.fileobj is self._listener:
                            with contextlib.suppress(BlockingIOError):
                                conn, _ = self._listener.accept()
                                conn.setblocking(False)
                                pending[conn] = b""
                                selector.register(conn, selectors.EVENT_READ)
                            continue
                        conn = key.fileobj
                        try:
                            part = conn.recv(len(token) - len(pending[conn]))
                        except BlockingIOError:
                            continue
                        except OSError:
                            part = b""
                        got = pending[conn] + part
                        if part and len(got) < len(token):
                            pending[conn] = got
                            continue
                        selector.unregister(conn)
                        del pending[conn]
                        if part and secrets.compare_digest(got, token):
                            self._sock = conn
                            break
                        # closed early, or a wrong token
                        conn.close()
        finally:
            self._listener.close()
            for conn in pending:
                conn.close()
        self._sock.setblocking(True)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._request_w = self._answer_r = self._sock.fileno()
        self._start_reading()

    def _land(self, slot: int) -> None:
        view = self._slots(slot)
        # MSG_WAITALL: the kernel fills the slot in one call, barring a signal or the end
        while view:
            got = self._sock.recv_into(view, 0, socket.MSG_WAITALL)
            if not got:
                raise EOFError("the connection was closed")
            view = view[got:]

    def _release(self) -> None:
        with self._lock:
            self._request_w = -1
            self._sock.close()

    def close(self) -> None:
        """End the connection: the worker's doorbell thread ends, then the reader here."""
        with self._lock:
            if not self._open:
                self._listener.close()
            elif self._request_w >= 0:
                self._request_w = -1
                # the worker may have reset it already
                with contextlib.suppress(OSError):
                    # wakes the reader, which closes the socket
                    self._sock.shutdown(socket.SHUT_RDWR)
        if self._open and self._reader is not threading.current_thread():
            # not left running into the interpreter's exit
            self._reader.join(CLOSE_WAIT)
