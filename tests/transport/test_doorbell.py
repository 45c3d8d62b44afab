"""The TCP doorbell of a worker on another host, on loopback: the trainer side
(:class:`SocketDoorbell` into a :class:`SlotPool`) against the worker side (:func:`answer`
from a :class:`SlotWriter`), or against a hand-made peer that misbehaves."""
from __future__ import annotations

import pickle
import socket
import threading
import time

import pytest
import torch
from tensordict import TensorDict

from rpc_collectors.transport.data import BatchPlane, SlotPool
from rpc_collectors.transport.doorbell import ANSWER, READY, REQUEST, Ready, answer
from rpc_collectors.transport.layouts import BatchLayout
from rpc_collectors.transport.local_restarts import Dropped, LocalRestart, attach, detach
from rpc_collectors.transport.socket_doorbell import SocketDoorbell
from rpc_collectors.worker.single import SlotWriter

pytestmark = pytest.mark.timeout(30)


def batch(mark: int) -> TensorDict:
    obs = torch.full((50, 3, 32, 32), mark % 256, dtype=torch.uint8)
    return TensorDict({"observation": obs, ("next", "observation"): obs + 1, "reward": torch.full((50, 1), float(mark))}, [50])


@pytest.fixture
def pool():
    pool = SlotPool(BatchLayout.of(batch(0)), 1, shared=False)
    yield pool
    pool.close()


def test_each_batch_lands_in_the_slot_it_was_asked_for(pool):
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    writer = SlotWriter(pool.spec(0, bell.ends))
    asked = []

    def collect(min_version: int, slot: int) -> Ready:
        asked.append((min_version, slot))
        assert writer.write(slot, batch(len(asked)))
        return Ready(slot)

    answer(bell.ends, collect, writer.memory)
    bell.opened()
    try:
        for i in range(1, 8):
            slot = pool.slot_for(0)
            assert bell.ring(slot, i).wait() == Ready(slot)
            got = pool.hand_out(slot)
            assert (got == batch(i)).all(), f"batch {i} differs from what the worker wrote"
        assert [v for v, _ in asked] == list(range(1, 8))  # each request's weights version reached the worker
    finally:
        bell.close()


def test_a_nodes_restarts_and_drops_ride_with_its_ready_answer_and_the_bytes_still_land(pool):
    """A node's local restarts make its "ready" answer a pickled one; across hosts the slot's bytes still
    follow it, and the next plain answer is read in step."""
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    writer = SlotWriter(pool.spec(0, bell.ends))
    restarts = (LocalRestart(1, "died with exit code -9 (SIGKILL)", 4321),)
    asked = []

    def collect(min_version: int, slot: int) -> Ready:
        asked.append(slot)
        assert writer.write(slot, batch(len(asked)))
        return attach(Ready(slot), restarts if len(asked) % 2 else (), Dropped(20, 1) if len(asked) == 2 else Dropped())

    answer(bell.ends, collect, writer.memory)
    bell.opened()
    try:
        for i in range(1, 5):
            slot = pool.slot_for(0)
            got, told, dropped = detach(bell.ring(slot, 0).wait())
            assert got == Ready(slot) and told == (restarts if i % 2 else ())
            assert dropped == (Dropped(20, 1) if i == 2 else Dropped())
            assert (pool.hand_out(slot) == batch(i)).all(), f"batch {i} differs from what the worker wrote"
    finally:
        bell.close()


def test_a_batch_returned_directly_carries_a_nodes_restarts_and_drops_around_it():
    restarts = (LocalRestart(0, "died", 7),)
    b = batch(3)
    assert attach(b, ()) is b and detach(b) == (b, (), Dropped())
    got, told, dropped = detach(pickle.loads(pickle.dumps(attach(b, restarts))))
    assert (got == b).all() and told == restarts and dropped == Dropped()
    got, told, dropped = detach(pickle.loads(pickle.dumps(attach(b, (), Dropped(40, 2)))))
    assert (got == b).all() and told == () and dropped == Dropped(40, 2)


