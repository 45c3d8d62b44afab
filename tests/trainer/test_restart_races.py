"""Restarts in a hostile run: two workers killed at once, deaths noticed inside a weight push,
descriptors over many restarts, and an env that raises.

The envs are ``test_restarts.StampEnv``: every observation says which process stepped it and
its step counter, so ``check_whole`` tells from a batch alone that it is whole.
"""
from __future__ import annotations

import os
import signal

import pytest

from procs import wait_gone
from rpc_collectors import GymEnv, MultiCollector, WorkerRestartWarning
from rpc_collectors.worker import channel
from test_restarts import Policy, StampEnv, check_whole, kill_soon

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

FRAMES = 40  # per worker and batch; 400 floats per observation: batches go through shared memory


def two_workers(sync: bool, restarts: int, **env) -> MultiCollector:
    fns = [lambda i=i: GymEnv(StampEnv(i, size=400, **env)) for i in range(2)]
    return MultiCollector(fns, Policy(), frames_per_batch=FRAMES * (2 if sync else 1), sync=sync,
                          max_worker_restarts=restarts, rpc_timeout=30,
                          track_policy_version=True)  # check_whole reads each frame's worker id


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    assert not wait_gone({pid}, 10)


@pytest.mark.parametrize("when", ["between-batches", "during-next"])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_two_workers_killed_at_the_same_moment_are_both_replaced(sync, when):
    collector = two_workers(sync, restarts=1000, step_s=0.002)
    try:
        with pytest.warns(WorkerRestartWarning) as record:
            batches = iter(collector)
            check_whole(next(batches), FRAMES)
            pids = [info["pid"] for info in collector.infos]
            if when == "between-batches":
                for pid in pids:
                    kill(pid)
            else:
                for timer in [kill_soon(pid, 0.02) for pid in pids]:
                    timer.join()
            for _ in range(4):
                check_whole(next(batches), FRAMES)
        assert collector.worker_restarts == [1, 1], [str(w.message) for w in record]
        assert len(record) == 2
        assert not {info["pid"] for info in collector.infos} & set(pids)
    finally:
        collector.shutdown()


def test_deaths_noticed_in_weight_pushes_leave_no_batch_slot_behind():
    """A training loop pushes weights after each batch, and notices most deaths there: the
    replaced worker's request in flight is asked again in the same slot, so no slot is lost."""
    collector = two_workers(False, restarts=6)
    try:
        with pytest.warns(WorkerRestartWarning):
            batches = iter(collector)
            for k in range(6):
                check_whole(next(batches), FRAMES)
                kill(collector.infos[k % 2]["pid"])
                collector.update_policy_weights_()
            for _ in range(6):
                check_whole(next(batches), FRAMES)
        assert collector.worker_restarts == [3, 3]
        for worker_id in range(2):
            assert collector.slots.plane.path_of(worker_id) == "shm"
            asked = collector.slots.plane.pools[worker_id]._written  # slots asked for and not handed out yet
            assert len(asked) <= collector.roster[worker_id].outstanding, "a batch slot was lost to a dead worker"
    finally:
        collector.shutdown()


def test_descriptors_stay_flat_over_restarts():
    collector = two_workers(True, restarts=20)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    try:
        with pytest.warns(WorkerRestartWarning):
            batches = iter(collector)
            check_whole(next(batches), FRAMES)
            kill(collector.infos[0]["pid"])  # one restart first: whatever a restart sets up once is there
            check_whole(next(batches), FRAMES)
            before = fds()
            for k in range(12):
                kill(collector.infos[k % 2]["pid"])
                check_whole(next(batches), FRAMES)
            after = fds()
        assert collector.worker_restarts == [7, 6]
        assert after <= before + 4, f"{after - before} descriptors more after 12 restarts"  # 4: one restart's, closing
    finally:
        collector.shutdown()


@pytest.mark.timeout(60)
def test_an_env_that_raises_is_replaced_without_waiting_for_a_death(monkeypatch):
    """A raise comes back with its traceback: the worker lives, so nothing waits for its exit report."""
    monkeypatch.setattr(channel, "EXIT_WAIT", 3600.0)  # a wait for a death that never comes would hang
    collector = two_workers(True, restarts=2, raise_at=45)
    try:
        with pytest.warns(WorkerRestartWarning, match="raised an error: RuntimeError: simulator crashed at step 45"):
            batches = iter(collector)
            for _ in range(2):  # both envs raise in the second batch; their replacements collect it
                check_whole(next(batches), FRAMES)
        assert collector.worker_restarts == [1, 1]
    finally:
        collector.shutdown()
