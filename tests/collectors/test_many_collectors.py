"""Several multi-worker collectors alive in one process, each with its own workers, weights and data.

The envs are ``test_restarts.StampEnv``: every observation holds the pid of the process that
stepped it, its step counter and its worker id, so a test can tell from a batch alone whose
workers collected it and whether a frame was lost or repeated; ``BiasPolicy`` picks the action
its weights say, so a batch shows whose weights collected it.
"""
from __future__ import annotations

import gc
import os
import weakref

import pytest

from procs import wait_gone
from rpc_collectors import GymEnv, MultiCollector, RPCCollector
from test_restarts import StampEnv
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

VERSION, WORKER = ("collector", "policy_version"), ("collector", "worker_id")


def stamp_envs(size: int, workers: int = 2) -> list:
    return [lambda i=i: GymEnv(StampEnv(i, size=size)) for i in range(workers)]


def check(collector, batch, size: int, action: int, version: int) -> None:
    """Every row is one of ``collector``'s own workers stepping its env, frames consecutive,
    with the weights this collector pushed last."""
    rows = list(batch.unbind(0)) if batch.batch_dims == 2 else [batch]
    # stacked: row i is worker i's; async: the one worker that collector.last_batch names
    workers = list(range(len(rows))) if batch.batch_dims == 2 else list(collector.last_batch.worker_frames)
    for row, worker in zip(rows, workers, strict=True):
        obs = row["observation"]
        assert obs.shape[-1] == size, "a batch of another collector's env"
        assert (obs[:, 0] == collector.infos[worker]["pid"]).all(), "frames of a process that is not this worker's"
        assert (obs[:, 2] == worker).all(), "a frame of another worker"
        if collector.track_policy_version:
            assert (row[WORKER] == worker).all()
        assert (obs[:, 1].diff() == 1).all(), "frames missing or repeated"
        assert (row["action"] == action).all(), "collected with another collector's weights"
        if collector.track_policy_version:
            assert (row[VERSION] == version).all()
    assert collector.last_batch.oldest_version == collector.last_batch.newest_version == version


def test_sync_and_async_collectors_side_by_side_each_with_its_own_workers_and_weights(monkeypatch):
    from rpc_collectors.transport import data

    monkeypatch.setattr(data, "MIN_BYTES", 64 * 1024)  # train batches (a few KB) as RPC results, eval's (hundreds of KB) in slots
    train_policy, eval_policy = BiasPolicy(0, size=3), BiasPolicy(0, size=300)
    train = MultiCollector(stamp_envs(3), train_policy, frames_per_batch=40, sync=True, rpc_timeout=30,
                           track_policy_version=True)
    evaluate = MultiCollector(stamp_envs(300), eval_policy, frames_per_batch=100, sync=False, rpc_timeout=30,
                              track_policy_version=True)
    try:
        assert not {i["pid"] for i in train.infos} & {i["pid"] for i in evaluate.infos}
        train_it, eval_it = iter(train), iter(evaluate)
        versions = {"train": 0, "eval": 0}
        for step in range(6):
            check(train, next(train_it), 3, action=versions["train"] % 2, version=versions["train"])
            for _ in range(2):  # async: a batch collected before the last push may still arrive
                batch = next(eval_it)
                version = int(batch[VERSION][0])
                assert version <= versions["eval"]
                check(evaluate, batch, 300, action=version % 2, version=version)
            if step % 2 == 0:
                versions["train"] += 1
                train_policy.set_action(versions["train"] % 2)
                train.update_policy_weights_()
            else:
                versions["eval"] += 1
                eval_policy.set_action(versions["eval"] % 2)
                evaluate.update_policy_weights_()
        assert train.policy_version == versions["train"] and evaluate.policy_version == versions["eval"]
        assert evaluate.slots.plane.path_of(0) == "shm" and train.slots.plane.path_of(0) == "rpc"  # both data paths
    finally:
        train.shutdown()
        evaluate.shutdown()


def test_one_collector_shut_down_while_another_runs():
    first = MultiCollector(stamp_envs(3), BiasPolicy(0, size=3), frames_per_batch=40, rpc_timeout=30)
    second = MultiCollector(stamp_envs(3), BiasPolicy(1, size=3), frames_per_batch=40, sync=False, rpc_timeout=30)
    try:
        first_it, second_it = iter(first), iter(second)
        check(first, next(first_it), 3, action=0, version=0)
        check(second, next(second_it), 3, action=1, version=0)
        gone = {info["pid"] for info in first.infos}
        first.shutdown()
        assert not wait_gone(gone, 10), "the first collector's workers outlived its shutdown"
        for _ in range(5):
            check(second, next(second_it), 3, action=1, version=0)
        third = RPCCollector(stamp_envs(3), BiasPolicy(0, size=3), frames_per_batch=40, launcher="debug",
                             cat_results="stack")
        with third:  # a debug collector beside local workers: its "workers" are this process
            assert {info["pid"] for info in third.infos} == {os.getpid()}
            check(third, next(iter(third)), 3, action=0, version=0)
            check(second, next(second_it), 3, action=1, version=0)
    finally:
        first.shutdown()
        second.shutdown()


def test_a_collector_dropped_while_a_second_is_built():
    old = MultiCollector(stamp_envs(3), BiasPolicy(0, size=3), frames_per_batch=40, rpc_timeout=30)
    old_it = iter(old)
    check(old, next(old_it), 3, action=0, version=0)
    pids, ref = {info["pid"] for info in old.infos}, weakref.ref(old)
    new = MultiCollector(stamp_envs(3), BiasPolicy(1, size=3), frames_per_batch=40, rpc_timeout=30)
    try:
        del old, old_it  # still referenced while the new one was built; now dropped without shutdown()
        gc.collect()
        assert ref() is None, "the dropped collector is still alive"
        assert not wait_gone(pids, 10), "a dropped collector's workers kept running"
        check(new, next(iter(new)), 3, action=1, version=0)
    finally:
        new.shutdown()
