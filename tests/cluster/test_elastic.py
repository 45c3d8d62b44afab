"""Elastic runs (``elastic=True``): collector processes join a running trainer and leave it.

Every process runs tests/scripts/elastic_trainer.py: the trainer with torchrun-style variables (RANK=0,
WORLD_SIZE=1: no collector ranks of its own), collectors with ``RPC_COLLECTORS_JOIN`` set. The
loopback tests run them all on 127.0.0.1; the namespace test puts the trainer and each collector
on its own "host" (slurm/devcluster.py's HostNetwork) and cuts one host's link.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import devcluster_module
from folders import PYTHONPATH
from procs import ctrl_c_raises, kill_sessions, killed_at_exit
from rpc_collectors import RPCCollector
from rpc_collectors.transport.rendezvous import free_port

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "elastic_trainer.py"
RPC_TIMEOUT_S = 5.0


class Run:
    """A trainer and the collectors started for it; the trainer's JSON lines read as they come."""

    def __init__(self, tmp_path: Path, args: list[str], net=None, trainer_host: int = 1) -> None:
        self.tmp_path, self.args, self.net = tmp_path, args, net
        self.procs: dict[str, subprocess.Popen] = {}
        self.records: list[dict] = []
        self._lines: queue.Queue = queue.Queue()
        host = net.host(trainer_host).address if net else "127.0.0.1"
        self.port = 29590 if net else free_port()
        self.join = f"{host}:{self.port}"
        env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": host, "MASTER_PORT": str(self.port)}
        trainer = self._start("trainer", env, trainer_host, stdout=subprocess.PIPE)
        threading.Thread(target=self._read, args=(trainer,), daemon=True).start()

    def _start(self, name: str, env: dict, host: int | None, **kwargs) -> subprocess.Popen:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
        for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RPC_COLLECTORS_JOIN"):
            base.pop(key, None)
        base["PYTHONPATH"] = PYTHONPATH  # the script imports test modules
        argv = [sys.executable, str(SCRIPT), *self.args]
        with open(self.tmp_path / f"{name}.stderr", "wb") as err:
            options = dict(env={**base, **env, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL, stderr=err,
                           cwd=REPO, start_new_session=True, text=True, preexec_fn=ctrl_c_raises,
                           **{"stdout": subprocess.DEVNULL, **kwargs})
            proc = self.net.popen(host, argv, **options) if self.net else subprocess.Popen(argv, **options)
        self.procs[name] = proc
        return proc

    def collector(self, name: str, host: int | None = None, **env: str) -> subprocess.Popen:
        return self._start(name, {"RPC_COLLECTORS_JOIN": self.join, **env}, host)

    def _read(self, trainer: subprocess.Popen) -> None:
        for line in trainer.stdout:
            if line.startswith("{"):
                record = json.loads(line)
                self.records.append(record)
                self._lines.put(record)
        self._lines.put(None)

    def until(self, condition, timeout: float, what: str) -> dict:
        """The trainer's first next record that meets ``condition``; fails after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {what} within {timeout:.0f} s\n{self.report()}")
            if record is None:
                pytest.fail(f"the trainer ended before {what}\n{self.report()}")
            if condition(record):
                return record

    def wait(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} still ran after {timeout:.0f} s\n{self.report()}")

    def batches(self) -> list[dict]:
        return [r for r in self.records if r["event"] == "batch"]

    def report(self) -> str:
        parts = [f"exit codes: { {n: p.poll() for n, p in self.procs.items()} }", "--- trainer records (tail)"]
        parts += [json.dumps(r) for r in self.records[-10:]]
        for name in self.procs:
            text = (self.tmp_path / f"{name}.stderr").read_text(errors="replace")
            parts += [f"--- {name} stderr (tail)", "\n".join(text.splitlines()[-25:])]
        return "\n".join(parts)

    def kill(self) -> None:
        kill_sessions(list(self.procs.values()))


@pytest.fixture
def runs(tmp_path):
    """Starts runs through ``runs(args, net=None)``; kills whatever is left of them, even after a failure."""
    with killed_at_exit(lambda args, net=None: Run(tmp_path, args, net)) as start:
        yield start


def served_by(record: dict, pid: int) -> list[int]:
    """The slots that the collector with ``pid`` served in a batch record."""
    return [i for i, slot in enumerate(record["slots"]) if slot and slot["pid"] == pid]


def check_batches(run: Run, sync: bool, frames_per_batch: int) -> None:
    """Every batch has the asked shape; sync rounds are whole and carry the trainer's current weights."""
    errors = [r for r in run.records if r["event"] == "error"]
    assert not errors, errors
    for record in run.batches():
        assert record["shape"] == [frames_per_batch], record
        if sync:
            assert sorted(map(int, record["versions"])) == [0, 1], record
            assert all(v == [record["policy_version"]] for v in record["versions"].values()), record


# --------------------------------------------------------------------------- loopback

@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_async_collector_dies_the_other_goes_on_and_a_newcomer_joins(runs):
    run = runs(["--slots", "2", "--async", "--batch-sleep", "0.02", "--rpc-timeout", str(RPC_TIMEOUT_S)])
    first, second = run.collector("c1"), run.collector("c2")
    run.until(lambda r: r["event"] == "batch" and all(r["slots"]), 60, "batch with both collectors in")
    for pid in (first.pid, second.pid):
        run.until(lambda r, pid=pid: r["event"] == "batch" and served_by(r, pid), 30, f"batch from pid {pid}")

    os.kill(first.pid, signal.SIGKILL)
    left = run.until(lambda r: r["event"] == "left", 30, "WorkerLeftWarning")
    assert "is unreachable" in left["message"], left
    # The trainer goes on with the survivor alone.
    for _ in range(5):
        record = run.until(lambda r: r["event"] == "batch", 30, "batch after the death")
        assert [s for s in record["slots"] if s] and all(s["pid"] == second.pid for s in record["slots"] if s), record

    version_at_start = run.batches()[-1]["policy_version"]
    newcomer = run.collector("c3")
    joined = run.until(lambda r: r["event"] == "batch" and served_by(r, newcomer.pid)
                       and str(served_by(r, newcomer.pid)[0]) in r["versions"], 60, "batch from the newcomer")
    slot = str(served_by(joined, newcomer.pid)[0])
    assert joined["versions"][slot][0] >= version_at_start > 0, joined  # it collected with current weights
    check_batches(run, sync=False, frames_per_batch=100)

    run.procs["trainer"].send_signal(signal.SIGINT)
    assert run.wait("trainer", 30) != 0  # KeyboardInterrupt
    for name in ("c2", "c3"):
        assert run.wait(name, 30) == 0, run.report()  # stopped by the trainer's shutdown


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_resumed_elastic_trainer_and_the_collectors_that_join_it_use_the_saved_weights(runs):
    """The state loads into the trainer's policy, as TorchRL's collectors load it, and a collector
    that joins afterwards collects with those weights from its first batch on."""
    run = runs(["--slots", "1", "--frames", "300", "--resume-action", "1", "--rpc-timeout", str(RPC_TIMEOUT_S)])
    run.collector("c1")
    run.until(lambda r: r["event"] == "summary", 90, "summary")
    assert run.wait("trainer", 30) == 0, run.report()
    assert [r["actions"] for r in run.batches()] == [[1]] * 3, run.records


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_sync_spare_takes_a_dead_collectors_slot_and_the_run_finishes(runs):
    run = runs(["--slots", "2", "--frames", "6000", "--batch-sleep", "0.05", "--rpc-timeout", str(RPC_TIMEOUT_S)])
    collectors = [run.collector(f"c{i}") for i in range(3)]
    record = run.until(lambda r: r["event"] == "batch", 60, "first batch")
    serving = {s["pid"] for s in record["slots"]}
    spare = next(p for p in collectors if p.pid not in serving)
    victim = next(p for p in collectors if p.pid in serving)
    os.kill(victim.pid, signal.SIGKILL)
    run.until(lambda r: r["event"] == "left", 30, "WorkerLeftWarning")
    run.until(lambda r: r["event"] == "batch" and served_by(r, spare.pid), 30, "batch from the spare")
    summary = run.until(lambda r: r["event"] == "summary", 90, "summary")
    assert run.wait("trainer", 30) == 0, run.report()
    start = run.records[0]
    assert start["state_workers"] is None and start["traj_id_bounds"] == [0, 0] and start["next_seed"] == 9, start
    late = [r["message"] for r in run.records if r["event"] == "late_load"]
    assert late == ["load_state_dict on an elastic collector must come before its first batch"], run.records[:3]
    assert summary["frames"] == 6000
    assert sorted(summary["worker_restarts"]) == [0, 1], summary
    check_batches(run, sync=True, frames_per_batch=100)
    survivors = [p for p in collectors if p is not victim]
    assert all(p.wait(timeout=30) == 0 for p in survivors), run.report()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_elastic_batches_come_through_shared_memory_whole_also_from_a_newcomer(runs, sync):
    """Collectors on the trainer's host send their batches through shared-memory slots, checked
    frame by frame by the trainer; a newcomer in a dead collector's slot gets slots of its own."""
    args = ["--slots", "2", "--obs-size", "500", "--frames-per-batch", "200", "--rpc-timeout", str(RPC_TIMEOUT_S)]
    run = runs(args + ([] if sync else ["--async"]))
    first, second = run.collector("c1"), run.collector("c2")
    both_shm = lambda r, pids: (r["event"] == "batch" and r["paths"] == ["shm", "shm"]  # noqa: E731
                                and {s["pid"] for s in r["slots"] if s} == pids)
    run.until(lambda r: both_shm(r, {first.pid, second.pid}), 60, "batches from both through shared memory")
    os.kill(first.pid, signal.SIGKILL)
    run.until(lambda r: r["event"] == "left", 30, "WorkerLeftWarning")
    newcomer = run.collector("c3")
    run.until(lambda r: both_shm(r, {second.pid, newcomer.pid}), 60, "the newcomer's batches through shared memory")
    for _ in range(3):
        run.until(lambda r: both_shm(r, {second.pid, newcomer.pid}), 30, "more batches")
    errors = [r for r in run.records if r["event"] == "error"]
    assert not errors, errors


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_joiner_whose_batches_differ_is_refused_and_the_run_goes_on(runs):
    """A collector whose env gives 5 floats instead of 4 leaves its slot with a warning naming
    what differs; the batches the trainer yields keep the run's layout."""
    run = runs(["--slots", "2", "--obs-size", "4", "--batch-sleep", "0.02", "--rpc-timeout", str(RPC_TIMEOUT_S)])
    first = run.collector("c1")
    run.collector("c2")
    run.until(lambda r: r["event"] == "batch" and all(r["slots"]), 60, "batch with both collectors in")
    wrong = run.collector("c3", ELASTIC_OBS_SIZE="5")  # a spare, until a slot falls vacant
    time.sleep(2)  # let it join as a spare
    os.kill(first.pid, signal.SIGKILL)
    lefts = [run.until(lambda r: r["event"] == "left", 30, "WorkerLeftWarning") for _ in range(2)]
    assert "is unreachable" in lefts[0]["message"], lefts
    assert "delivered a batch unlike the run's: " in lefts[1]["message"], lefts
    assert "observation of shape [50, 5] instead of [50, 4]" in lefts[1]["message"], lefts
    newcomer = run.collector("c4")
    run.until(lambda r: r["event"] == "batch" and served_by(r, newcomer.pid), 60, "batch from a good newcomer")
    assert wrong.wait(timeout=30) is not None, "the refused collector kept running"
    check_batches(run, sync=True, frames_per_batch=100)


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_an_evicted_collector_exits_once_it_runs_again(runs, tmp_path):
    """SIGSTOPped past rpc_timeout, a collector loses its slot to the spare; continued, it finds
    itself evicted and exits within rpc_timeout (and a ping), saying so."""
    run = runs(["--slots", "1", "--batch-sleep", "0.02", "--rpc-timeout", str(RPC_TIMEOUT_S)])
    first = run.collector("c1")
    run.until(lambda r: r["event"] == "batch" and served_by(r, first.pid), 60, "batch from the first collector")
    spare = run.collector("c2")
    time.sleep(2)  # let it join as a spare
    os.kill(first.pid, signal.SIGSTOP)
    run.until(lambda r: r["event"] == "left", 30, "WorkerLeftWarning")
    run.until(lambda r: r["event"] == "batch" and served_by(r, spare.pid), 30, "batch from the spare")
    os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=RPC_TIMEOUT_S + 10) == 1, run.report()
    err = (tmp_path / "c1.stderr").read_text()
    assert "the trainer evicted this collector" in err, err
    run.until(lambda r: r["event"] == "batch" and served_by(r, spare.pid), 30, "batches go on")


