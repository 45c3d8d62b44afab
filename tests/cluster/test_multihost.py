"""RPCCollector across separate hosts without SLURM: torchrun-style variables, network namespaces.

Three "hosts" (slurm/devcluster.py's ``HostNetwork``, namespaces ``rpcc-mh-*``, subnet
10.81.0.0/24, the root namespace attached at 10.81.0.254 so no test packet leaves the machine):
the trainer (rank 0) runs in host 1 at 10.81.0.1, collector servers (ranks 1 and 2) in hosts 2
and 3. Every rank runs tests/scripts/multihost_trainer.py with RANK, WORLD_SIZE=3, MASTER_ADDR,
MASTER_PORT and its namespace's TP_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, as torchrun would set them.

Needs root (CI runs as root): without it the tests fail rather than skip.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

import devcluster_module
from devcluster_module import namespace_pids
from procs import kill_sessions, killed_at_exit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "multihost_trainer.py"
PREFIX, SUBNET = "rpcc-mh", "10.81.0"
MASTER_PORT = 29581  # in host 1's own namespace: nothing else listens there
WORLD_SIZE = 3
TRAINER_HOST, WORKER_HOSTS = 1, (2, 3)  # HostNetwork hosts are 1-based; rank r runs in host r + 1
CUT_RANK = 2  # worker_id 1, in host 3
RPC_TIMEOUT_S = 5.0
EXIT_MARGIN_S = 10.0  # after the RPC timeout: the batch in flight, shutting the agent down, exit
PING_EVERY_S = 5.0  # rpc_collectors.worker.rpc_rank.PING_EVERY: a server checks its trainer this often
WORKER_EXIT_MARGIN_S = 10.0

pytestmark = [pytest.mark.cluster, pytest.mark.multiprocess]


class Ranks:
    """The three processes of one run; stdout of rank 0 read line by line, stderr to files."""

    def __init__(self, net, logdir: Path, *args: str) -> None:
        self.net, self.logdir = net, logdir
        self.procs: list[subprocess.Popen] = []
        self.lines: queue.Queue = queue.Queue()
        self.stdout: list[str] = []
        env = devcluster_module.torchrun_env(WORLD_SIZE, net.host(TRAINER_HOST).address, MASTER_PORT)
        for rank in range(WORLD_SIZE):
            with open(self.stderr_path(rank), "wb") as err:
                self.procs.append(net.popen(
                    rank + 1, [sys.executable, str(SCRIPT), *args], env={**env, "RANK": str(rank)},
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                    stderr=err, text=True, cwd=REPO, start_new_session=True,
                ))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.procs[0].stdout:
            self.stdout.append(line)
            self.lines.put((time.monotonic(), line))
        self.lines.put((time.monotonic(), None))

    def stderr_path(self, rank: int) -> Path:
        return self.logdir / f"rank{rank}.stderr"

    def stderr(self, rank: int) -> str:
        return self.stderr_path(rank).read_text(errors="replace")

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout if line.startswith("{")]

    def next_record(self, timeout: float) -> dict | None:
        """The trainer's next JSON line, None at its end; fails after ``timeout`` s without one."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the trainer printed nothing for {timeout:.0f} s\n{self.report()}")
            if line is None or line.startswith("{"):
                return None if line is None else json.loads(line)

    def report(self) -> str:
        """Exit codes, the trainer's stdout and every rank's stderr (tail), for failure messages."""
        parts = [f"exit codes: {[p.poll() for p in self.procs]}", "--- rank 0 stdout", "".join(self.stdout[-20:])]
        for rank in range(WORLD_SIZE):
            text = self.stderr(rank) if self.stderr_path(rank).exists() else ""
            parts += [f"--- rank {rank} stderr (tail)", "\n".join(text.splitlines()[-30:])]
        return "\n".join(parts)

    def kill(self) -> None:
        """SIGKILL every process group still running and reap it."""
        kill_sessions(self.procs)


@pytest.fixture
def net() -> Iterator:
    """Three namespace hosts; afterwards every process in them is ended and they are deleted."""
    with devcluster_module.host_network(3, PREFIX, SUBNET) as network:
        yield network


@pytest.fixture
def ranks(net, tmp_path) -> Iterator:
    """Starts runs through ``ranks(*args)``; kills whatever of them is left, even after a failure."""
    with killed_at_exit(lambda *args: Ranks(net, tmp_path, *args)) as start:
        yield start


