"""Local sockets admit only the job's own processes.

Node inference's listener is tried as an attacker on the same host would: found in
/proc/net/unix, connected to by another user (uid/gid 65534) and by a process of the same user
without the listener's token, each sending a pickle whose unpickling creates a file. Nothing may
be unpickled, the connection is refused or closed, and the collector goes on giving the batches
of a policy in every local worker.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import select
import selectors
import signal
import socket
import struct
import threading
import time

import pytest
import torch

from multihost_trainer import ArgmaxPolicy
from procs import descendants, unix_listeners
from rpc_collectors import GymEnv, RPCCollector
from rpc_collectors.transport.local_socket import TOKEN_BYTES, PrivateListener

NOBODY = 65534
ANSWER_WAIT = 60.0  # seconds an attacker waits for the listener to close its connection


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1")


class CreatesFile:
    """Unpickled, creates the file at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return open, (self.path, "w")


def request(path: str) -> bytes:
    """A node inference request whose pickled layout, once unpickled, creates ``path``."""
    pickled = pickle.dumps(CreatesFile(path))
    return struct.pack("<I", len(pickled)) + pickled


def attempt(address: str, payload: bytes) -> str:
    """Connect to ``address``, send ``payload``: "refused" (no connection), "closed" (the listener
    closed it), "answered" (it sent something back) or "open" (still open after ``ANSWER_WAIT`` s)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(ANSWER_WAIT)
        try:
            sock.connect(address)
        except OSError:
            return "refused"
        try:
            sock.sendall(payload)
            return "answered" if sock.recv(1) else "closed"
        except TimeoutError:
            return "open"
        except OSError:  # reset, broken pipe
            return "closed"


def opened_fds(pids: set[int]) -> str:
    """How many of the descriptors of ``pids`` (their pipes, shared-memory files, sockets) this
    process can open through /proc/<pid>/fd, as a worker opens its ends."""
    opened = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK))
                opened += 1
    return str(opened)


def as_nobody(fn, *args) -> str:
    """``fn(*args)`` in a forked child running as uid and gid 65534 with no supplementary groups."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, fn(*args).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], ANSWER_WAIT + 30)
        return os.read(read, 64).decode() if ready else "no report"
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # exited already (a zombie until reaped), or hangs
        os.waitpid(pid, 0)


def collect(inference: str, batches: int, between=None) -> list:
    """Sync node batches; ``between(collector)`` runs after the first."""
    torch.manual_seed(0)
    out = []
    with RPCCollector(make_env, ArgmaxPolicy(), num_collectors=2, frames_per_batch=2 * 2 * 20, launcher="local",
                      collector_class="sync", num_workers_per_collector=2, cat_results="stack",
                      inference=inference) as c:
        c.set_seed(3)
        for batch in c:
            out.append(batch.clone())
            if len(out) == batches:
                break
            if len(out) == 1 and between is not None:
                between(c)
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_node_inference_listener_runs_nothing_of_another_user_or_a_peer_without_its_token(
        no_leftover_processes, tmp_path):
    other_user, same_user = tmp_path / "other_user_ran_code", tmp_path / "same_user_ran_code"
    outcomes: dict = {}
    silent: list[socket.socket] = []

    def attack(c) -> None:
        nodes = [info["pid"] for info in c.infos]
        listeners = {address for pid in descendants() for address in unix_listeners(pid)}
        outcomes["listeners"] = {address for pid in nodes for address in unix_listeners(pid)}
        for address in sorted(listeners):
            outcomes.setdefault("other user", []).append(as_nobody(attempt, address, request(str(other_user))))
            outcomes.setdefault("same user", []).append(attempt(address, request(str(same_user))))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # connected, silent, while batches go on
            silent.append(sock)
            sock.connect(address)
        outcomes["fds opened by another user"] = as_nobody(opened_fds, descendants() | {os.getpid()})

    try:
        attacked = collect("node", 4, attack)
    finally:
        for sock in silent:
            sock.close()
    assert len(outcomes["listeners"]) == 2  # one per node
    assert not other_user.exists() and not same_user.exists()
    assert all(outcome in ("refused", "closed") for outcome in outcomes["other user"]), outcomes
    assert all(outcome == "closed" for outcome in outcomes["same user"]), outcomes
    assert outcomes["fds opened by another user"] == "0"  # the pipes and shared memory of the job
    reference = collect("worker", 4)
    for a, b in zip(reference, attacked, strict=True):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a.get(key), b.get(key)), key


def test_silent_and_wrong_token_peers_are_closed_and_a_peer_with_the_token_admitted_meanwhile():
    with selectors.DefaultSelector() as selector:
        listener = PrivateListener(selector, "test", auth_wait=1.0)
        admitted: list[socket.socket] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as quiet, \
                    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wrong, \
                    listener.address.connect(ANSWER_WAIT) as good:
                quiet.connect(listener.address.name)
                quiet.sendall(listener.address.token[:TOKEN_BYTES // 2])  # half the token, then nothing
                wrong.connect(listener.address.name)
                wrong.sendall(bytes(TOKEN_BYTES))
                good.sendall(b"after the token")
                closed: set[socket.socket] = set()
                for sock in (quiet, wrong):
                    sock.setblocking(False)
                deadline = time.monotonic() + ANSWER_WAIT
                while not (len(closed) == 2 and admitted) and time.monotonic() < deadline:
                    for key, _ in selector.select(0.05):
                        sock = listener.ready(key.fileobj)
                        if sock is not None:
                            admitted.append(sock)
                    listener.expire()
                    for sock in {quiet, wrong} - closed:
                        with contextlib.suppress(BlockingIOError):
                            if sock.recv(1) == b"":
                                closed.add(sock)
                assert quiet in closed, "a peer that never finished its token was not closed"
                assert wrong in closed, "a peer with a wrong token was not closed"
                assert len(admitted) == 1 and admitted[0].recv(15, socket.MSG_WAITALL) == b"after the token"
        finally:
            listener.close()
            for sock in admitted:
                sock.close()


@pytest.mark.timeout(180)
def test_node_inference_listeners_close_with_the_collector():
    before = unix_listeners(os.getpid())
    c = RPCCollector(make_env, ArgmaxPolicy(), num_collectors=2, frames_per_batch=40, launcher="debug",
                     collector_class="sync", num_workers_per_collector=2, inference="node")
    try:
        c.next()
        assert len(unix_listeners(os.getpid()) - before) == 2  # one per node, in this process (debug launcher)
    finally:
        c.shutdown()
    assert unix_listeners(os.getpid()) == before


def test_another_user_is_refused_even_with_the_token():
    with selectors.DefaultSelector() as selector:
        listener = PrivateListener(selector, "test")
        admitted: list[socket.socket] = []
        stop = threading.Event()

        def serve() -> None:
            while not stop.is_set():
                for key, _ in selector.select(0.05):
                    sock = listener.ready(key.fileobj)
                    if sock is not None:
                        admitted.append(sock)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        try:
            outcome = as_nobody(attempt, listener.address.name, listener.address.token + b"a request")
        finally:
            stop.set()
            server.join(ANSWER_WAIT)
            listener.close()
            for sock in admitted:
                sock.close()
    assert outcome == "closed" and not admitted
