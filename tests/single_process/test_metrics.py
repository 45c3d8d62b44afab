"""``collector.metrics()`` of a single-process ``Collector`` and the ``metrics=`` exports, each read back
with the real thing: TensorBoard's own reader, an HTTP scrape of the Prometheus endpoint, parsed JSON
lines, an object with TorchRL's ``log_scalar``."""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import urllib.request
import warnings

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import LazyStackedTensorDict, TensorDict

from conftest import CountEnv
from rpc_collectors import Collector
from rpc_collectors.core.metrics import PushMetrics
from rpc_collectors.single_process.metric_exports import Export, JsonLines, Prometheus, TensorBoard
from rpc_collectors.single_process.phase_clock import PHASES
from rpc_collectors.single_process.run_meter import size_of
from test_rpc_collector import BiasPolicy


class Recorder:
    """Any object with TorchRL's logger method."""

    def __init__(self) -> None:
        self.logged: list[tuple[str, float, int]] = []

    def log_scalar(self, name: str, value: float, step: int | None = None) -> None:
        self.logged.append((name, value, step))


def collector(**kwargs) -> Collector:
    kwargs.setdefault("frames_per_batch", 10)
    kwargs.setdefault("total_frames", 50)
    return Collector(CountEnv, None, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_count_the_frames_batches_and_phases_of_the_run():
    with collector() as c:
        batches = list(c)
        m = c.metrics()
    assert m.frames == c.frames == sum(b.numel() for b in batches) == 50
    assert m.rounds.rounds == len(batches) == 5
    (worker,) = m.workers
    assert (worker.worker_id, worker.pid, worker.frames, worker.batches) == (0, os.getpid(), 50, 5)
    assert worker.policy_s > 0 and worker.env_s > 0 and worker.write_s > 0  # every step marks both
    assert m.rounds.busy_s > 0 and m.rounds.handout_s > 0
    assert m.pushes == PushMetrics() and m.data_plane.bytes == 0 and m.lag.max == 0
    assert m.roster.restarts == 0 and m.roster.alive == m.roster.workers == 1


def test_pushes_count_each_update_and_its_bytes():
    policy = BiasPolicy(size=3)
    nbytes = sum(p.numel() * p.element_size() for p in policy.parameters())
    with Collector(CountEnv, policy, frames_per_batch=10, total_frames=40) as c:
        for i, _ in enumerate(c):
            if i < 3:
                c.update_policy_weights_(TensorDict.from_module(BiasPolicy(i % 2, size=3)))
        m = c.metrics()
    assert (m.pushes.count, m.pushes.bytes) == (3, 3 * nbytes)
    assert 0 < m.pushes.max_ack_s <= m.pushes.ack_s


def test_metrics_false_turns_them_off_and_reads_no_clock():
    with collector(metrics=False) as c:
        list(c)
        with pytest.raises(RuntimeError, match="metrics=False"):
            c.metrics()
        assert set(c.rollout.clock.totals_ns.values()) == {0}
    assert set(c.rollout.clock.totals_ns) == set(PHASES)


def test_tensorboard_event_files_read_back_with_tensorboards_reader(tmp_path):
    with collector(metrics=Export(TensorBoard(tmp_path / "tb"), batches=2)) as c:
        list(c)
        final = c.metrics()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    frames = events.Scalars("collector/frames")
    assert [e.step for e in frames] == [10, 20, 40]  # batches 1, 2 and 4
    assert [e.value for e in frames] == [10, 20, 40]
    assert [e.value for e in events.Scalars("collector/workers/0/frames")] == [10, 20, 40]
    assert set(events.Tags()["scalars"]) == {f"collector/{name}" for name in final.scalars()}


def test_json_lines_hold_one_parsed_object_per_export(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with collector(metrics=f"jsonl:{path}") as c:  # every 10 s: the first batch only, in this run
        list(c)
    with collector(metrics=Export(JsonLines(path), batches=1)) as c:
        list(c)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 10, 20, 30, 40, 50]
    assert [line["metrics"]["frames"] for line in lines] == [10, 10, 20, 30, 40, 50]
    assert lines[-1]["metrics"]["workers"][0]["frames"] == 50
    assert lines[-1]["metrics"]["rounds"]["rounds"] == 5


def test_an_object_with_log_scalar_gets_every_scalar_with_the_frames_as_step():
    recorder = Recorder()
    with collector(metrics=Export(recorder, batches=5)) as c:
        list(c)
    steps = {step for _, _, step in recorder.logged}
    assert steps == {10, 50}
    logged = {(name, step): value for name, value, step in recorder.logged}
    assert logged[("collector/frames", 50)] == 50 and logged[("collector/rounds/rounds", 50)] == 5
    assert logged[("collector/workers/0/batches", 10)] == 1


def test_prometheus_endpoint_is_scraped_over_loopback():
    port = free_port()
    with collector(metrics=Export(Prometheus(port), batches=1)) as c:
        list(c)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples["rpc_collectors_frames"]) == 50
    assert float(samples["rpc_collectors_rounds_rounds"]) == 5
    assert float(samples['rpc_collectors_worker_frames{worker="0"}']) == 50
    with pytest.raises(OSError):  # closed with the collector
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_bad_metrics_arguments_are_refused_before_the_env_is_built(tmp_path):
    built = []

    def env():
        built.append(1)
        return CountEnv()

    blocker = tmp_path / "file"
    blocker.write_text("")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cases = [
        ("tensorbored:runs", ValueError, "metrics='tensorbored:runs' is invalid; accepted: None, True, False"),
        (5, ValueError, "metrics=5 is invalid"),
        (TensorBoard(blocker / "tb"), ValueError, "cannot be written"),
        (JsonLines(tmp_path), ValueError, f"metrics=JsonLines({str(tmp_path)!r}): path={str(tmp_path)!r} is a folder"),
        (Prometheus(taken.getsockname()[1]), ValueError, "cannot listen there"),
    ]
    try:
        for metrics, error, message in cases:
            with pytest.raises(error, match=re.escape(message)):
                Collector(env, None, frames_per_batch=10, metrics=metrics)
    finally:
        taken.close()
    assert built == []
    with pytest.raises(ValueError, match=r"Export\(batches\)=0 is invalid; accepted: an int > 0"):
        Export(JsonLines(tmp_path / "m.jsonl"), batches=0)
    with pytest.raises(ValueError, match=r"Export\(seconds\)=0 is invalid; accepted: a number of seconds > 0"):
        Export(JsonLines(tmp_path / "m.jsonl"), seconds=0)
    with pytest.raises(ValueError, match="give one interval"):
        Export(JsonLines(tmp_path / "m.jsonl"), seconds=1, batches=1)
    with pytest.raises(ValueError, match=r"Prometheus\(port=0\) is invalid"):
        Prometheus(0)


def test_a_failing_export_warns_once_and_collection_goes_on():
    class Broken:
        def log_scalar(self, name, value, step=None):
            raise OSError("disk full")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with collector(metrics=Export(Broken(), batches=1)) as c:
            batches = list(c)
    assert len(batches) == 5
    said = [str(w.message) for w in caught if "metrics:" in str(w.message)]
    assert len(said) == 1 and "Broken() failed (OSError: disk full); collection goes on" in said[0]


@pytest.mark.parametrize("module, target", [("tensorboard", "tensorboard:runs"), ("prometheus_client", "prometheus:9")])
def test_a_missing_extra_is_named(monkeypatch, module, target):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    with pytest.raises(ImportError, match=rf"needs the {module} package: pip install 'rpc_collectors\[metrics\]'"):
        collector(metrics=target)


def test_a_batch_of_lazily_stacked_different_shapes_has_its_bytes_counted():
    rows = [TensorDict({"x": torch.zeros(3, 2)}, [3]), TensorDict({"x": torch.zeros(3, 3)}, [3])]
    batch = TensorDict({"obs": LazyStackedTensorDict.lazy_stack(rows, 0), "reward": torch.zeros(2, 3)}, [2, 3])
    assert size_of(batch) == (6 + 9 + 6) * 4
