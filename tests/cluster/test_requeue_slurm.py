"""Runs longer than a SLURM allocation, on a real local SLURM cluster (slurm/devcluster.py, root).

A trainer job (task 0) with two collector tasks runs tests/scripts/requeue_trainer.py through
``slurm.submit(run_script, ..., requeue=True, checkpoint_dir=...)``, as ``slurm/submit.py
--requeue`` does. Its allocations end by the signal before the time limit, or by ``scontrol
requeue``; each time the trainer checkpoints after its batch and the job comes back. The whole
run, read from the checkpoint, must hold exactly ``total_frames``, no trajectory id in two
allocations, and weight versions that only go up across a requeue; SLURM's accounting must show
the requeues, and no process of the job may outlive it.

The cluster is tests/cluster/test_slurm.py's two-node one (the ``two_nodes`` fixture of tests/conftest.py,
started once a session): this process runs a trainer (the submitit collector test), and torch
keeps the address of a process's first RPC agent for every later one, so both modules' trainers
must listen on the same bridge address (a one-node cluster runs on loopback).

The dev cluster uses fixed ports (slurmctld 6817) and MariaDB's socket: while another dev cluster
runs on this machine, starting this one fails with a ClusterError saying so.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest
import submitit

from rpc_collectors.cluster import checkpoint, requeue
from rpc_collectors.cluster import submission as slurm

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "tests" / "scripts" / "requeue_trainer.py"
# two collectors of 20 steps of 50 ms: a second a batch at most, nearly all of it the env's sleep, so a
# loaded machine slows a batch little (at 20 ms a step, each task's CPU time per step weighs)
BATCH, STEP_SLEEP = 40, 0.05

pytestmark = [pytest.mark.slurm]


def trainer_log(job: submitit.Job) -> str:
    """What the trainer (task 0) of ``job`` wrote to stderr."""
    path = Path(job.paths.stderr.as_posix().replace("%t", "0"))
    return path.read_text() if path.exists() else ""


def submit(tmp_path: Path, frames: int, time_min: int, extra: tuple = ()) -> tuple[submitit.Job, Path]:
    """A requeueable trainer job of ``frames`` (``extra``: more of the trainer's arguments). On a loaded machine
    the tasks take longer to start, so each allocation collects less and the run needs more of them:
    ``max_requeues`` allows for it."""
    ckpt_dir = tmp_path / "ckpt"
    job = slurm.submit(slurm.run_script, str(TRAINER), ["--frames", str(frames), "--batch", str(BATCH),
                                                        "--step-sleep", str(STEP_SLEEP), *extra],
                       log_dir=tmp_path / "logs", tasks_per_node=3, time_min=time_min, signal_delay_s=60,
                       requeue=True, max_requeues=40, checkpoint_dir=ckpt_dir)
    return job, ckpt_dir / checkpoint.FILE_NAME


def job_processes(job_id: str) -> list[int]:
    """Pids of the processes that run in SLURM job ``job_id`` (its environment says so)."""
    marker = f"SLURM_JOB_ID={job_id}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def sacct_states(job_id: str) -> list[str]:
    """The job's state in every allocation, as SLURM's accounting recorded them (``sacct -D``)."""
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_for_end_of(job: submitit.Job) -> list[str]:
    """The job's states in SLURM's accounting once the last is final (a minute at most)."""
    deadline = time.monotonic() + 60
    while (states := sacct_states(job.job_id))[-1] in requeue.UNFINISHED and time.monotonic() < deadline:
        time.sleep(1)
    return states


def wait_for_batch(job: submitit.Job, number: int, timeout: float = 600) -> None:
    """Wait until the trainer (task 0) of ``job`` printed that it trained on batch ``number``."""
    log = Path(job.paths.stdout.as_posix().replace("%t", "0"))
    deadline = time.monotonic() + timeout
    while not (log.exists() and f"batch {number} " in log.read_text()):
        assert time.monotonic() < deadline and not job.done(), f"no batch {number} of job {job.job_id} in {timeout} s"
        time.sleep(0.5)


def check_run(job: submitit.Job, path: Path, frames: int) -> dict:
    """The assertions every requeued run must pass; returns the checkpoint's content."""
    content = checkpoint.read(path)
    batches, allocations = content["extra"]["batches"], content["allocations"]
    assert content["frames"] == frames and sum(b["frames"] for b in batches) == frames
    assert allocations[-1]["end"] == "finished" and allocations[-1]["frames"] == frames
    assert [a["restart"] for a in allocations] == list(range(len(allocations)))
    restarts = sorted({b["restart"] for b in batches})
    assert restarts == list(range(len(allocations))), "an allocation trained on no batch"
    ids = {r: set().union(*(b["traj_ids"] for b in batches if b["restart"] == r)) for r in restarts}
    for r in restarts[1:]:
        shared = set().union(*(ids[r] & ids[q] for q in restarts if q < r))
        assert not shared, f"allocation {r} reused trajectory ids of an earlier one: {sorted(shared)[:10]}"
        before = max(b["versions"][1] for b in batches if b["restart"] < r)
        after = min(b["versions"][0] for b in batches if b["restart"] == r)
        assert after > before, f"allocation {r} collected with weights version {after}, the one before with {before}"
    states = wait_for_end_of(job)  # task 0's result may come before the job's end
    assert states.count("REQUEUED") == len(allocations) - 1 and states[-1] == "COMPLETED", states
    deadline = time.monotonic() + 30
    while job_processes(job.job_id):
        assert time.monotonic() < deadline, f"processes of job {job.job_id} outlived it: {job_processes(job.job_id)}"
        time.sleep(0.5)
    return content


@pytest.mark.timeout(1500)
def test_the_time_limit_signal_checkpoints_and_requeues_until_the_run_is_done(two_nodes, tmp_path):
    """``--time 2``, the signal 60 s before: the only test that waits for SLURM's time limit. SLURM
    sends the signal up to 60 s early, never late, and two collectors of 50 ms a step collect 40
    frames a second at most, after their start: an allocation trains on 60 batches at most before
    the signal and one more after it, so 65 take two or more."""
    frames = 65 * BATCH
    job, path = submit(tmp_path, frames, time_min=2)
    assert slurm.result(job, timeout_s=1300) is None
    content = check_run(job, path, frames)
    ends = [a["end"] for a in content["allocations"]]
    assert ends[:-1] == [requeue.TIME_LIMIT] * (len(ends) - 1) and len(ends) >= 2, ends
    assert all(a["undelivered_frames"] == 0 for a in content["allocations"][:-1])  # nothing collected was lost


@pytest.mark.timeout(1500)
def test_the_lag_bound_and_the_drop_counter_hold_across_two_requeues(two_nodes, tmp_path):
    """Async collection with ``max_policy_lag=1`` (admitted), requeued twice by ``scontrol requeue``: every batch
    of the whole run is within one version of the trainer's, none is dropped, and the versions only go up across
    each requeue (``check_run``): the bound counts from the versions the checkpoint restored, not from 0. The trainer
    holds after batches 5 and 15 until the requeue lands."""
    frames = 40 * BATCH
    job, path = submit(tmp_path, frames, time_min=30, extra=("--lag", "1", "--hold-after", "5", "15"))
    try:
        for batch in (5, 15):
            wait_for_batch(job, batch)
            subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=60)
        assert slurm.result(job, timeout_s=900) is None
        content = check_run(job, path, frames)
        assert [a["end"] for a in content["allocations"]] == [requeue.STOPPED] * 2 + ["finished"]
        batches = content["extra"]["batches"]
        assert all(0 <= b["lag"] <= 1 for b in batches), [b["lag"] for b in batches]
        assert {b["dropped"] for b in batches} == {0} and content["collector"]["dropped"]["frames"] == 0
        # one push a batch over the whole run: the versions went on from each checkpoint
        assert batches[-1]["versions"][1] >= len(batches) - 2, [b["versions"] for b in batches]
    finally:
        subprocess.run(["scancel", job.job_id], timeout=60)


