"""``collector.trace(path, rounds=N)``: a Chrome trace of N rounds across the trainer and its workers.

The file is checked as a viewer reads it (JSON, one track per process, complete events per
thread), and each worker's spans against a single-process ``Collector`` on the same
deterministic envs: one policy call and one env step per step of the window, no more.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import threading
import time
import warnings
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from conftest import CountEnv, TDCountEnv
from rpc_collectors import Collector, MultiSyncCollector, RPCCollector
from rpc_collectors.core.errors import Failure
from rpc_collectors.core.protocol import ProcessSpans, WorkerCalls
from rpc_collectors.single_process.run_meter import RunMeter
from rpc_collectors.trainer import clock_offsets, timeline
from rpc_collectors.trainer.trace_window import TraceWindow

FRAMES_PER_WORKER = 6
LABEL = re.compile(r"clock offset ([-+0-9.]+) ms \u00b1 ([0-9.]+) ms")


class CountPolicy(nn.Module):
    """Action = argmax(W obs + b) on CountEnv's three floats."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation.float()).argmax(-1)


def read(path: Path) -> dict:
    """The trace as a viewer reads it: ``{process name: {thread name: [events in file order]}}``."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    out: dict = {name: {} for name in names.values()}
    for e in events:
        if e["ph"] == "X":
            out[names[e["pid"]]].setdefault(threads[e["pid"], e["tid"]], []).append(e)
    return out


def labels(path: Path) -> dict:
    """``{process name: (offset ms, error ms)}`` of the workers' clock labels."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    found = {names[e["pid"]]: LABEL.search(e["args"]["labels"]) for e in events if e["name"] == "process_labels"}
    return {name: (float(m.group(1)), float(m.group(2))) for name, m in found.items()}


def assert_in_order_without_overlap(trace: dict) -> None:
    for process, threads in trace.items():
        for thread, spans in threads.items():
            assert all(s["dur"] >= 0 for s in spans), (process, thread)
            for before, after in zip(spans, spans[1:]):  # back to back at most (ts, dur: rounded to the ns)
                assert before["ts"] + before["dur"] <= after["ts"] + 0.002, (process, thread, before, after)


def single_process_phases(make_env, frames: int, batches: int) -> Counter:
    """The phases a single-process Collector marks over ``batches`` batches of ``frames``."""
    collector = Collector(make_env, policy=None, frames_per_batch=frames, total_frames=frames * batches)
    collector.rollout.clock.spans = deque()
    for _ in collector:
        pass
    collector.shutdown()
    return Counter(phase for phase, _, _ in collector.rollout.clock.spans)


@pytest.mark.multiprocess
@pytest.mark.parametrize("make_env, envs", [(CountEnv, 1), (functools.partial(TDCountEnv, 2), 2)],
                         ids=["one-env", "two-envs"])
def test_a_trace_of_two_rounds_holds_the_trainer_and_one_policy_call_and_env_step_per_worker_step(
        make_env, envs, tmp_path, no_leftover_processes):
    path, rounds = tmp_path / "rounds.json", 2
    with MultiSyncCollector([make_env] * 2, policy=None, frames_per_batch=2 * FRAMES_PER_WORKER, total_frames=-1,
                            cat_results="stack") as c:
        c.trace(path, rounds=rounds)
        for i, _ in enumerate(c):
            if i == 0:
                assert not path.exists()  # written once the window's last batch is handed out
            if i == rounds + 1:
                break
        after = c.get_distant_attr("rollout.clock.spans")
    assert after == [None, None]  # the window closed on the workers
    trace = read(path)
    assert sorted(trace) == sorted(f"{who} ({c.infos[0]['host']})" for who in ("trainer", "worker 0", "worker 1"))
    expected = single_process_phases(make_env, FRAMES_PER_WORKER, rounds)
    steps = rounds * FRAMES_PER_WORKER // envs
    assert expected == {"idle": rounds, "policy": steps, "env": steps, "write": rounds}
    for worker in ("worker 0", "worker 1"):
        (rollout,) = [spans for name, spans in trace.items() if name.startswith(worker)][0].values()
        counts = Counter(s["name"] for s in rollout)
        assert {phase: counts[phase] for phase in expected} == expected
        assert counts["write"] == rounds  # each batch of the window built and written once
    (trainer,) = [threads for name, threads in trace.items() if name.startswith("trainer")]
    spans = [s for thread in trainer.values() for s in thread]
    assert Counter(s["name"] for s in spans)["hand-out"] == rounds
    assert sorted(s["args"]["answered"] for s in spans if s["name"] == "wait") == [0, 0, 1, 1]
    assert_in_order_without_overlap(trace)
    for offset, error in labels(path).values():  # one host: one monotonic clock
        assert abs(offset) <= error