def test_two_requests_in_flight_are_answered_in_order_each_in_its_slot():
    pool = SlotPool(BatchLayout.of(batch(0)), 1, shared=False, slots=4)
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    writer = SlotWriter(pool.spec(0, bell.ends))
    count = [0]

    def collect(min_version: int, slot: int) -> Ready:
        count[0] += 1
        assert writer.write(slot, batch(count[0]))
        return Ready(slot)

    answer(bell.ends, collect, writer.memory)
    bell.opened()
    try:
        asked = [(pool.slot_for(0), i) for i in range(1, 3)]
        futures = [bell.ring(slot, 0) for slot, _ in asked]
        for i in range(3, 12):  # as an async collector does: hand one out, ask again, two in flight
            (slot, mark), fut = asked.pop(0), futures.pop(0)
            assert fut.wait() == Ready(slot)
            assert (pool.hand_out(slot) == batch(mark)).all(), f"batch {mark} differs from what the worker wrote"
            asked.append((pool.slot_for(0), i))
            futures.append(bell.ring(asked[-1][0], 0))
        assert len({slot for slot, _ in asked}) == 2  # the two in flight never share a slot
    finally:
        bell.close()
        pool.close()


def test_announce_hears_each_request_as_it_arrives_while_an_earlier_one_is_collected():
    """A node's doorbell (``announce``): three requests rung at once are all announced, with their versions,
    while the first is still being collected; then each is answered in order, in its slot."""
    pool = SlotPool(BatchLayout.of(batch(0)), 1, shared=False, slots=5)
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    writer = SlotWriter(pool.spec(0, bell.ends))
    announced, heard, answered = [], threading.Event(), []

    def collect(min_version: int, slot: int) -> Ready:
        if not answered:  # the first request waits until the reader announced all three
            assert heard.wait(10), f"announced {announced} while the first request was collected"
        answered.append(min_version)
        assert writer.write(slot, batch(min_version))
        return Ready(slot)

    def announce(min_version: int) -> None:
        announced.append(min_version)
        if len(announced) == 3:
            heard.set()

    answer(bell.ends, collect, writer.memory, announce=announce)
    bell.opened()
    try:
        asked = [(pool.slot_for(0), version) for version in (4, 5, 7)]
        futures = [bell.ring(slot, version) for slot, version in asked]
        for (slot, version), fut in zip(asked, futures):
            assert fut.wait() == Ready(slot)
            assert (pool.hand_out(slot) == batch(version)).all()
        assert announced == answered == [4, 5, 7]
    finally:
        bell.close()
        pool.close()


def fake_worker(bell: SocketDoorbell, token: bytes | None = None) -> socket.socket:
    sock = socket.create_connection((bell.ends.address, bell.ends.port), timeout=5)
    sock.sendall(bell.ends.token if token is None else token)
    return sock


