"""``pause()``, TorchRL 0.14's context manager: background collection (``start()``) stops
writing to the replay buffer for the ``with`` block, then resumes."""
from __future__ import annotations

import threading
import time

import pytest

from conftest import CountEnv
from rpc_collectors import (
    AsyncCollector,
    Collector,
    DistributedCollector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
)

pytestmark = [pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

WAIT = 60.0  # seconds any wait for the background thread may take


class Buffer:
    """Counts the batches written to it."""

    def __init__(self) -> None:
        self.writes = 0
        self.cond = threading.Condition()

    def extend(self, td) -> None:
        with self.cond:
            self.writes += 1
            self.cond.notify_all()

    def wait_for(self, writes: int) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.writes >= writes, WAIT)


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def paused_twice(c, buffer: Buffer) -> None:
    c.start()
    try:
        for _ in range(2):
            assert buffer.wait_for(buffer.writes + 2), "background collection wrote nothing"
            with c.pause():
                writes = buffer.writes
                time.sleep(0.3)  # unpaused, this collector writes many batches meanwhile
                assert buffer.writes == writes, "a batch reached the buffer during pause()"
            assert buffer.wait_for(writes + 1), "collection did not resume after pause()"
    finally:
        c.async_shutdown(timeout=WAIT)


def test_single_process_collector():
    buffer = Buffer()
    paused_twice(Collector(count_env, None, frames_per_batch=10, replay_buffer=buffer), buffer)


@pytest.mark.multiprocess
@pytest.mark.parametrize("make", [
    lambda rb: MultiSyncCollector([count_env] * 2, None, frames_per_batch=20, replay_buffer=rb),
    lambda rb: MultiAsyncCollector([count_env] * 2, None, frames_per_batch=10, replay_buffer=rb),
    lambda rb: DistributedCollector([count_env] * 2, None, frames_per_batch=10, launcher="mp", replay_buffer=rb),
    lambda rb: AsyncCollector(count_env, None, frames_per_batch=10, replay_buffer=rb),
], ids=["MultiSyncCollector", "MultiAsyncCollector", "DistributedCollector", "AsyncCollector"])
def test_multi_worker_collectors(make):
    buffer = Buffer()
    paused_twice(make(buffer), buffer)


def test_pause_without_start_is_an_error():
    c = Collector(count_env, None, frames_per_batch=10, replay_buffer=Buffer())
    with pytest.raises(RuntimeError, match="Collector cannot be paused: .*call start\\(\\) first"):
        with c.pause():
            pass
    c.shutdown()


def test_a_nested_pause_holds_until_the_outer_one_ends():
    buffer = Buffer()
    c = Collector(count_env, None, frames_per_batch=10, replay_buffer=buffer)
    c.start()
    try:
        assert buffer.wait_for(1), "background collection wrote nothing"
        seen: list[int] = []

        def nested() -> None:
            with c.pause():
                seen.append(buffer.writes)
                with c.pause():
                    time.sleep(0.1)
                time.sleep(0.2)  # still paused: the outer block holds it
                seen.append(buffer.writes)

        worker = threading.Thread(target=nested, daemon=True)
        worker.start()
        worker.join(WAIT)
        assert len(seen) == 2, "a nested pause() did not return"
        assert seen[0] == seen[1], "a batch reached the buffer after the inner pause() ended"
        assert buffer.wait_for(buffer.writes + 1), "collection did not resume after the outer pause()"
    finally:
        c.async_shutdown(timeout=WAIT)