@pytest.mark.multiprocess
def test_an_async_collector_traces_its_pushes_and_each_batch_it_hands_out(tmp_path, no_leftover_processes):
    path, rounds = tmp_path / "async.json", 3
    with RPCCollector(CountEnv, CountPolicy(), num_collectors=2, sync=False, frames_per_batch=8,
                      launcher="local", rpc_timeout=30) as c:
        c.trace(path, rounds=rounds)
        for i, _ in enumerate(c):
            c.update_policy_weights_()
            if i == rounds:
                break
    trace = read(path)
    (trainer,) = [threads for name, threads in trace.items() if name.startswith("trainer")]
    spans = [s for thread in trainer.values() for s in thread]
    names = Counter(s["name"] for s in spans)
    assert names["hand-out"] == rounds  # the window closed as its last batch was handed out, before the push after it
    assert [s["args"]["version"] for s in spans if s["name"] == "push"] == list(range(1, rounds))
    assert [s["args"]["workers"] for s in spans if s["name"] == "push wait"] == [2] * (rounds - 1)
    assert [name.split(" (")[0] for name in trace] == ["trainer", "worker 0", "worker 1"]
    assert_in_order_without_overlap(trace)


@pytest.mark.multiprocess
def test_a_collector_that_refuses_enable_profile_traces_at_most_max_spans_per_thread(tmp_path, no_leftover_processes):
    path = tmp_path / "bounded.json"
    with MultiSyncCollector([CountEnv] * 2, policy=None, frames_per_batch=2 * FRAMES_PER_WORKER, total_frames=-1) as c:
        with pytest.raises(ValueError, match="enable_profile"):
            c.enable_profile()
        c.trace(path, rounds=2, max_spans=3)
        for i, _ in enumerate(c):
            if i == 1:
                break
    trace = read(path)
    assert len(trace) == 3
    for threads in trace.values():
        for spans in threads.values():
            assert len(spans) <= 3
    for name, threads in trace.items():
        if name.startswith("worker"):  # the newest kept: the last step, then the batch's write
            assert [s["name"] for s in threads["rollout"]] == ["policy", "env", "write"]


def test_a_workers_row_is_back_to_back_and_its_write_spans_hold_the_write_seconds_of_its_metrics(tmp_path):
    path, rounds = tmp_path / "rows.json", 2
    with MultiSyncCollector([CountEnv] * 2, policy=None, frames_per_batch=2 * FRAMES_PER_WORKER, total_frames=-1,
                            launcher="debug") as c:
        c.trace(path, rounds=rounds)  # before the first batch: the window holds every write
        for i, _ in enumerate(c):
            if i == rounds - 1:
                break
        workers = c.metrics().workers
    trace = read(path)
    for worker in workers:
        (rollout,) = [threads for name, threads in trace.items() if name.startswith(f"worker {worker.worker_id} ")][0].values()
        spans = [(s["name"], round(s["ts"] * 1e3), round((s["ts"] + s["dur"]) * 1e3)) for s in rollout]  # ns since the opening
        assert [name for name, _, _ in spans].count("write") == rounds
        # one clock read ends a span and begins the next
        assert all(before[2] == after[1] for before, after in zip(spans, spans[1:])), spans
        assert worker.write_s == sum(end - start for name, start, end in spans if name == "write") / 1e9


def test_of_two_threads_calling_trace_at_once_one_opens_the_window_and_the_other_is_refused(tmp_path, monkeypatch):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    with MultiSyncCollector([CountEnv] * 2, policy=None, frames_per_batch=4, total_frames=-1, launcher="debug") as c:
        opening, asked, refused = c.tracing.open, [], []
        go_on = threading.Event()  # both calls asked the workers, or one of them was refused

        def open_slowly(keep: int) -> None:  # the workers answer once the other call got as far as it can
            asked.append(keep)
            if len(asked) == 2:
                go_on.set()
            go_on.wait(timeout=30)
            opening(keep)

        def call(path: Path) -> None:
            barrier.wait()
            try:
                c.trace(path)
            except RuntimeError as err:
                refused.append(err)
                go_on.set()

        monkeypatch.setattr(c.tracing, "open", open_slowly)
        barrier = threading.Barrier(2, timeout=30)
        threads = [threading.Thread(target=call, args=(path,)) for path in paths]
        try:
            for thread in threads:
                thread.start()
        finally:
            for thread in threads:
                thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        next(iter(c))  # the window's one batch
        written = [path for path in paths if path.exists()]
        assert len(asked) == 1 and len(written) == 1 and len(refused) == 1
        assert str(refused[0]) == (f"a trace is already open: {str(written[0])!r} is written once its batches are "
                                   "handed out; call trace() again after that")
        again = tmp_path / "again.json"
        c.trace(again)  # the window closed with its file written: the next one opens
        next(iter(c))
        assert again.exists()


