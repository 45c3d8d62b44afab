"""A collector the user never shuts down: the script ends, and the collector's finalizer closes it
at interpreter exit, before what it uses (the shared spawner, Ray) stops. The script exits 0,
says nothing on stderr, and leaves no process behind (``unshut_collector.py`` is the script)."""
from __future__ import annotations

import os
import sys

import pytest

from folders import PYTHONPATH, SCRIPTS
from procs import run_marked

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]



def run_unshut(kind: str, *args: str):
    """Run ``unshut_collector.py kind *args``; its output and the processes it left alive."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("RAY_ADDRESS", None)
    return run_marked([sys.executable, str(SCRIPTS / "unshut_collector.py"), kind, *args], 240, env)


@pytest.mark.parametrize("kind", ["collector", "multi-sync", "multi-async", "rpc-node", "distributed-mp", "async-batched"])
def test_a_collector_never_shut_down_exits_cleanly(kind):
    proc, left = run_unshut(kind)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["done"]
    assert proc.stderr == ""
    assert not left, f"processes left behind: {left}"
