"""``shutdown()`` under slow exits: it returns, never raises for workers that are slow to go,
kills what is left and says so in a warning."""
from __future__ import annotations

import os
import signal

import pytest

from procs import wait_gone
from rpc_collectors import MultiCollector
from rpc_collectors.worker.spawner import shared_pid

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(60)]


def test_workers_whose_exit_is_reported_late_are_killed_with_a_warning_not_an_error():
    """The spawner reports exits (256 workers on a loaded machine, here: a stopped spawner): a
    shutdown that waited its time kills what is left and warns instead of raising, and
    releases everything else it holds."""
    c = MultiCollector(["CartPole-v1"] * 2, None, frames_per_batch=20)
    c.next()
    pids = [info["pid"] for info in c.infos]
    spawner = shared_pid()
    os.kill(spawner, signal.SIGSTOP)
    try:
        with pytest.warns(RuntimeWarning, match=r"worker processes \[\d+, \d+\] .*killed") as record:
            c.shutdown()
    finally:
        os.kill(spawner, signal.SIGCONT)
    assert all(str(pid) in str(record[0].message) for pid in pids)
    assert not wait_gone(set(pids), 10), "the workers outlived shutdown()"
    assert c._resources.batches is None and c._resources.sender is None  # the rest was released too
    c.shutdown()  # and a second call is quiet
