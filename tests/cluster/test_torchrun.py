"""A real torchrun run of the launch script: trainer on rank 0, collector servers on ranks 1 and 2."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from procs import descendants, run_in_session, wait_gone
from rpc_collectors.transport.rendezvous import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(120)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_torchrun_three_ranks_collect_update_and_exit_zero():
    torchrun = shutil.which("torchrun") or [sys.executable, "-m", "torch.distributed.run"]
    cmd = ([torchrun] if isinstance(torchrun, str) else torchrun) + [
        "--nproc-per-node=3", f"--master-port={free_port()}", os.path.join(ROOT, "launch", "collect.py"),
        "--frames", "1200", "--frames-per-batch", "200",
    ]
    before = descendants()
    run = run_in_session(cmd, timeout=100)
    stdout, stderr = run.stdout, run.stderr
    assert run.returncode == 0, stderr[-3000:]
    summaries = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1, "only the trainer (rank 0) prints a summary"
    summary = summaries[0]
    assert summary["launcher"] == "torchrun" and summary["workers"] == 2
    assert summary["frames"] == 1200
    assert summary["policy_versions"] == [0, 1]
    assert "exitcode" not in stderr  # torchrun reports no failed rank
    assert not wait_gone(descendants() - before, 10)