def started_tasks(job_id: str, tasks: int, timeout: float = 300) -> None:
    """Wait until the ``tasks`` processes of job ``job_id`` run Python (starting: importing torch)."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for pid in job_processes(job_id):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if Path(argv[0].decode()).name.startswith("python") and b"submitit.core._submit" in argv \
                        and not any(arg.endswith(b"task_start.py") for arg in argv):  # Python itself, not srun
                    found.append(pid)
        if len(found) >= tasks:
            return
        assert time.monotonic() < deadline, f"the {tasks} tasks of job {job_id} did not start in {timeout} s"
        time.sleep(0.02)


@pytest.mark.timeout(1500)
def test_trainer_jobs_stopped_each_their_own_way_take_their_path(two_nodes, tmp_path):
    """Four trainer jobs at once (their starts and SLURM's wait before a requeued job starts again
    overlap), each stopped its own way:

    - SLURM's time-limit signal as the tasks start Python (before any handler could be installed):
      it waits for the handler, the trainer checkpoints after its first batch, and the job comes back;
    - ``scontrol requeue`` of a running trainer takes the same path as a preemption;
    - ``scancel -s TERM`` is neither a requeue nor a cancel: the trainer checkpoints after its batch
      and, as SLURM does not requeue the job, requeues it itself;
    - an elastic trainer job and a ``join`` job of two collectors, both requeueable: when the
      trainer is requeued (``scontrol requeue``) it requeues the collector job too, which joins its
      next allocation.

    The trainers stopped by the test hold after the batch it waits for (``--hold-after``) until
    their stop lands, so that it lands before the run is done however the four share the cores."""
    jobs = []
    try:
        starting, starting_ckpt = submit(tmp_path / "starting", 10 * BATCH, time_min=30)
        jobs.append(starting.job_id)
        started_tasks(starting.job_id, 3)
        subprocess.run(["scancel", "-s", "USR2", starting.job_id], check=True, timeout=60)
        requeued, requeued_ckpt = submit(tmp_path / "requeued", 20 * BATCH, time_min=30, extra=("--hold-after", "5"))
        jobs.append(requeued.job_id)
        ended, ended_ckpt = submit(tmp_path / "ended", 20 * BATCH, time_min=30, extra=("--hold-after", "3"))
        jobs.append(ended.job_id)
        args = ["--frames", str(20 * BATCH), "--batch", str(BATCH), "--step-sleep", str(STEP_SLEEP), "--slots", "2"]
        elastic = slurm.submit(slurm.run_script, str(TRAINER), [*args, "--hold-after", "5"],
                               log_dir=tmp_path / "elastic" / "logs", elastic=True, time_min=30, requeue=True,
                               checkpoint_dir=tmp_path / "elastic" / "ckpt")
        jobs.append(elastic.job_id)
        joined = slurm.submit(slurm.run_script, str(TRAINER), args, log_dir=tmp_path / "elastic" / "logs",
                              join=elastic.job_id, tasks_per_node=2, time_min=30, requeue=True)
        jobs.append(joined.job_id)
        wait_for_batch(requeued, 5)
        subprocess.run(["scontrol", "requeue", requeued.job_id], check=True, timeout=60)
        wait_for_batch(ended, 3)
        subprocess.run(["scancel", "-s", "TERM", ended.job_id], check=True, timeout=60)
        wait_for_batch(elastic, 5)
        subprocess.run(["scontrol", "requeue", elastic.job_id], check=True, timeout=60)

        assert slurm.result(starting, timeout_s=700) is None
        content = check_run(starting, starting_ckpt, 10 * BATCH)
        first = content["allocations"][0]
        assert [a["end"] for a in content["allocations"]] == [requeue.TIME_LIMIT, "finished"]
        assert first["frames"] == BATCH and first["signal_at"] < first["first_batch_at"]

        assert slurm.result(requeued, timeout_s=700) is None
        content = check_run(requeued, requeued_ckpt, 20 * BATCH)
        assert [a["end"] for a in content["allocations"]] == [requeue.STOPPED, "finished"]
        assert content["allocations"][0]["frames"] >= 5 * BATCH
        assert "SLURM requeues it (preempted or `scontrol requeue`)" in trainer_log(requeued)

        assert slurm.result(ended, timeout_s=700) is None
        content = check_run(ended, ended_ckpt, 20 * BATCH)
        assert [a["end"] for a in content["allocations"]] == [requeue.STOPPED, "finished"]
        assert content["allocations"][0]["frames"] >= 3 * BATCH
        assert "requeued (SLURM sent the SIGTERM without a requeue" in trainer_log(ended)

        assert slurm.result(elastic, timeout_s=700) is None
        content = check_run(elastic, tmp_path / "elastic" / "ckpt" / checkpoint.FILE_NAME, 20 * BATCH)
        assert [a["end"] for a in content["allocations"]] == [requeue.STOPPED, "finished"]
        assert slurm.result(joined, timeout_s=120) is None
        states = wait_for_end_of(joined)
        assert states[:-1] == ["REQUEUED"] and states[-1] == "COMPLETED", states
    finally:
        if jobs:  # any job still running after a failure
            subprocess.run(["scancel", *jobs], timeout=60)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("elastic", [True, False], ids=["elastic", "fixed"])
def test_a_collector_job_ended_by_its_time_limit_is_submitted_again_and_rejoins(two_nodes, tmp_path, monkeypatch, elastic):
    """A ``launcher="submitit"`` collector job that SLURM ends by its time limit: the trainer
    submits another in its place (counted), and that one's collector serves the slot: elastic, as
    any newcomer to a vacant slot; fixed, as the failed worker's replacement (``max_worker_restarts``).

    Once the job's collector served a batch, ``scontrol update TimeLimit=0`` moves its time limit
    to now: SLURM's next time-limit check (every 30 s) ends it as it ends any job out of time
    (SIGTERM, SIGKILL after ``KillWait``, ``TIMEOUT`` in its accounting: the state the trainer
    resubmits on); only the wait for the limit is gone."""
    from functools import partial

    from conftest import slow_cartpole
    from rpc_collectors import DistributedCollector, WorkerLeftWarning, WorkerRestartWarning
    from rpc_collectors.pools.ranks import submitit as submitit_pool

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "tests")]))  # the jobs import conftest
    monkeypatch.setattr(submitit_pool, "RESUBMIT_POLL_S", 1.0)  # the ended job is seen within a second, not ten
    membership = dict(elastic=True) if elastic else dict(max_worker_restarts=1, weight_transport="rpc")
    collector = DistributedCollector(
        [partial(slow_cartpole, STEP_SLEEP)], None, frames_per_batch=20, launcher="submitit",
        slurm_kwargs={"folder": str(tmp_path / "jobs"), "timeout_min": 5, "max_resubmits": 1},
        rpc_timeout=60, **membership,
    )
    jobs = collector.workers.jobs
    ranks, deadline = [], time.monotonic() + 480
    try:
        with pytest.warns(WorkerLeftWarning if elastic else WorkerRestartWarning, match="vacant" if elastic else "replacing"):
            for _ in collector:
                rank = collector.infos[0]["rank"]
                ranks.append(rank)
                if len(ranks) == 1:  # the first job's collector served: its time limit is now
                    subprocess.run(["scontrol", "update", f"JobId={jobs.jobs[0].job_id}", "TimeLimit=0"], check=True,
                                   timeout=60)
                if jobs.resubmitted and rank != ranks[0] and ranks.count(rank) >= 3:
                    break
                assert time.monotonic() < deadline, f"no resubmitted job served the slot: {jobs.resubmitted}, ranks {set(ranks)}"
    finally:
        collector.shutdown()
    (ended, state, successor), = jobs.resubmitted
    assert ended == jobs.jobs[0].job_id and state.startswith("TIMEOUT") and successor == jobs.jobs[1].job_id
    assert collector.worker_restarts == [1]
    deadline = time.monotonic() + 60  # a cancelled job stays listed (COMPLETING) until its processes are gone
    while jobs.queued():
        assert time.monotonic() < deadline, f"collector jobs still queued after the collector shut down: {jobs.queued()}"
        time.sleep(0.5)