@pytest.mark.multiprocess
@pytest.mark.timeout(60)
def test_no_collector_within_join_timeout_is_a_clear_error(runs, tmp_path):
    run = runs(["--slots", "2", "--join-timeout", "3"])
    assert run.wait("trainer", 30) == 1, run.report()
    err = (tmp_path / "trainer.stderr").read_text()
    assert "TimeoutError: no collector joined within join_timeout=3.0 s" in err, err
    assert f"RPC_COLLECTORS_JOIN={run.join}" in err, err


def test_bad_elastic_arguments_are_refused_before_any_process_starts(monkeypatch):
    with pytest.raises(ValueError, match=r"elastic=True needs .*accepted with launcher='local'"):
        RPCCollector("CartPole-v1", frames_per_batch=10, num_collectors=2, launcher="local", elastic=True)
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"weight_transport='shm' does not work with elastic=True.*'auto' or 'rpc'"):
        RPCCollector("CartPole-v1", frames_per_batch=10, num_collectors=2, launcher="torchrun", elastic=True,
                     weight_transport="shm")
    with pytest.raises(ValueError, match=r"num_collectors=None: give the number .*collector slots"):
        RPCCollector("CartPole-v1", frames_per_batch=10, launcher="torchrun", elastic=True)
    with pytest.raises(ValueError, match="join_timeout=0 is invalid"):
        RPCCollector("CartPole-v1", frames_per_batch=10, num_collectors=2, launcher="torchrun", elastic=True,
                     join_timeout=0)
    monkeypatch.setenv("RPC_COLLECTORS_JOIN", "127.0.0.1:1")
    with pytest.raises(ValueError, match="RPC_COLLECTORS_JOIN is set.*needs elastic=True"):
        RPCCollector("CartPole-v1", frames_per_batch=10, num_collectors=2)
    monkeypatch.setenv("RPC_COLLECTORS_JOIN", "no-port")
    with pytest.raises(ValueError, match="RPC_COLLECTORS_JOIN='no-port' is invalid; accepted: <host>:<port>"):
        RPCCollector("CartPole-v1", frames_per_batch=10, num_collectors=2, elastic=True)


