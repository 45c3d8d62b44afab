"""Whether a Ray head answers at an address, before ``ray.init`` is let retry there: a gRPC
server's answer to HTTP/2's connection preface (a SETTINGS frame), for
:func:`~rpc_collectors.pools.ray_actors.connect`.
"""
from __future__ import annotations

import os
import socket
import time

# HTTP/2's client connection preface, then an empty SETTINGS frame (length 0, type
# 4, no flags, stream 0)
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _reachable(address: str, timeout: float) -> None:
    """A ``host:port`` (or ``ray://host:port``) that answers as a gRPC server within ``timeout``.

    A Ray head's GCS (and a Ray Client server) speaks gRPC: sent HTTP/2's connection preface, it
    answers with a SETTINGS frame. Something else that accepts TCP there (a dashboard, any other
    service) would leave ``ray.init`` retrying for minutes, so it is refused here. With
    ``RAY_USE_TLS`` set the handshake is TLS's, and only the connection is checked.
    """
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    accepted = ("accepted: the address of a running cluster's head (host:port or ray://host:port), "
                "'auto' or 'local'")
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as err:
        raise ConnectionError(
            f"ray_init_config['address']={address!r}: no Ray cluster answers there within "
            f"{timeout} s ({err}); {accepted}"
        ) from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "", "false"):
            return
        answer = _http2_answer(sock, deadline)
    if not _is_settings_frame(answer):
        raise ConnectionError(
            f"ray_init_config['address']={address!r}: something accepts connections there, but it "
            f"is not a Ray head (no gRPC answer within {timeout} s: "
            f"{f'it answered {answer!r}' if answer else 'it sent nothing'}); {accepted}"
        )


def _http2_answer(sock: socket.socket, deadline: float) -> bytes:
    """The first 9 bytes (a frame header) the server sends after HTTP/2's preface, or
    fewer by ``deadline``."""
    answer = b""
    try:
        sock.sendall(HTTP2_PREFACE)
        while len(answer) < 9 and deadline > time.monotonic():
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            chunk = sock.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
    except OSError:
        # timed out, reset
        pass
    return answer


def _is_settings_frame(header: bytes) -> bool:
    # type SETTINGS, stream 0
    return len(header) == 9 and header[3] == 0x04 and header[5:9] == bytes(4)
