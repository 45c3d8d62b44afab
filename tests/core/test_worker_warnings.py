"""Worker warnings follow TorchRL's rule (its workers ignore every warning) with the trainer's own
filters on top: an env that warns at construction and at each step says nothing through the
workers by default, and shows or raises as a filter the trainer set before making the collector
asks (``warning_workers.py`` is the user's script; its filter is set after an earlier collector
started the workers' spawner)."""
from __future__ import annotations

import os
import sys

import pytest

from folders import PYTHONPATH, SCRIPTS
from procs import run_in_session

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

MESSAGE = "the env warns"


def run_script(kind: str, user_filter: str, *args: str):
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    env.pop("PYTHONWARNINGS", None)
    proc = run_in_session([sys.executable, str(SCRIPTS / "warning_workers.py"), kind, user_filter, *args], 240, env)
    assert proc.returncode == 0, proc.stderr
    return proc


def check(proc, user_filter: str, workers: int) -> None:
    """What the user asked for, and only that: nothing, each warning (two workers' construction and
    steps), or a worker that raised it."""
    shown = [line for line in proc.stderr.splitlines() if MESSAGE in line]
    if user_filter == "none":
        assert shown == [] and proc.stdout.split() == ["frames", "40"]
    elif user_filter == "always":
        assert sum("at construction" in line for line in shown) == workers
        assert sum("at step" in line for line in shown) >= 40  # each of the 40 frames' steps (more: a step ahead)
        assert proc.stdout.split() == ["frames", "40"]
    else:
        assert proc.stdout.strip() == f"raised: FutureWarning: {MESSAGE} at construction"


@pytest.mark.parametrize("user_filter", ["none", "always", "error"])
@pytest.mark.parametrize("kind", ["multi-sync", "rpc-node", "async-batched"])
def test_worker_warnings_show_as_the_trainers_filters_ask(kind, user_filter):
    proc = run_script(kind, user_filter)
    assert [line for line in proc.stderr.splitlines() if MESSAGE not in line and not line.startswith("  ")] == []
    check(proc, user_filter, workers=2)


def test_torchrls_switch_off_leaves_workers_the_trainers_filters_only(monkeypatch):
    """``torchrl.filter_warnings_subprocess = False``: a worker ignores nothing beyond the trainer's filters."""
    import types
    import warnings

    from rpc_collectors.core import worker_warnings

    assert worker_warnings.for_workers() == (*warnings.filters, worker_warnings.IGNORE_THE_REST)
    monkeypatch.setitem(sys.modules, "torchrl", types.SimpleNamespace(filter_warnings_subprocess=False))
    assert worker_warnings.for_workers() == tuple(warnings.filters)