@pytest.mark.parametrize("kwargs, words", [
    ({"rounds": 0}, "rounds=0 is invalid; accepted: an int > 0"),
    ({"rounds": 1.5}, "rounds=1.5 is invalid"),
    ({"max_spans": 0}, "max_spans=0 is invalid"),
    ({"path": "/nonexistent-folder/t.json"}, "cannot be written in '/nonexistent-folder'"),
    ({"path": "."}, "is a folder"),
])
def test_bad_trace_arguments_fail_before_any_worker_is_asked(kwargs, words, tmp_path):
    with MultiSyncCollector([CountEnv] * 2, policy=None, frames_per_batch=4, total_frames=8, launcher="debug") as c:
        with pytest.raises(ValueError, match=re.escape(words)):
            c.trace(**{"path": tmp_path / "t.json", **kwargs})
        assert c.get_distant_attr("rollout.clock.spans") == [None, None] and c._meter.spans is None
        assert sum(b.numel() for b in c) == 8  # collection as without it


def test_a_trace_that_cannot_be_written_is_given_up_with_a_warning_and_collection_goes_on(tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    with MultiSyncCollector([CountEnv] * 2, policy=None, frames_per_batch=4, total_frames=16, launcher="debug") as c:
        c.trace(folder / "t.json", rounds=1)
        shutil.rmtree(folder)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            frames = sum(b.numel() for b in c)
    assert frames == 16
    assert [str(w.message) for w in caught if "trace window" in str(w.message)] == [
        f"the trace window for {str(folder / 't.json')!r} was given up (FileNotFoundError: [Errno 2] No such file or "
        f"directory: {str(folder / 't.json')!r}); collection goes on"]


@pytest.mark.multiprocess
def test_a_nodes_trace_holds_its_waits_and_its_local_workers_spans(tmp_path, no_leftover_processes):
    path, rounds = tmp_path / "node.json", 2
    with RPCCollector(CountEnv, None, num_collectors=1, collector_class="sync", num_workers_per_collector=2,
                      frames_per_batch=2 * FRAMES_PER_WORKER, launcher="local", rpc_timeout=30) as c:
        c.trace(path, rounds=rounds)
        for i, _ in enumerate(c):
            if i == rounds:
                break
    trace = read(path)
    assert [name.split(" (")[0] for name in trace] == [
        "trainer", "node 0", "node 0's local worker 0", "node 0's local worker 1"]
    node = [threads for name, threads in trace.items() if name.startswith("node 0 ")][0]
    assert Counter(s["name"] for spans in node.values() for s in spans)["hand-out"] == rounds
    expected = single_process_phases(CountEnv, FRAMES_PER_WORKER, rounds)
    for name, threads in trace.items():
        if "local worker" in name:
            counts = Counter(s["name"] for s in threads["rollout"])
            assert {phase: counts[phase] for phase in expected} == expected and counts["write"] == rounds
    assert_in_order_without_overlap(trace)


# --------------------------------------------------------------------------- clocks and the file


def test_the_offset_comes_from_the_shortest_round_trip():
    # the worker's clock runs 1000 ns ahead; the answer waited 50 ns to leave, then 10 ns on the way back
    samples = [(0, 1000 + 90, 100), (500, 1000 + 505, 515), (1000, 1000 + 1300, 1400)]
    assert clock_offsets.offset_of(samples) == (1000 + 505 - 507, 15)  # off by 2 ns, within half its round trip


class FarClock:
    """A pool of workers whose clocks run ``ahead`` ns ahead of this process's, answering at once."""

    def __init__(self, ahead: list[int]) -> None:
        self.ahead = ahead

    @property
    def calls(self) -> FarClock:
        return self

    def clock(self, worker_id: int) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(time.monotonic_ns() + self.ahead[worker_id])
        return fut


def test_measured_offsets_put_each_workers_clock_back_on_the_trainers():
    pool = FarClock([0, 10**12, -5 * 10**9])
    gather = lambda calls, sent, recover: [sent[i].wait() for i in sorted(calls)]  # noqa: E731
    offsets = clock_offsets.measure(pool, gather, pool, [0, 1, 2])
    assert sorted(offsets) == [0, 1, 2]
    for worker_id, (offset, round_trip) in offsets.items():
        assert abs(offset - pool.ahead[worker_id]) <= round_trip // 2 + 1


def test_the_file_names_nodes_their_local_workers_and_ranks_and_moves_spans_onto_one_clock():
    offset = 10**12
    node = ProcessSpans((), "h2", 20, {"MainThread": [("wait", offset + 1000, offset + 4000, {"answered": 0})]})
    local = ProcessSpans((), "h2", 21, {"rollout": [("policy", offset + 1500, offset + 2000)]}).moved(0, 0, 0)
    worker = ProcessSpans((), "h3", 30, {"rollout": [("env", 2500, 3000)]})
    trainer = ProcessSpans((), "h1", 10, {"MainThread": [("wait", 0, 5000)]})
    processes = [trainer, node.moved(1, offset, 7), local.moved(1, offset, 7), worker.moved(0, 0, 3)]
    events = timeline.events(processes, -1000)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "trainer (h1)", 2: "node 1 (h2)", 3: "node 1's local worker 0 (h2)", 1: "worker 0 (h3)"}
    spans = {(e["pid"], e["name"]): (e["ts"], e["dur"]) for e in events if e["ph"] == "X"}
    assert spans == {(0, "wait"): (1.0, 5.0), (2, "wait"): (2.0, 3.0), (3, "policy"): (2.5, 0.5), (1, "env"): (3.5, 0.5)}
    # a span that began before the window opened is shown from its opening
    assert [(e["ts"], e["dur"]) for e in timeline.events(processes, 2000) if e["name"] == "wait"] == [(0.0, 3.0), (0.0, 2.0)]
    assert [e["args"] for e in events if e["ph"] == "X" and e["pid"] == 2] == [{"answered": 0}]


