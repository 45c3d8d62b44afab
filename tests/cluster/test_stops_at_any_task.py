"""A stop signal that reaches any one task of a requeueable SLURM job stops the whole run once.

SLURM may signal any one process of a job: its time-limit signal (USR2) or a SIGTERM may reach a
single collector task, every task of one node, or the trainer alone, also while the tasks start.
Each leads to one stop, decided by the trainer at a batch boundary: one checkpoint, a requeue, and
a resume that ends with exactly ``total_frames``, no trajectory id in two allocations, and nothing
of the job left running (tests/cluster/test_requeue_slurm.py's ``check_run``).

The first tests need no SLURM: who brings a stopped job back, and a collector task's forwarding
thread in a process of its own. The last runs four jobs at once on the two-node dev cluster (the
``two_nodes`` fixture), each with two tasks on each node, each signalled its own way.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rpc_collectors.cluster import checkpoint, requeue
from rpc_collectors.cluster import submission as slurm
from test_requeue_slurm import TRAINER, check_run, started_tasks, trainer_log, wait_for_batch

REPO = Path(__file__).resolve().parents[2]
# three collectors of 20 steps of 50 ms each: a batch a second, long enough to be signalled mid-run
BATCH, STEP_SLEEP, BATCHES = 60, 0.05, 40


@pytest.mark.parametrize("reason, job, left, step", [
    (requeue.TIME_LIMIT, None, "2", "library"),
    (requeue.TIME_LIMIT, None, "0", "none"),
    (requeue.STOPPED, {"JobState": "RUNNING", "Restarts": "1"}, "2", "slurm"),
    (requeue.STOPPED, {"JobState": "RUNNING", "Restarts": "0"}, "2", "library"),
    (requeue.STOPPED, {"JobState": "RUNNING", "Restarts": "0"}, "0", "none"),
    (requeue.STOPPED, {"JobState": "CANCELLED", "Restarts": "0"}, "2", "none"),
    (requeue.STOPPED, None, "2", "unknown"),
], ids=["time-limit", "time-limit-no-requeue-left", "preempted", "signal-alone",
        "signal-alone-no-requeue-left", "cancelled", "slurm-silent"])
def test_who_brings_a_stopped_job_back(monkeypatch, reason, job, left, step):
    """After the time-limit signal, or a SIGTERM that came without SLURM's requeue (a task or node
    signalled alone), the library requeues the job while ``max_requeues`` lasts; SLURM requeues a
    preempted one; a cancelled one ends; and the words say which."""
    monkeypatch.setenv(requeue.ENV_REQUEUE, left)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setattr(requeue, "_slurm_job", lambda: job)
    assert requeue.next_step(reason) == step
    words = requeue.outcome(reason, step)
    assert words.startswith({"library": "requeued", "slurm": "stops; SLURM requeues it",
                             "none": "ends here", "unknown": "stops;"}[step]), words
    if step == "none":
        assert ("max_requeues" in words) == (left == "0"), words


def test_the_first_stop_of_a_run_is_the_one_kept():
    """A stop noted by the trainer's handler and one forwarded by a collector task: the first
    decides the reason, the time and the task that the run's record names."""
    try:
        requeue.noted(requeue.STOPPED, "task 2 on n2", 100.0)
        requeue.noted(requeue.TIME_LIMIT, "task 0 on n1", 101.0)
        assert requeue.stop_requested() == requeue.STOPPED
        assert (requeue.signalled_at(), requeue.signalled_task()) == (100.0, "task 2 on n2")
    finally:
        requeue.reset()
    assert requeue.stop_requested() is None and requeue.signalled_task() is None


FORWARDER = textwrap.dedent("""
    import os, signal, time
    # as cluster/task_start.py starts every task: both signals blocked, before any thread starts
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGTERM})
    from rpc_collectors.cluster import requeue
    from rpc_collectors.worker import rpc_rank

    def tell(fn, args, timeout):
        print("told", args[0], args[1], flush=True)

    rpc_rank.tell_trainer = tell
    # one that comes while the task starts
    os.kill(os.getpid(), signal.SIGUSR2)
    requeue.install(trainer=False, forward=True, max_requeues=3)
    requeue.unblock()
    for sig in (signal.SIGTERM, signal.SIGUSR2, signal.SIGTERM):
        time.sleep(0.3)
        os.kill(os.getpid(), sig)
    time.sleep(1.0)
    print("alive", flush=True)
""")


@pytest.mark.timeout(60)
def test_a_collector_task_forwards_each_stop_signal_once_and_is_not_ended_by_it():
    """A collector task of a requeueable job keeps both signals blocked and its forwarding thread
    takes them: the one that came while it started, then each other once; the task lives on (the
    trainer stops it), whatever the signal's default action."""
    env = {**os.environ, "SLURM_PROCID": "2", "SLURMD_NODENAME": "n2", "SLURM_RESTART_COUNT": "0",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", FORWARDER], capture_output=True, text=True,
                          timeout=50, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"told {requeue.TIME_LIMIT} task 2 on n2",
                                        f"told {requeue.STOPPED} task 2 on n2", "alive"], done.stdout


