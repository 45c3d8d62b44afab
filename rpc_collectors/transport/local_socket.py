"""Unix sockets on this host that only the job's own processes can use.

A :class:`PrivateListener` listens on an abstract Unix socket: a name with nothing on disk, so
nothing is left behind, whatever ends the process. Every user of the host sees the name in
/proc/net/unix and may connect, so each connection proves itself once, before anything it sends
is read as data: the peer must run as this process's user (``SO_PEERCRED``), and its first
``TOKEN_BYTES`` bytes must be the listener's token (random, compared in constant time). The
token reaches the clients only inside what the job hands its own processes (a worker's spec,
over pipes or a shared-memory file that only the user's processes can open). A peer that fails
either check is closed with nothing of it read but those bytes; one that does not present its
token within ``auth_wait`` seconds is closed too, and none holds up the others.

The client's side is :meth:`Address.connect`: it checks that the listener runs as its user too,
then sends the token. Both checks cost a system call and a comparison per
connection, none per message.
"""
from __future__ import annotations

import hmac
import os
import secrets
import selectors
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field

TOKEN_BYTES = 32
# seconds a connection has to present the token
AUTH_WAIT = 10.0
BACKLOG = 64
# struct ucred: pid, uid, gid
_CREDENTIALS = struct.Struct("3i")


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of the Unix socket ``sock``."""
    return _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               _CREDENTIALS.size))[1]


@dataclass(frozen=True)
class Address:
    """Where a client connects (an abstract name, starting with NUL) and the token it presents."""

    name: str
    token: bytes = field(repr=False)

    def connect(self, timeout: float) -> socket.socket:
        """A connection to the listener, proven with the token; ``ConnectionRefusedError`` if
        the listener runs as another user."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(self.name)
            if peer_uid(sock) != os.geteuid():
                raise ConnectionRefusedError(f"the socket {self.name[1:]!r} is another user's")
            sock.sendall(self.token)
        except BaseException:
            sock.close()
            raise
        return sock


class PrivateListener:
    """A listener that admits only connections of this user that present its token.

    Its socket and the connections still presenting the token are registered in ``selector``
    with this listener as their data: the owner's loop hands each of their events to
    :meth:`ready` and calls :meth:`expire` once per turn.
    """

    def __init__(self, selector: selectors.BaseSelector, purpose: str,
                 auth_wait: float = AUTH_WAIT) -> None:
        name = f"\0rpc-collectors-{purpose}-{os.getpid()}-{uuid.uuid4().hex}"
        self.address = Address(name, secrets.token_bytes(TOKEN_BYTES))
        self._selector, self._auth_wait = selector, auth_wait
        self._uid = os.geteuid()
        # the token's bytes so far, deadline
        self._pending: dict[socket.socket, tuple[bytes, float]] = {}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(name)
            self._sock.listen(BACKLOG)
            self._sock.setblocking(False)
            selector.register(self._sock, selectors.EVENT_READ, self)
        except BaseException:
            self._sock.close()
            raise

    def ready(self, sock: socket.socket) -> socket.socket | None:
        """``sock`` (the listener, or a connection presenting the token) can be read: the
        connection that has just proven itself (no longer registered, blocking), else None."""
        if sock is self._sock:
            self._accept()
            return None
        got, deadline = self._pending[sock]
        try:
            part = sock.recv(TOKEN_BYTES - len(got))
        except BlockingIOError:
            return None
        except OSError:
            part = b""
        got += part
        if part and len(got) < TOKEN_BYTES:
            self._pending[sock] = got, deadline
            return None
        self._forget(sock)
        if part and hmac.compare_digest(got, self.address.token):
            sock.setblocking(True)
            return sock
        # closed early, or a wrong token
        sock.close()
        return None

    def _accept(self) -> None:
        try:
            sock, _ = self._sock.accept()
        except OSError:
            # gone already, or no descriptor left: the listener stays ready, tried again
            return
        if peer_uid(sock) != self._uid:
            sock.close()
            return
        sock.setblocking(False)
        self._pending[sock] = b"", time.monotonic() + self._auth_wait
        self._selector.register(sock, selectors.EVENT_READ, self)

    def _forget(self, sock: socket.socket) -> None:
        del self._pending[sock]
        self._selector.unregister(sock)

    def expire(self) -> None:
        """Close the connections whose time to present the token is up."""
        if not self._pending:
            return
        now = time.monotonic()
        for sock in [s for s, (_, deadline) in self._pending.items() if deadline < now]:
            self._forget(sock)
            sock.close()

    def close(self) -> None:
        """Stop listening; close the connections that have not proven themselves."""
        for sock in list(self._pending):
            self._forget(sock)
            sock.close()
        if self._sock.fileno() >= 0:
            self._selector.unregister(self._sock)
            self._sock.close()