def test_a_worker_gone_halfway_through_a_batch_fails_its_request_and_the_slot_stays_out(pool):
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    peer = fake_worker(bell)
    bell.opened()
    try:
        slot = pool.slot_for(0)
        fut = bell.ring(slot, 0)
        assert REQUEST.unpack(peer.recv(REQUEST.size, socket.MSG_WAITALL)) == (slot, 0)
        peer.sendall(ANSWER.pack(READY, slot) + bytes(pool.slot_bytes // 2))  # dies with half a batch sent
        peer.close()
        with pytest.raises(RuntimeError, match="doorbell closed"):
            fut.wait()
        assert slot in pool._written  # never handed out: nothing reads a half-received slot
        with pytest.raises(RuntimeError, match="doorbell closed"):  # later requests fail at once
            bell.ring(pool.slot_for(0), 0).wait()
    finally:
        bell.close()


def test_a_connection_without_the_token_is_turned_away(pool):
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    stranger = fake_worker(bell, token=b"x" * len(bell.ends.token))
    worker = fake_worker(bell)
    bell.opened()
    try:
        assert stranger.recv(1) == b""  # closed by the trainer
        bell.ring(0, 3)
        assert REQUEST.unpack(worker.recv(REQUEST.size, socket.MSG_WAITALL)) == (0, 3)
    finally:
        bell.close()
        stranger.close()
        worker.close()


def strangers(bell: SocketDoorbell, silent: int) -> list[socket.socket]:
    """``silent`` connections that never send a byte, and one that sends a wrong token."""
    socks = [socket.create_connection((bell.ends.address, bell.ends.port), timeout=5) for _ in range(silent)]
    return socks + [fake_worker(bell, token=b"x" * len(bell.ends.token))]


def test_silent_connections_before_the_worker_do_not_keep_it_out(pool):
    """Strangers share the one deadline: each does not cost a timeout of its own."""
    timeout = 2.0
    bell = SocketDoorbell("127.0.0.1", pool.memory, timeout)
    others = strangers(bell, silent=6)
    worker = fake_worker(bell)
    try:
        start = time.monotonic()
        bell.opened()
        assert time.monotonic() - start < 5 * timeout, "the trainer waited out the strangers one by one"
        bell.ring(0, 3)
        assert REQUEST.unpack(worker.recv(REQUEST.size, socket.MSG_WAITALL)) == (0, 3)
        assert all(other.recv(1) == b"" for other in others)  # every stranger closed by the trainer
    finally:
        bell.close()
        worker.close()
        for other in others:
            other.close()


def test_strangers_alone_hold_the_trainer_no_longer_than_the_timeout(pool):
    timeout = 0.5
    bell = SocketDoorbell("127.0.0.1", pool.memory, timeout)
    others = strangers(bell, silent=5)
    try:
        start = time.monotonic()
        with pytest.raises(OSError, match="token"):  # as when the worker's connection never came
            bell.opened()
        assert time.monotonic() - start < 5 * timeout, "the wait was not bounded by one deadline"
        assert all(other.recv(1) == b"" for other in others)
    finally:
        bell.close()
        for other in others:
            other.close()


def test_a_worker_that_never_connects_fails_the_set_up_within_its_timeout(pool):
    bell = SocketDoorbell("127.0.0.1", pool.memory, 0.5)
    with pytest.raises(OSError):
        bell.opened()
    bell.close()


def test_close_ends_the_workers_doorbell_thread(pool):
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    writer = SlotWriter(pool.spec(0, bell.ends))
    before = set(threading.enumerate())
    answer(bell.ends, lambda v, s: Ready(s), writer.memory)
    bell.opened()
    deadline = time.monotonic() + 5  # the worker's sending thread is started by its request thread
    while True:
        started = {t for t in threading.enumerate() if t.is_alive()} - before
        if len(started) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert len(started) == 3  # the worker's two doorbell threads (requests, sending) and the trainer's reader
    bell.close()
    for thread in started:
        thread.join(5)
    assert not any(t.is_alive() for t in started)


@pytest.mark.parametrize("joined", [False, True], ids=["worker-says-no", "worker-never-connects"])
def test_a_worker_on_another_host_without_a_connection_keeps_sending_rpc_results(joined):
    specs = []

    def join(worker_id, spec):
        specs.append(spec)
        return joined

    plane = BatchPlane([False], join, sync=False, address="127.0.0.1", timeout=1.0, pipelined=True)
    first = batch(1)
    assert plane.receive(0, first) is first
    assert plane.path_of(0) == "rpc" and plane.depth(0) == 1
    assert plane.ring(0, 0, plane.slot_for(0)) is None  # the next request goes by RPC
    assert len(specs) == 1 and specs[0].fd is None
    with pytest.raises(ConnectionRefusedError):  # the port opened for the worker is closed again
        socket.create_connection((specs[0].doorbell.address, specs[0].doorbell.port), timeout=1).close()
    plane.close()
