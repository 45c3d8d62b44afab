"""A collector started with ``RPC_COLLECTORS_JOIN`` at a port where no elastic trainer's
rendezvous store answers gives up within ``join_timeout`` with an error in the library's words:
the variable, the address, the timeout, and what to check. A collector that joined builds local
workers of its own (a node collector's) without joining again. In-process, on loopback."""
from __future__ import annotations

import datetime
import socket
import threading

import pytest
import torch.distributed as dist

from rpc_collectors import GymEnv, MultiSyncCollector
from rpc_collectors.cluster.elastic import JOIN_VARIABLE, TRAINER_KEY, join_rendezvous, member_rendezvous
from rpc_collectors.transport.rendezvous import Rendezvous, free_port

pytestmark = pytest.mark.timeout(60)

JOIN_TIMEOUT = 1.0
HANG = 10 * JOIN_TIMEOUT  # not a benchmark: past this, the join waits without bound


class StrangerServer:
    """A TCP server on 127.0.0.1 that is no rendezvous store: it accepts, sends ``greeting``
    (b"": nothing) and keeps each connection open until :meth:`stop`."""

    def __init__(self, greeting: bytes) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.greeting, self.conns, self._stop = greeting, [], threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.conns.append(conn)
            conn.sendall(self.greeting)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()
        self.listener.close()
        for conn in self.conns:
            conn.close()  # a client still waiting for an answer gets the end of the connection


def store_clients_end() -> None:
    """Every thread that tried to reach a store has ended (its connection closed by now)."""
    for thread in threading.enumerate():
        if thread.name == "rpc-collectors-store-client":
            thread.join(10)
            assert not thread.is_alive(), "a thread connecting to the store was left running"


def join_error(port: int, monkeypatch, stop=lambda: None) -> str:
    """The error of a collector joining at 127.0.0.1:``port``; ``stop`` ends the server there."""
    monkeypatch.setenv(JOIN_VARIABLE, f"127.0.0.1:{port}")
    rdv, outcome = join_rendezvous(), []

    def join() -> None:
        try:
            member_rendezvous(rdv, JOIN_TIMEOUT)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=join, daemon=True)
    thread.start()
    thread.join(HANG)
    hung = thread.is_alive()
    stop()  # ends any connection member_rendezvous may still wait on
    thread.join(10)
    assert not hung, f"member_rendezvous(timeout={JOIN_TIMEOUT}) still waited for the server after {HANG} s"
    assert len(outcome) == 1 and isinstance(outcome[0], TimeoutError), outcome
    store_clients_end()
    return str(outcome[0])


def assert_clear(message: str, port: int) -> None:
    assert f"{JOIN_VARIABLE}=127.0.0.1:{port}" in message
    assert f"join_timeout={JOIN_TIMEOUT:g} s" in message
    assert "elastic=True" in message and "rendezvous" in message and "reach" in message
    assert "DistNetworkError" not in message and "Ping failed" not in message.split("(")[0]


def test_a_closed_port(monkeypatch):
    port = free_port()
    assert_clear(join_error(port, monkeypatch), port)


@pytest.mark.parametrize("greeting", [b"SSH-2.0-OpenSSH_9.6\r\n" * 4, b""], ids=["garbage", "silent"])
def test_a_server_that_is_no_trainer(greeting, monkeypatch):
    server = StrangerServer(greeting)
    try:
        message = join_error(server.port, monkeypatch, server.stop)
    finally:
        server.stop()
    assert_clear(message, server.port)


def test_a_torchrun_rank_names_master_addr_and_port():
    port = free_port()
    rdv = Rendezvous("torchrun", 1, 3, "127.0.0.1", port, "lo")
    with pytest.raises(TimeoutError, match=f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{port}.*join_timeout="):
        member_rendezvous(rdv, JOIN_TIMEOUT)
    store_clients_end()


def test_a_joined_collector_builds_local_workers_without_joining_again(monkeypatch):
    """launcher="submitit" and ``--join`` jobs serve node collectors: the node's local collector is
    built in the process that joined, with ``RPC_COLLECTORS_JOIN`` set when it started."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10))
    store.set(TRAINER_KEY, "0")
    monkeypatch.setenv(JOIN_VARIABLE, f"127.0.0.1:{port}")
    assert member_rendezvous(join_rendezvous(), JOIN_TIMEOUT).rank == 1
    with MultiSyncCollector([lambda: GymEnv("CartPole-v1")] * 2, None, frames_per_batch=20, total_frames=20,
                            launcher="debug") as collector:
        assert [batch.shape for batch in collector] == [(2, 10)]