LATE_SIGNAL = textwrap.dedent("""
    import os, signal, sys, time
    from rpc_collectors.cluster import requeue

    class Late:
        \"\"\"Sends SLURM's time-limit signal as the interpreter finalizes (after its exit
        handlers, when Python has put the signals' default actions back), as a slow exit of a
        finished run meets a signal SLURM sent early.\"\"\"
        def __del__(self):
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.3)

    late = Late()
    if sys.argv[1] == "trainer":
        requeue.install(trainer=True, max_requeues=1)
    else:
        signal.signal(signal.SIGUSR2, lambda *_: None)  # a handler, and no requeue.install
    requeue.unblock()
    print("run finished", flush=True)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("task", ["trainer", "no handler of the library"])
def test_a_stop_signal_as_the_trainers_task_exits_does_not_end_it_by_the_signal(task):
    """The trainer's task of a requeueable job exits 0 when SLURM's signal comes as it exits (the
    job would count FAILED); without the library's handlers, the same script is ended by it."""
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", LATE_SIGNAL, task], capture_output=True,
                          text=True, timeout=50, env=env)
    assert done.stdout == "run finished\n", done.stdout + done.stderr
    assert done.returncode == (0 if task == "trainer" else -signal.SIGUSR2), done.stderr


# ----------------------------------------------------------------------------- on the dev cluster


def submit(folder: Path) -> tuple:
    """A requeueable trainer job: tasks 0 and 1 on node 1, tasks 2 and 3 on node 2."""
    job = slurm.submit(slurm.run_script, str(TRAINER),
                       ["--frames", str(BATCHES * BATCH), "--batch", str(BATCH),
                        "--step-sleep", str(STEP_SLEEP)],
                       log_dir=folder / "logs", nodes=2, tasks_per_node=2, time_min=30,
                       signal_delay_s=60, requeue=True, max_requeues=5,
                       checkpoint_dir=folder / "ckpt")
    return job, folder / "ckpt" / checkpoint.FILE_NAME


def task_processes(job_id: str) -> list[tuple[int, str, str]]:
    """(pid, SLURM_PROCID, node) of every Python process of the job's tasks, their children too."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            environ = dict(item.split(b"=", 1) for item in
                           (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if environ.get(b"SLURM_JOB_ID") == job_id.encode() and b"SLURM_PROCID" in environ \
                    and Path(argv[0].decode()).name.startswith("python"):
                found.append((int(entry.name), environ[b"SLURM_PROCID"].decode(),
                              environ.get(b"SLURMD_NODENAME", b"").decode()))
    return found


def signal_tasks(job_id: str, sig: signal.Signals, task: str | None = None,
                 node: str | None = None) -> int:
    """Send ``sig`` to the processes of one task, or of one node; how many got it."""
    chosen = [pid for pid, procid, where in task_processes(job_id)
              if (task is None or procid == task) and (node is None or where == node)]
    assert chosen, f"no process of job {job_id} for task {task}, node {node}"
    for pid in chosen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return len(chosen)


@pytest.mark.slurm
@pytest.mark.timeout(1500)
def test_a_signal_to_one_task_one_node_or_the_trainer_stops_the_run_once_and_it_resumes_exactly(
        two_nodes, tmp_path):
    """Four jobs at once, each signalled once:

    - SLURM's time-limit signal to collector task 2 alone (on node 2), after a few batches;
    - SIGTERM to every process of node 2 (tasks 2 and 3), after a few batches;
    - SIGTERM to the trainer alone (task 0), after a few batches;
    - the time-limit signal to collector task 1 alone while the tasks start Python.

    Each run stops once at a batch boundary, checkpoints, is requeued by the library (SLURM sent
    no requeue with any of these signals), and its second allocation finishes the run exactly."""
    # signal, to task, to node, the stop it makes, the task the run's record names
    cases = {"task": (signal.SIGUSR2, "2", None, requeue.TIME_LIMIT, "task 2 on n2"),
             "node": (signal.SIGTERM, None, "n2", requeue.STOPPED, "on n2"),
             "trainer": (signal.SIGTERM, "0", None, requeue.STOPPED, "task 0 on n1"),
             "starting": (signal.SIGUSR2, "1", None, requeue.TIME_LIMIT, "task 1 on n1")}
    jobs = {}
    try:
        for name in cases:
            jobs[name] = submit(tmp_path / name)
        started_tasks(jobs["starting"][0].job_id, 4)
        signal_tasks(jobs["starting"][0].job_id, signal.SIGUSR2, task="1")
        for name in ("task", "node", "trainer"):
            job = jobs[name][0]
            wait_for_batch(job, 3)
            sig, task, node, _, _ = cases[name]
            signal_tasks(job.job_id, sig, task=task, node=node)
        for name, (job, path) in jobs.items():
            _, _, _, reason, where = cases[name]
            assert slurm.result(job, timeout_s=700) is None
            content = check_run(job, path, BATCHES * BATCH)
            first = content["allocations"][0]
            assert [a["end"] for a in content["allocations"]] == [reason, "finished"], name
            assert first["signal_to"].endswith(where), (name, first["signal_to"])
            assert first["frames"] >= (3 if name != "starting" else 1) * BATCH, (name, first)
            log = trainer_log(job)
            assert log.count(f"rpc_collectors: {reason}; the signal reached ") == 1, (name, log)
            assert f"job {job.job_id} requeued" in log, (name, log)
        starting = jobs["starting"][1]
        first = checkpoint.read(starting)["allocations"][0]
        assert first["signal_at"] < first["first_batch_at"], first
    finally:
        if jobs:
            subprocess.run(["scancel", *(job.job_id for job, _ in jobs.values())], timeout=60)