# --------------------------------------------------------------------------- namespace hosts

@pytest.fixture
def hosts():
    """Four namespace hosts: the trainer on 1, collectors on 2 and 3, a newcomer on 4."""
    with devcluster_module.host_network(4, "rpcc-el", "10.82.0") as network:
        yield network


@pytest.mark.cluster
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_cut_host_leaves_and_a_collector_on_a_third_host_joins(hosts, runs):
    run = runs(["--slots", "2", "--frames", "8000", "--batch-sleep", "0.05", "--rpc-timeout", str(RPC_TIMEOUT_S)],
               net=hosts)
    run.collector("h2", host=2)
    run.collector("h3", host=3)
    record = run.until(lambda r: r["event"] == "batch", 60, "first batch")
    addresses = [s["address"] for s in record["slots"]]
    assert sorted(addresses) == [hosts.host(2).address, hosts.host(3).address], record
    cut_slot = addresses.index(hosts.host(3).address)
    cut_rank = record["slots"][cut_slot]["rank"]

    hosts.cut(3)
    left = run.until(lambda r: r["event"] == "left", RPC_TIMEOUT_S + 20, "WorkerLeftWarning after the cut")
    assert f"collector worker {cut_slot} (rank {cut_rank}) did not answer within rpc_timeout=5.0 s" in left["message"], left
    version_at_join = max(r["policy_version"] for r in run.batches())

    run.collector("h4", host=4)
    joined = run.until(lambda r: r["event"] == "batch" and r["slots"][cut_slot]["address"] == hosts.host(4).address,
                       60, "batch from the collector on host 4")
    assert joined["slots"][1 - cut_slot]["address"] == hosts.host(2).address, joined
    assert joined["versions"][str(cut_slot)] == [joined["policy_version"]], joined  # the current weights
    assert joined["policy_version"] > version_at_join, joined
    summary = run.until(lambda r: r["event"] == "summary", 120, "summary")
    assert run.wait("trainer", 30) == 0, run.report()
    assert summary["frames"] == 8000 and summary["worker_restarts"][cut_slot] == 1 == sum(summary["worker_restarts"]), summary
    check_batches(run, sync=True, frames_per_batch=100)
    assert run.wait("h2", 30) == 0 and run.wait("h4", 30) == 0, run.report()
    # The cut collector finds its trainer unreachable and exits on its own.
    assert run.wait("h3", 3 * RPC_TIMEOUT_S + 15) == 1, run.report()


def test_a_new_elastic_group_forgets_the_ranks_an_earlier_one_evicted():
    """Ranks count from 1 in every group: a trainer process that runs a second elastic collector
    (one after the other) must not take its first collectors for ones it evicted before."""
    from rpc_collectors.transport import membership

    membership._evicted.add(1)  # what the first group's eviction of rank 1 left
    try:
        membership.listen(lambda rank: None)  # the next group's pool
        assert membership.is_member(1)
    finally:
        membership.listen(None)
        membership._evicted.discard(1)
