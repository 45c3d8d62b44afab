"""Errors a user must act on, as a new user meets them: they name the user's code, the argument
and the value, once, and say what would be accepted."""
from __future__ import annotations

import linecache
import os
import subprocess
import sys
import textwrap

import pytest
from torch import nn

from folders import PYTHONPATH
from procs import run_in_session
from rpc_collectors import Collector, GymEnv, MultiCollector, WorkerError

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(60)]


def run_script(tmp_path, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` as a user's script ``train.py``, in a session of its own (killed afterwards)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    return run_in_session([sys.executable, str(script)], timeout=50, env=dict(
        os.environ, PYTHONPATH=PYTHONPATH))


# ------------------------------------------------------------------ an env that raises at start-up
def test_an_env_that_raises_at_start_up_shows_the_users_file_and_line_once(tmp_path):
    run = run_script(tmp_path, """
        from rpc_collectors import MultiCollector


        def make_env():
            raise RuntimeError("simulator licence not found")


        if __name__ == "__main__":
            MultiCollector([make_env, make_env], None, frames_per_batch=20)
    """)
    assert run.returncode == 1
    err = run.stderr
    user_frame = f'File "{tmp_path / "train.py"}", line 6, in make_env'
    assert err.count(user_frame) == 1, err
    assert err.count('raise RuntimeError("simulator licence not found")') == 1, err
    assert "raised an error during start-up" in err and err.rstrip().endswith("RuntimeError: simulator licence not found")
    assert "rpc_collectors/worker/" not in err, "the worker's frames in the library bury the user's"


def test_a_frame_the_worker_cannot_read_gets_its_source_line_from_the_trainer():
    """A function defined in a notebook cell: the trainer has its source, the worker does not."""
    cell = "<notebook-cell-7>"
    source = "def make_env():\n    raise RuntimeError('simulator licence not found')\n"
    linecache.cache[cell] = (len(source), None, source.splitlines(True), cell)  # as IPython keeps its cells
    namespace: dict = {}
    exec(compile(source, cell, "exec"), namespace)
    try:
        with pytest.raises(WorkerError) as info:
            MultiCollector([namespace["make_env"]] * 2, None, frames_per_batch=20)
    finally:
        del linecache.cache[cell]
    message = str(info.value)
    assert f'File "{cell}", line 2, in make_env\n    raise RuntimeError(\'simulator licence not found\')' in message, message
    assert "channel.py" in info.value.remote_traceback and "channel.py" not in message


# ------------------------------------------------------------------ a policy that returns no action
@pytest.mark.parametrize("collector", ["Collector", "MultiCollector"])
@pytest.mark.parametrize("env, policy, returned, needed", [
    ("CartPole-v1", nn.Linear(4, 2), "[2] (logits", "Discrete(2) needs an action of shape []"),
    ("vector-CartPole", nn.Linear(4, 2), "[3, 2] (logits", "Discrete(2) needs an action of shape [3]"),
    ("Pendulum-v1", nn.Linear(3, 4), "[4];", "(1,), float32) needs an action of shape [1]"),
], ids=["logits", "vector-logits", "too-wide-box"])
def test_a_policy_whose_action_does_not_fit_the_action_space_is_named_with_both_shapes(
        collector, env, policy, returned, needed):
    """Before the first step: in the trainer's process, or as the worker's start-up error."""
    make_env = (lambda: GymEnv("CartPole-v1", num_envs=3)) if env == "vector-CartPole" else env
    with pytest.raises((ValueError, WorkerError)) as info:
        if collector == "Collector":
            Collector(make_env, policy, frames_per_batch=12)
        else:
            MultiCollector([make_env] * 2, policy, frames_per_batch=24)
    message = str(info.value)
    assert f"policy={policy!r} returned an action of shape {returned}" in message, message
    assert needed in message, message
