"""What the Prometheus targets of :mod:`.metric_exports` expose: the latest scalars as gauges of one
prometheus_client registry (:class:`Gauges`, for the endpoint and the textfile alike), and the
endpoint's HTTP server (:class:`Endpoint`: prometheus_client's WSGI app, a bounded number of
connection threads, a read timeout on each connection). prometheus_client (the ``metrics`` extra) is
imported at the first write.
"""
from __future__ import annotations

import re
import socket
import socketserver
import sys
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer


class Gauges:
    """A prometheus_client collector of the latest scalars (:meth:`Metrics.scalars
    <rpc_collectors.core.metrics.Metrics.scalars>`, or an evaluation's result): each number a
    gauge named ``rpc_collectors_<group>_<name>``, a worker's
    ``rpc_collectors_worker_<name>{worker="<id>"}`` (any character Prometheus does not allow in a
    name becomes ``_``), every sample labelled with ``labels`` besides."""

    def __init__(self, **labels: str) -> None:
        self.labels = labels
        self.latest: dict[str, float] = {}

    def collect(self) -> Any:
        """The gauges of the latest scalars (prometheus_client's collector interface)."""
        from prometheus_client.core import GaugeMetricFamily
        families: dict[str, GaugeMetricFamily] = {}
        for name, value in self.latest.items():
            parts = name.split("/")
            worker = parts[0] == "workers" and len(parts) == 3
            family = gauge_name("worker_" + parts[2] if worker else "_".join(parts))
            labels = {"worker": parts[1]} if worker else {}
            labels.update(self.labels)
            gauge = families.setdefault(family,
                                        GaugeMetricFamily(family, family, labels=list(labels)))
            gauge.add_metric(list(labels.values()), value)
        return iter(families.values())

    def registry(self) -> Any:
        """A prometheus_client registry that holds these gauges only."""
        from prometheus_client import CollectorRegistry
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry


def gauge_name(name: str) -> str:
    """``rpc_collectors_<name>``, each character Prometheus does not allow in a name made ``_``."""
    return "rpc_collectors_" + re.sub(r"[^a-zA-Z0-9_:]", "_", name)


class _Handler(WSGIRequestHandler):
    """One request per connection; reads and writes time out after the server's
    ``read_timeout``; no request log."""

    server: Endpoint

    def setup(self) -> None:
        # StreamRequestHandler.setup sets it on the connection
        self.timeout = self.server.read_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        """No request log."""


class Endpoint(socketserver.ThreadingMixIn, WSGIServer):
    """An HTTP server bound to ``address:port`` as :class:`http.server.HTTPServer` binds (with
    ``SO_REUSEADDR``): a daemon thread per connection, at most ``connections`` at once (one beyond
    them is closed at once), and a connection silent for ``read_timeout`` seconds is closed."""

    # as prometheus_client's own server: no connection holds the trainer's exit
    daemon_threads = True
    # whatever the Python version's default: a port another endpoint holds stays refused
    allow_reuse_port = False
    # connections the kernel holds until accepted (socketserver's 5 drops a burst's SYNs)
    request_queue_size = 64

    def __init__(self, address: str, port: int, connections: int, read_timeout: float) -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self.address_family = family
        # binds and listens; closes the socket if that fails
        super().__init__(sockaddr[:2], _Handler)
        self.read_timeout = read_timeout
        self._slots = threading.BoundedSemaphore(connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # at the cap: closed before anything is read
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or went away is the client's business;
        anything else is printed."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def close(self) -> None:
        """Stop serving and close the listening socket (a request being answered finishes)."""
        self.shutdown()
        self.server_close()


def serve(address: str, port: int, registry: Any, connections: int,
          read_timeout: float) -> Endpoint:
    """An :class:`Endpoint` serving ``registry`` with prometheus_client's WSGI
    app, from a daemon thread."""
    from prometheus_client import make_wsgi_app
    app = make_wsgi_app(registry)
    server = Endpoint(address, port, connections, read_timeout)
    server.set_app(app)
    threading.Thread(target=server.serve_forever, name="rpc_collectors "
                                                       f"metrics :{port}", daemon=True).start()
    return server