def test_a_worker_lost_while_a_window_opens_is_left_out_and_the_others_are_traced():
    asked: list = []

    def gather(calls: dict, recover: bool) -> list:
        asked.append(sorted(calls))
        if 1 in calls:
            raise Failure(1, "died with exit code -9 (SIGKILL)")
        return [None for _ in calls]

    front = SimpleNamespace(num_workers=3, roster=SimpleNamespace(serving=lambda: [0, 1, 2]), gather=gather,
                            deferred=WorkerCalls(lambda i, method, *args: (i, method, args)))
    meter = RunMeter(on=False)
    window = TraceWindow(front, meter)
    window.open(10)
    assert asked == [[0, 1, 2], [0, 2]] and window.opened == [0, 2]
    assert meter.spans is not None and meter.spans.maxlen == 10


@pytest.mark.multiprocess
def test_a_collector_without_metrics_traces_its_workers_steps_and_stays_without_metrics(tmp_path, no_leftover_processes):
    path, rounds = tmp_path / "no-metrics.json", 2
    with MultiSyncCollector([CountEnv] * 2, policy=None, frames_per_batch=2 * FRAMES_PER_WORKER, total_frames=-1,
                            metrics=False) as c:
        c.trace(path, rounds=rounds)
        for i, _ in enumerate(c):
            if i == rounds:
                break
        clocks = c.get_distant_attr("rollout.clock")
    assert [type(clock).__name__ for clock in clocks] == ["StoppedClock"] * 2  # off again once the window closed
    expected = single_process_phases(CountEnv, FRAMES_PER_WORKER, rounds)
    for name, threads in read(path).items():
        if name.startswith("worker"):
            counts = Counter(s["name"] for s in threads["rollout"])
            assert {phase: counts[phase] for phase in expected} == expected, name


def test_a_span_another_thread_adds_while_the_window_closes_leaves_the_spans_taken_whole():
    meter = RunMeter()
    meter.spans = opened = deque(maxlen=10)

    class Late(dict):
        """Args whose truth take_spans() asks as it reads the spans: meanwhile another thread's span lands."""

        def __bool__(self) -> bool:
            opened.append(("rpc-collectors-inference", "forward", 3, 4, None))
            return True

    opened.append(("MainThread", "wait", 1, 2, Late(answered=0)))
    assert meter.take_spans() == {"MainThread": [("wait", 1, 2, {"answered": 0})]}
    assert meter.spans is None
