"""Batches from workers on other hosts: over each worker's TCP doorbell, straight into the trainer's slots.

Three namespace hosts (slurm/devcluster.py's ``HostNetwork``, namespaces ``rpcc-dh-*``, subnet
10.84.0.0/24): the trainer (rank 0) in host 1, collector servers in hosts 2 and 3, each under
a host name of its own (``unshare --uts``), so the collector sees three machines, as it would
on a cluster. Every rank runs tests/scripts/data_plane_hosts_trainer.py, which checks every frame of
every batch with tests/transport/test_data_plane.py's ``PixelEnv`` and ``Checker``.

Needs root (CI runs as root): without it the tests fail rather than skip.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import devcluster_module
from devcluster_module import namespace_pids
from folders import PYTHONPATH
from procs import kill_sessions, killed_at_exit

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "data_plane_hosts_trainer.py"
PREFIX, SUBNET = "rpcc-dh", "10.84.0"
MASTER_PORT = 29584
RUN_TIMEOUT_S = 120

pytestmark = [pytest.mark.cluster, pytest.mark.multiprocess, pytest.mark.timeout(240)]


class Run:
    """The three ranks of one run; rank 0's stdout (JSON lines) and every rank's stderr in files."""

    def __init__(self, net, logdir: Path, *args: str) -> None:
        self.logdir, self.procs = logdir, []
        env = devcluster_module.torchrun_env(3, net.host(1).address, MASTER_PORT)
        env["PYTHONPATH"] = f"{PYTHONPATH}:{os.environ.get('PYTHONPATH', '')}"
        for rank in range(3):
            argv = [sys.executable, str(SCRIPT), *args]
            if rank > 0:  # a machine of its own name: the collector must not take it for the trainer's
                argv = ["unshare", "--uts", "sh", "-c", f'hostname dh-host{rank + 1} && exec "$@"', "sh", *argv]
            with open(logdir / f"rank{rank}.out", "wb") as out, open(logdir / f"rank{rank}.err", "wb") as err:
                self.procs.append(net.popen(
                    rank + 1, argv, env={**env, "RANK": str(rank)}, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, cwd=REPO, start_new_session=True,
                ))

    def records(self) -> list[dict]:
        text = (self.logdir / "rank0.out").read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def record(self, event: str, timeout: float) -> dict:
        """The trainer's first ``event`` record; fails after ``timeout`` s without one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = self.procs[0].poll() is not None  # before reading: a record printed at its end is read
            found = [r for r in self.records() if r["event"] == event]
            if found:
                return found[0]
            if ended:
                break
            time.sleep(0.1)
        pytest.fail(f"the trainer printed no {event!r} record\n{self.report()}")

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> list[int]:
        try:
            return [proc.wait(timeout=max(1.0, timeout)) for proc in self.procs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout:.0f} s\n{self.report()}")

    def report(self) -> str:
        parts = [f"exit codes: {[p.poll() for p in self.procs]}"]
        for rank in range(3):
            for kind in ("out", "err"):
                path = self.logdir / f"rank{rank}.{kind}"
                text = path.read_text(errors="replace") if path.exists() else ""
                parts += [f"--- rank {rank} std{kind} (tail)", "\n".join(text.splitlines()[-30:])]
        return "\n".join(parts)

    def kill(self) -> None:
        kill_sessions(self.procs)


@pytest.fixture
def net() -> Iterator:
    with devcluster_module.host_network(3, PREFIX, SUBNET) as network:
        yield network


@pytest.fixture
def run(net, tmp_path) -> Iterator:
    with killed_at_exit(lambda *args: Run(net, tmp_path, *args)) as start:
        yield start


@pytest.mark.parametrize(("mode", "num_envs"), [("--sync", None), ("--no-sync", 3)], ids=["sync-single", "async-vector"])
def test_batches_from_other_hosts_hold_what_their_envs_made_kept_or_not(net, run, mode, num_envs):
    args = [mode, "--batches", "6", "--keep", "20"] + ([] if num_envs is None else ["--num-envs", str(num_envs)])
    r = run(*args)
    codes = r.wait()
    assert codes == [0, 0, 0], r.report()
    start, end = r.record("start", 1), r.record("end", 1)
    assert start["hosts"] == ["dh-host2", "dh-host3"]
    assert start["paths"] == ["tcp", "tcp"], start  # each worker's batches came over its own connection
    # async: each worker collects its next batch while the last one crosses (two requests in flight)
    assert start["in_flight"] == ([1, 1] if mode == "--sync" else [2, 2]), start
    # every frame checked: 6 batches as they came, then 20 kept in a list and checked at the end
    assert end == {"event": "end", "checked": 6, "kept": 20, "streams": 2 * (num_envs or 1)}
    assert not any(namespace_pids(net).values())


def test_worker_killed_on_another_host_gives_one_error_and_no_torn_batch(net, run):
    r = run("--no-sync", "--endless")
    start = r.record("start", 90)
    assert start["paths"] == ["tcp", "tcp"], start
    time.sleep(1.0)  # batches are streaming from both hosts
    os.kill(start["pids"][1], signal.SIGKILL)  # one pid namespace: the test reaches every host's processes
    codes = r.wait(60)
    error = r.record("error", 1)
    # every batch yielded before the error passed the frame-by-frame check (a torn one would have failed it)
    assert error["worker_id"] == 1 and "unreachable" in error["reason"], error
    assert error["checked"] > 2, error
    assert codes[0] == 0, r.report()
    assert not any(namespace_pids(net).values()), "a process outlived the run"
