"""The collector ranks one trainer may have over RPC: its open files (raised to the hard limit, or a
clear error), and a warning past the ranks measured to work, naming the argument and its value."""
from __future__ import annotations

import json
import os
import resource
import sys
import textwrap
import warnings

import pytest

from folders import PYTHONPATH
from procs import run_in_session
from rpc_collectors.core import rank_limits
from rpc_collectors.core.rank_limits import (
    BASE_OPEN_FILES,
    MEASURED_RANKS,
    MEASURED_RANKS_PER_HOST,
    OPEN_FILES_PER_RANK,
    SPARE_OPEN_FILES,
)

pytestmark = pytest.mark.timeout(150)


def run_child(tmp_path, body: str, env: dict | None = None) -> dict:
    """Run ``body`` in a Python process of its own (limits lowered there stay there); the JSON it prints."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    run = run_in_session([sys.executable, str(script)], timeout=120,
                         env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_the_open_files_needed_grow_by_the_measured_cost_of_a_rank():
    assert rank_limits.open_files_needed(0) == BASE_OPEN_FILES + SPARE_OPEN_FILES
    assert rank_limits.open_files_needed(100) - rank_limits.open_files_needed(99) == OPEN_FILES_PER_RANK
    assert rank_limits.open_files_needed(1000) == BASE_OPEN_FILES + 1000 * OPEN_FILES_PER_RANK + SPARE_OPEN_FILES


def test_a_limit_that_suffices_is_left_as_it_is():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    ranks = max(0, (soft - BASE_OPEN_FILES - SPARE_OPEN_FILES) // OPEN_FILES_PER_RANK)
    assert rank_limits.check_open_files(ranks, f"num_collectors={ranks}") == soft


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_low_soft_limit_is_raised_to_the_hard_limit(tmp_path):
    out = run_child(tmp_path, """
        import json, resource
        from rpc_collectors.core import rank_limits

        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = rank_limits.open_files_needed(100)
        assert hard >= need, (hard, need)
        resource.setrlimit(resource.RLIMIT_NOFILE, (need - 1, hard))
        returned = rank_limits.check_open_files(100, "WORLD_SIZE=101")
        print(json.dumps({"hard": hard, "returned": returned, "now": resource.getrlimit(resource.RLIMIT_NOFILE)}))
    """)
    assert out["returned"] == out["hard"]
    assert out["now"] == [out["hard"], out["hard"]]


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_hard_limit_too_low_is_an_error_naming_the_argument_the_need_and_the_fix(tmp_path):
    out = run_child(tmp_path, """
        import json, resource
        from rpc_collectors.core import rank_limits

        resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600))
        try:
            rank_limits.check_open_files(100, "WORLD_SIZE=101")
        except ValueError as err:
            print(json.dumps({"error": str(err), "now": resource.getrlimit(resource.RLIMIT_NOFILE)}))
    """)
    need = rank_limits.open_files_needed(100)
    most = (600 - BASE_OPEN_FILES - SPARE_OPEN_FILES) // OPEN_FILES_PER_RANK
    message = out["error"]
    assert message.startswith(f"WORLD_SIZE=101: the trainer needs about {need} open files for 100 collector ranks")
    for text in ("RLIMIT_NOFILE is 600 (hard limit 600)", f"ulimit -Hn {need}", f"at most {most}",
                 "collector_class='sync'", "num_workers_per_collector=W", "RayCollector"):
        assert text in message, text
    assert out["now"] == [600, 600]


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_torchrun_trainer_whose_limit_is_too_low_fails_before_its_rendezvous(tmp_path):
    """Rank 0 of a torchrun world of 101 with a hard limit of 600: the error, before the trainer
    serves the rendezvous store or starts any process."""
    from rpc_collectors.transport.rendezvous import free_port

    port = free_port()
    out = run_child(tmp_path, f"""
        import json, multiprocessing, resource, socket
        from rpc_collectors import RPCCollector

        resource.setrlimit(resource.RLIMIT_NOFILE, (600, 600))
        try:
            RPCCollector("CartPole-v1", None, launcher="torchrun", frames_per_batch=100 * 10)
        except ValueError as err:
            error = str(err)
        with socket.socket() as sock:
            # nothing serves the rendezvous there
            sock.bind(("127.0.0.1", {port}))
        print(json.dumps({{"error": error, "children": len(multiprocessing.active_children())}}))
    """, env={"RANK": "0", "WORLD_SIZE": "101", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert out["error"].startswith("WORLD_SIZE=101: the trainer needs about")
    assert out["children"] == 0


def test_more_ranks_than_measured_warn_naming_the_argument_the_number_and_the_alternatives():
    with pytest.warns(UserWarning) as caught:
        rank_limits.check_ranks(MEASURED_RANKS + 1, f"num_collectors={MEASURED_RANKS + 1}")
    message = str(caught[0].message)
    assert message.startswith(f"num_collectors={MEASURED_RANKS + 1}: {MEASURED_RANKS + 1} collector ranks, "
                              f"more than the {MEASURED_RANKS}")
    for text in ("collector_class='sync'", "num_workers_per_collector=W", "RayCollector"):
        assert text in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rank_limits.check_ranks(MEASURED_RANKS, f"num_collectors={MEASURED_RANKS}", MEASURED_RANKS_PER_HOST)


def test_more_ranks_in_one_host_than_measured_warn_naming_the_host_count():
    with pytest.warns(UserWarning, match=f"WORLD_SIZE=9: {MEASURED_RANKS_PER_HOST + 1} ranks in one host"):
        rank_limits.check_ranks(8, "WORLD_SIZE=9", MEASURED_RANKS_PER_HOST + 1)


def test_a_slurm_job_of_more_tasks_than_measured_warns_when_it_is_configured(tmp_path):
    from rpc_collectors.slurm import SlurmConfig

    nodes = MEASURED_RANKS // 4 + 1
    with pytest.warns(UserWarning, match=f"nodes={nodes}, tasks_per_node=4: {nodes * 4 - 1} collector ranks"):
        SlurmConfig(log_dir=tmp_path, nodes=nodes, tasks_per_node=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SlurmConfig(log_dir=tmp_path, nodes=MEASURED_RANKS // 4, tasks_per_node=4)
