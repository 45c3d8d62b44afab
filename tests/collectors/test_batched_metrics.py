"""``AsyncBatchedCollector``'s ``metrics()`` (each env worker's phases, its inference loop) and ``trace()``."""
from __future__ import annotations

import functools
import json
import os
import shutil
import time
from collections import Counter

import pytest

from conftest import CountEnv
from rpc_collectors import AsyncBatchedCollector, GymEnv
from rpc_collectors.core.futures import outcome
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

INFERENCE = "rpc-collectors-inference"  # the inference loop's thread: its row of the trainer in the timeline


class LoggedCountEnv(CountEnv):
    """A CountEnv that appends one byte to ``log`` per step: the file's size is the steps it took."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log = log

    def step(self, action):
        with open(self.log, "ab") as file:
            file.write(b".")
        return super().step(action)


def logged_env(log: str) -> GymEnv:
    return GymEnv(LoggedCountEnv(log))


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def steps_taken(logs: list[str]) -> list[int]:
    return [os.path.getsize(log) if os.path.exists(log) else 0 for log in logs]


def settled(collector: AsyncBatchedCollector, logs: list[str], envs_per_worker: int, timeout: float = 60.0):
    """The collector's metrics once its envs stopped stepping (the inference loop waits for room
    in the queue of batches nobody takes): each env worker's frames equal its envs' steps."""
    deadline = time.monotonic() + timeout
    while True:
        metrics, taken = collector.metrics(), steps_taken(logs)
        per_worker = [sum(taken[w * envs_per_worker:(w + 1) * envs_per_worker]) for w in range(len(metrics.workers))]
        if [w.frames for w in metrics.workers] == per_worker and metrics.inference.envs == sum(taken):
            return metrics, taken
        assert time.monotonic() < deadline, (f"env workers' frames {[w.frames for w in metrics.workers]}, their "
                                             f"envs' steps {per_worker}, actions sent {metrics.inference.envs}")
        time.sleep(0.05)


def test_metrics_has_one_entry_per_env_worker_counting_its_envs_steps(tmp_path):
    logs = [str(tmp_path / f"env{i}.log") for i in range(3)]
    with AsyncBatchedCollector([functools.partial(logged_env, log) for log in logs], policy=BiasPolicy(1, size=3),
                               frames_per_batch=6, envs_per_worker=2, prefetch=1) as c:
        batches = iter(c)
        first = next(batches)
        metrics, taken = settled(c, logs, envs_per_worker=2)
        pids = set(c.pool.worker_pids.values())
    assert [w.worker_id for w in metrics.workers] == [0, 1]  # envs 0 and 1, env 2
    assert {w.pid for w in metrics.workers} == pids
    assert sum(w.frames for w in metrics.workers) == sum(taken) >= first.numel()
    for worker in metrics.workers:
        assert worker.env_s > 0 and worker.idle_s > 0 and worker.write_s > 0, worker
        assert worker.policy_s == worker.weights_s == 0 and worker.batches == 0, worker  # no policy, no batch of its own
        assert worker.frames_per_s > 0
    inference = metrics.inference
    assert inference.passes > 0 and inference.envs == sum(taken)  # one step per action sent
    assert inference.envs_per_pass == inference.envs / inference.passes <= 3
    assert inference.policy_s > 0 and inference.wait_s > 0 and inference.record_s > 0
    assert (metrics.roster.workers, metrics.roster.alive, metrics.roster.restarts) == (2, 2, 0)
    scalars = metrics.scalars()
    assert scalars["inference/passes"] == inference.passes and scalars["workers/1/frames"] == metrics.workers[1].frames
    after = c.metrics()  # shut down: no workers to ask, the loop's last counts
    assert after.workers == () and after.roster.alive == 0 and after.inference.passes >= inference.passes > 0


def test_lag_agrees_with_each_batchs_record_while_weights_are_pushed():
    lags, min_lags = [], []
    with AsyncBatchedCollector([count_env] * 2, policy=BiasPolicy(1, size=3), frames_per_batch=4,
                               total_frames=48) as c:
        for _ in c:
            lags.append(c.last_batch.lag)
            min_lags.append(c.last_batch.min_lag)
            c.update_policy_weights_()  # twice per batch: the batches waiting and being filled fall behind
            c.update_policy_weights_()
        m = c.metrics()
    assert (m.lag.min, m.lag.max, m.lag.last) == (min(min_lags), max(lags), lags[-1])
    assert m.lag.mean == pytest.approx(sum(lags) / len(lags))
    assert max(lags) > 0  # the run did lag: the comparison above means something
    assert m.rounds.rounds == len(lags) == 12


def test_metrics_false_raises_and_no_clock_counts():
    with AsyncBatchedCollector([count_env] * 2, policy=BiasPolicy(1, size=3), frames_per_batch=4, total_frames=8,
                               metrics=False) as c:
        assert sum(b.numel() for b in c) == 8
        with pytest.raises(RuntimeError, match="metrics=False"):
            c.metrics()
        phases = [p for w in range(c.num_workers) for p in outcome(c.pool.calls.phases(w))]
        assert [p.frames > 0 for p in phases] == [True, True]  # the envs stepped
        assert all(ns == 0 for p in phases for ns in p.phase_ns.values())  # and no clock read time
        assert set(c._loop.clock.totals_ns.values()) == {0}


def read(path) -> dict[str, dict[str, list[dict]]]:
    """``{process name: {thread name: [span events]}}`` of a Chrome trace file."""
    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"].split(" (")[0] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    out: dict[str, dict[str, list[dict]]] = {}
    for e in events:
        if e["ph"] == "X":
            out.setdefault(processes[e["pid"]], {}).setdefault(threads[e["pid"], e["tid"]], []).append(e)
    return out


@pytest.mark.parametrize("metrics", [None, False])
def test_trace_writes_the_inference_loop_and_each_env_workers_steps_after_the_rounds(tmp_path, metrics):
    path, max_spans = tmp_path / "batched.json", 40
    with AsyncBatchedCollector([count_env] * 3, policy=BiasPolicy(1, size=3), frames_per_batch=30, total_frames=-1,
                               envs_per_worker=2, max_batch_size=2, metrics=metrics) as c:
        c.trace(path, rounds=2, max_spans=max_spans)
        batches = iter(c)
        next(batches)
        assert not path.exists()  # written once the second batch is handed out
        next(batches)
        assert path.exists()
        if metrics is False:  # the window's clocks are gone with it
            assert all(set(p.phase_ns.values()) == {0} for w in range(c.num_workers)
                       for p in outcome(c.pool.calls.phases(w)))
    trace = read(path)
    assert sorted(trace) == ["trainer", "worker 0", "worker 1"]
    loop = Counter(e["name"] for e in trace["trainer"][INFERENCE])
    assert loop["forward"] > 0 and loop["wait"] > 0
    assert len(trace["trainer"][INFERENCE]) <= max_spans
    assert all(1 <= e["args"]["envs"] <= 2 for e in trace["trainer"][INFERENCE] if e["name"] == "forward")
    for worker in ("worker 0", "worker 1"):
        spans = trace[worker]["rollout"]
        assert {"idle", "env", "write"} <= {e["name"] for e in spans} and len(spans) <= max_spans, worker
        assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)


def test_trace_refuses_bad_input_and_a_failing_window_lets_collection_go_on(tmp_path):
    with AsyncBatchedCollector([count_env] * 2, policy=BiasPolicy(1, size=3), frames_per_batch=4,
                               total_frames=-1) as c:
        with pytest.raises(ValueError, match="rounds=0"):
            c.trace(tmp_path / "t.json", rounds=0)
        with pytest.raises(ValueError, match="max_spans"):
            c.trace(tmp_path / "t.json", max_spans=-1)
        with pytest.raises(ValueError, match="path"):
            c.trace(tmp_path / "missing" / "t.json")
        gone = tmp_path / "gone"
        gone.mkdir()
        c.trace(gone / "t.json", rounds=1)
        shutil.rmtree(gone)
        batches = iter(c)
        with pytest.warns(RuntimeWarning, match="given up"):
            next(batches)
        assert next(batches).numel() == 4  # collection goes on
        c.trace(tmp_path / "again.json", rounds=1)  # and a new window opens
        next(batches)
    assert (tmp_path / "again.json").exists()
    with pytest.raises(RuntimeError, match="shut down"):
        c.trace(tmp_path / "late.json")
