"""Nothing outlives a collector: one of every kind, iterated and dropped (shut down or not, after a
worker failed or was replaced), is garbage once ``gc.collect()`` ran, and its processes, threads,
descriptors and shared memory are gone with it; fifty of each kind leave this process as they found it (exit handlers included).

Each test first makes and drops one collector of its kind, so what a process starts once and
keeps (the worker spawner, torch's thread pools) is part of the baseline it compares against.
"""
from __future__ import annotations

import gc
import os
import signal
import weakref
from typing import Any, Callable

import pytest

from conftest import CountEnv
from procs import Holdings, holds_beyond
from rpc_collectors import (
    AsyncBatchedCollector,
    AsyncCollector,
    Collector,
    DistributedCollector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RPCCollector,
    WorkerError,
)
from rpc_collectors.worker.spawner import shared_pid
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(300)]

SOAK = 50  # collectors of each kind made and dropped in one process


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


KINDS: dict[str, Callable[[], Any]] = {
    "Collector": lambda: Collector(count_env, None, frames_per_batch=10),
    "MultiSyncCollector": lambda: MultiSyncCollector([count_env] * 2, None, frames_per_batch=10, rpc_timeout=30),
    "MultiAsyncCollector": lambda: MultiAsyncCollector([count_env] * 2, None, frames_per_batch=10, rpc_timeout=30),
    "RPCCollector": lambda: RPCCollector([count_env] * 2, None, frames_per_batch=10, launcher="local", rpc_timeout=30),
    "AsyncCollector": lambda: AsyncCollector(count_env, None, frames_per_batch=10, rpc_timeout=30),
    "AsyncBatchedCollector": lambda: AsyncBatchedCollector([count_env] * 2, policy=BiasPolicy(0, size=3),
                                                           frames_per_batch=10, rpc_timeout=30),
    "DistributedCollector": lambda: DistributedCollector([count_env] * 2, None, frames_per_batch=10, launcher="mp",
                                                         rpc_timeout=30),
}


def iterated_and_dropped(make: Callable[[], Any], shutdown: bool) -> weakref.ref:
    """A collector that delivered two batches, shut down or not, with no reference left but the weak one returned."""
    collector = make()
    batches = iter(collector)
    next(batches)
    next(batches)
    if shutdown:
        collector.shutdown()
    return weakref.ref(collector)


def exit_finalizers() -> int:
    """The collectors' finalizers this process still keeps for interpreter exit."""
    return sum(issubclass(type(o), weakref.finalize) for o in gc.get_objects())


def _not_ours() -> set[int]:
    """Processes a process keeps across collectors: the spawner and multiprocessing's resource tracker."""
    from multiprocessing import resource_tracker

    return {shared_pid(), getattr(resource_tracker._resource_tracker, "_pid", None)}


@pytest.mark.parametrize("shutdown", [True, False], ids=["shut-down", "dropped"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_dropped_collector_is_freed_with_its_processes_threads_fds_and_shared_memory(kind, shutdown):
    iterated_and_dropped(KINDS[kind], shutdown=True)
    gc.collect()
    before = Holdings.now()
    ref = iterated_and_dropped(KINDS[kind], shutdown)
    gc.collect()
    assert ref() is None, f"a {kind} that was iterated and dropped is still alive after gc.collect()"
    left = holds_beyond(before, ignore=_not_ours())
    assert not left, f"a dropped {kind} left behind {left}"


def failed_worker(sync: bool, restarts: int, shutdown: bool) -> tuple[weakref.ref, set[int]]:
    """A collector whose worker 1 was killed while it collected: replaced (``restarts``) or, without
    restarts, ended by its WorkerError; shut down or not, dropped. Its weak reference and its worker pids."""
    cls = MultiSyncCollector if sync else MultiAsyncCollector
    collector = cls([count_env] * 2, None, frames_per_batch=10, max_worker_restarts=restarts, rpc_timeout=30)
    batches = iter(collector)
    next(batches)
    pids = {info["pid"] for info in collector.infos}
    os.kill(collector.infos[1]["pid"], signal.SIGKILL)
    try:
        for _ in range(200):  # a replacement shows in worker_restarts; a failure as WorkerError
            next(batches)
            if collector.worker_restarts[1]:
                break
        assert collector.worker_restarts[1] == 1, "the killed worker was not replaced"
        pids |= {info["pid"] for info in collector.infos}
        next(batches)
    except WorkerError:
        assert not restarts, "a worker within the restart budget ended the run"
    else:
        assert restarts, "a killed worker without restarts raised no WorkerError"
    if shutdown:
        collector.shutdown()
    return weakref.ref(collector), pids


@pytest.mark.filterwarnings("ignore::rpc_collectors.WorkerRestartWarning")
@pytest.mark.parametrize("shutdown", [True, False], ids=["shut-down", "dropped"])
@pytest.mark.parametrize("restarts", [1, 0], ids=["replaced", "failed"])
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_collector_whose_worker_was_replaced_or_failed_is_freed(sync, restarts, shutdown):
    iterated_and_dropped(KINDS["MultiSyncCollector"], shutdown=True)
    gc.collect()
    before = Holdings.now()
    ref, pids = failed_worker(sync, restarts, shutdown)
    gc.collect()
    assert ref() is None, "a collector whose worker failed is still alive after shutdown() and gc.collect()"
    left = holds_beyond(before, ignore=_not_ours())
    assert not left, f"a collector whose worker failed left behind {left} (its workers were {sorted(pids)})"


@pytest.mark.parametrize("kind", list(KINDS))
def test_fifty_collectors_made_and_dropped_leave_nothing_behind(kind):
    iterated_and_dropped(KINDS[kind], shutdown=True)
    gc.collect()
    before, exit_handlers = Holdings.now(), exit_finalizers()
    gc.freeze()  # what existed before is no garbage: each gc.collect() below looks at the new objects only
    try:
        refs = []
        for i in range(SOAK):
            refs.append(iterated_and_dropped(KINDS[kind], shutdown=i % 2 == 0))
            gc.collect()
        alive = sum(ref() is not None for ref in refs)
        left = holds_beyond(before, ignore=_not_ours())
    finally:
        gc.unfreeze()
    assert not alive, f"{alive} of {SOAK} dropped {kind}s are still alive"
    assert not left, f"{SOAK} dropped {kind}s left behind {left}"
    assert exit_finalizers() == exit_handlers, f"{SOAK} dropped {kind}s left exit handlers behind"