@pytest.mark.timeout(180)
def test_collect_and_update_across_hosts(net, ranks):
    run = ranks("--frames", "800", "--frames-per-batch", "100", "--rpc-timeout", "30")
    try:
        codes = [proc.wait(timeout=120) for proc in run.procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not end within 120 s\n{run.report()}")
    assert codes == [0, 0, 0], run.report()
    records = {r["event"]: r for r in run.records()}
    assert {"start", "summary"} <= set(records), run.report()

    start, summary = records["start"], records["summary"]
    trainer = start["trainer"]
    assert trainer["address"] == net.host(TRAINER_HOST).address
    workers = sorted(start["workers"], key=lambda w: w["rank"])
    assert [w["rank"] for w in workers] == [1, 2]
    # Each worker ran in its own namespace host, on its own address, none on the trainer's.
    assert [w["address"] for w in workers] == [net.host(h).address for h in WORKER_HOSTS], workers
    # The namespaces' own view agrees: each process ran in its host's network namespace.
    netns = {h: os.stat(f"/run/netns/{net.host(h).netns}").st_ino for h in (TRAINER_HOST, *WORKER_HOSTS)}
    assert trainer["netns"] == netns[TRAINER_HOST]
    assert [w["netns"] for w in workers] == [netns[h] for h in WORKER_HOSTS], (workers, netns)
    assert start["weight_transport"] in ("shm", "broadcast")  # namespaces share hostname and boot id

    assert summary["frames"] == 800
    assert summary["batches"] == 8 and summary["workers"] == 2
    assert summary["policy_versions"] == [0, 1] and summary["policy_version"] == 1
    assert summary["trajectories"] > 2

    assert all(not pids for pids in namespace_pids(net).values()), namespace_pids(net)


@pytest.mark.timeout(180)
def test_cut_link_raises_worker_error_and_leaves_nothing(net, ranks):
    run = ranks("--endless", "--frames-per-batch", "100", "--rpc-timeout", str(RPC_TIMEOUT_S))
    start = run.next_record(timeout=90)
    assert start is not None and start["event"] == "start", run.report()
    workers = {w["rank"]: w for w in start["workers"]}
    assert workers[CUT_RANK]["address"] == net.host(CUT_RANK + 1).address
    for _ in range(3):  # collection is under way before the cut
        record = run.next_record(timeout=30)
        assert record is not None and record["event"] == "batch", run.report()

    net.cut(CUT_RANK + 1)
    cut_at = time.monotonic()
    trainer = run.procs[0]
    limit = RPC_TIMEOUT_S + EXIT_MARGIN_S
    try:
        code = trainer.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the trainer still ran {limit:.0f} s after the cut (rpc_timeout={RPC_TIMEOUT_S})\n{run.report()}")
    trainer_exit_s = time.monotonic() - cut_at
    err = run.stderr(0)
    assert code != 0, run.report()
    assert "WorkerError" in err, run.report()
    message = next(line for line in err.splitlines() if "WorkerError:" in line)
    assert f"collector worker {CUT_RANK - 1} " in message and f"rank {CUT_RANK} " in message, message
    assert str(workers[CUT_RANK]["pid"]) in message, message

    # The other worker is stopped by the trainer; the cut one must notice on its own (it pings
    # the trainer every PING_EVERY_S with a timeout of max(rpc_timeout, PING_EVERY_S)).
    worker_limit = PING_EVERY_S + max(RPC_TIMEOUT_S, PING_EVERY_S) + WORKER_EXIT_MARGIN_S
    late = []
    for rank in (1, 2):
        try:
            run.procs[rank].wait(timeout=max(0.0, cut_at + worker_limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            late.append(rank)
    assert not late, (
        f"worker rank(s) {late} still ran {worker_limit:.0f} s after the cut "
        f"(trainer exited after {trainer_exit_s:.1f} s)\n{run.report()}"
    )
    left = {name: pids for name, pids in namespace_pids(net).items() if pids}
    assert not left, f"processes left in the test's namespaces: {left}"
    print(f"trainer exited {trainer_exit_s:.1f} s after the cut; workers by {time.monotonic() - cut_at:.1f} s")
