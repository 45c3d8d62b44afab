"""``metrics()`` of multi-worker collectors with real worker processes, against what the test knows: the
frames each worker collected (a single-process ``Collector`` on the same env collects as many), the
restarts it causes, the pushes it makes, ``last_batch``'s lag; exports from the trainer; bad input
refused before any process starts."""
from __future__ import annotations

import json
import os
import warnings

import pytest
from tensordict import TensorDict

from conftest import CountEnv
from procs import descendants
from rpc_collectors import Collector, MultiAsyncCollector, MultiSyncCollector, WorkerRestartWarning
from rpc_collectors.single_process.metric_exports import Export, JsonLines
from rpc_collectors.single_process.run_meter import size_of
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]


class RaisingCountEnv(CountEnv):
    """``CountEnv`` whose first process to take step ``at`` (the ``marker`` file says who) raises there."""

    def __init__(self, at: int, marker: str) -> None:
        super().__init__()
        self.at, self.marker, self.steps = at, marker, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.at:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                raise RuntimeError("the env broke")
        return super().step(action)


def test_each_workers_frames_are_those_a_single_process_collector_collects():
    with Collector(CountEnv, None, frames_per_batch=10, total_frames=50) as single:
        list(single)
        alone = single.metrics().workers[0]
    with MultiSyncCollector([CountEnv] * 2, None, frames_per_batch=20, total_frames=100,
                            track_policy_version=True) as c:
        batches = [batch.clone() for batch in c]
        m = c.metrics()
        stats = c.stats(workers="per_worker")
    assert [w.worker_id for w in m.workers] == [0, 1]
    assert len({w.pid for w in m.workers} | {os.getpid()}) == 3  # each its own process
    for w in m.workers:
        assert (w.frames, w.batches) == (alone.frames, alone.batches) == (50, 5)
        assert w.frames == stats[f"worker_{w.worker_id}/frames"]
        assert w.env_s > 0 and w.policy_s > 0 and w.idle_s > 0 and w.write_s > 0
    assert m.frames == sum(w.frames for w in m.workers) == 100 and m.rounds.rounds == 5
    assert m.roster.workers == m.roster.alive == 2 and m.roster.restarts == 0
    assert m.data_plane.bytes == size_of(batches[0]) * len(batches)  # the batches as received, keys included
    assert m.rounds.wait_s > 0 and m.rounds.busy_s > 0


def test_restarts_are_the_replacements_a_test_causes(tmp_path):
    marker = str(tmp_path / "broke")
    envs = [lambda: RaisingCountEnv(25, marker)] * 2  # in the third batch of 10 frames
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartWarning)
        with MultiSyncCollector(envs, None, frames_per_batch=20, total_frames=100, max_worker_restarts=2) as c:
            list(c)
            m = c.metrics()
            restarts = c.worker_restarts
    assert os.path.exists(marker)
    assert m.roster.restarts == sum(restarts) == 1
    assert m.roster.alive == 2 and (m.roster.joins, m.roster.leaves) == (0, 0)
    replaced = restarts.index(1)
    # its replacement collected the third batch again, then the fourth and fifth: a new process counts from 0
    assert (m.workers[replaced].frames, m.workers[1 - replaced].frames) == (30, 50)


def test_pushes_are_the_update_calls_and_lag_agrees_with_last_batch():
    size = 3
    nbytes = sum(p.numel() * p.element_size() for p in BiasPolicy(size=size).parameters())
    lags, min_lags = [], []
    with MultiAsyncCollector([CountEnv] * 2, BiasPolicy(size=size), frames_per_batch=10, total_frames=200) as c:
        for i, _ in enumerate(c):
            lags.append(c.last_batch.lag)
            min_lags.append(c.last_batch.min_lag)
            if i % 4 == 0:
                c.update_policy_weights_(TensorDict.from_module(BiasPolicy(i % 2, size=size)))
        m = c.metrics()
    assert (m.pushes.count, m.pushes.bytes) == (5, 5 * nbytes)
    assert 0 < m.pushes.last_ack_s <= m.pushes.max_ack_s <= m.pushes.ack_s
    assert (m.lag.min, m.lag.max, m.lag.last) == (min(min_lags), max(lags), lags[-1])
    assert m.lag.mean == pytest.approx(sum(lags) / len(lags))
    assert max(lags) > 0  # the run did lag: the comparison above means something
    assert m.lag.dropped_frames == c.dropped_frames == 0


def test_node_collectors_report_each_local_worker():
    with MultiSyncCollector([CountEnv] * 2, None, frames_per_batch=40, total_frames=80, collector_class="sync",
                            num_workers_per_collector=2) as c:
        list(c)
        m = c.metrics()
        local = [pid for info in c.infos for pid in info["local_pids"]]
    assert [w.worker_id for w in m.workers] == [0, 1, 2, 3]
    assert [w.pid for w in m.workers] == local
    assert [w.frames for w in m.workers] == [20] * 4


def test_metrics_false_reaches_the_workers_clocks():
    with MultiSyncCollector([CountEnv] * 2, None, frames_per_batch=20, total_frames=40, metrics=False) as c:
        list(c)
        phases = c.worker_phases()
        with pytest.raises(RuntimeError, match="metrics=False"):
            c.metrics()
    assert [p.frames for p in phases] == [20, 20]
    assert all(set(p.phase_ns.values()) == {0} for p in phases)


def test_exports_from_the_trainer_hold_every_worker(tmp_path):
    path = tmp_path / "run.jsonl"
    with MultiSyncCollector([CountEnv] * 2, None, frames_per_batch=20, total_frames=60,
                            metrics=Export(JsonLines(path), batches=1)) as c:
        list(c)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [20, 40, 60]
    assert [[w["frames"] for w in line["metrics"]["workers"]] for line in lines] == [[10, 10], [20, 20], [30, 30]]


def test_bad_metrics_are_refused_before_any_worker_starts(tmp_path):
    before = descendants()
    with pytest.raises(ValueError, match="metrics='nope' is invalid; accepted"):
        MultiSyncCollector([CountEnv] * 2, None, frames_per_batch=20, metrics="nope")
    with pytest.raises(ValueError, match=r"metrics=JsonLines\(.*\): path=.* is a folder; accepted: a file path"):
        MultiAsyncCollector([CountEnv] * 2, None, frames_per_batch=20, metrics=JsonLines(tmp_path))
    assert descendants() <= before
