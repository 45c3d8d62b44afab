"""Requeueing a SLURM job that runs out of time or is preempted, after the trainer checkpointed.

A job submitted with ``requeue=True`` asks SLURM for submitit's signal (``SIGUSR2``)
``signal_delay_s`` seconds before its time limit. In every task, :func:`install` replaces
submitit's handlers, which would checkpoint from inside the signal handler, in the middle of a
batch: the signal, and SIGTERM (preemption, ``scontrol requeue``, ``scancel``), only note that the
run must stop. The trainer sees it after the batch in progress (:func:`stop_requested`),
checkpoints, shuts its collector down and calls :func:`requeue`: for the time-limit signal that
runs ``scontrol requeue`` (submitit's ``_requeue``), while SLURM requeues a preempted job itself.
It then raises :class:`Requeued`, which ends the task without a result, so the submitter keeps
waiting for the requeued job. Collector tasks ignore both signals: the trainer stops them.

Collector jobs that joined an elastic trainer (``join=JOBID``, also submitted with ``requeue=True``)
register in the trainer's followers folder; the trainer requeues them with itself and removes its
rendezvous file, so that when they start again they wait for the one its next allocation writes.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENV_REQUEUE = "RPC_COLLECTORS_REQUEUE"  # in a job's tasks: how many requeues the job may still use
ENV_FOLLOWERS = "RPC_COLLECTORS_FOLLOWERS"  # an elastic trainer's: the folder where its --join jobs register
ENV_RENDEZVOUS = "RPC_COLLECTORS_RENDEZVOUS"  # an elastic trainer's rendezvous file
TIME_LIMIT = "time limit"
STOPPED = "stopped by SLURM (SIGTERM: preempted, requeued or cancelled)"

# submitit's states of a job that is not over (Job.done), a requeued one's included
UNFINISHED = ("READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED", "CONFIGURING",
              "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED")

_reason: str | None = None
_signalled_at: float | None = None  # time.time() of the first signal


class Requeued(SystemExit):
    """Raised in the trainer's task once it checkpointed and its job is (being) requeued: it ends
    the task without a result, which tells submitit the job did not finish."""

    def __init__(self, reason: str) -> None:
        super().__init__(3)
        self.reason = reason


def usr_signal() -> signal.Signals:
    """The signal submitit asks SLURM for before the time limit (``SUBMITIT_PREEMPT_SIGNAL``, USR2)."""
    from submitit.slurm.slurm import SlurmJobEnvironment  # the slurm extra; only in tasks of its jobs

    return SlurmJobEnvironment._usr_sig()


def install(trainer: bool, max_requeues: int, followers: Path | None = None, rendezvous: Path | None = None) -> None:
    """In a task of a requeueable job: note the stop signals (trainer) or ignore them (collectors).
    ``followers``: an elastic trainer's folder of its ``--join`` jobs (which register there)."""
    os.environ[ENV_REQUEUE] = str(max(0, max_requeues - restart_count()))
    if followers is not None and trainer:
        os.environ[ENV_FOLLOWERS], os.environ[ENV_RENDEZVOUS] = str(followers), str(rendezvous)
    elif followers is not None:
        followers.mkdir(parents=True, exist_ok=True)
        (followers / os.environ["SLURM_JOB_ID"]).touch()
    if trainer:
        signal.signal(usr_signal(), _note)
        signal.signal(signal.SIGTERM, _note)
    else:
        signal.signal(usr_signal(), signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _note(signum: int, frame: Any) -> None:
    global _reason, _signalled_at
    if _reason is None:
        _reason, _signalled_at = (TIME_LIMIT if signum == usr_signal() else STOPPED), time.time()


def stop_requested() -> str | None:
    """Why the run must stop (the time-limit signal, or SIGTERM), or None."""
    return _reason


def signalled_at() -> float | None:
    """When the first stop signal arrived (``time.time()``), or None."""
    return _signalled_at


def restart_count() -> int:
    """How many times SLURM restarted this job (``SLURM_RESTART_COUNT``; 0 in its first allocation)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def requeue(reason: str) -> bool:
    """Requeue this job after the time-limit signal (``scontrol requeue``); SLURM requeues a preempted
    one itself. False when the job used up its ``max_requeues``; then it ends here."""
    if not will_requeue(reason):
        print(f"rpc_collectors: job {os.environ.get('SLURM_JOB_ID')} reached its time limit and has no requeue left "
              "(max_requeues); it ends here", file=sys.stderr, flush=True)
        return False
    from submitit.slurm.slurm import SlurmJobEnvironment

    if reason == TIME_LIMIT:
        SlurmJobEnvironment()._requeue(int(os.environ[ENV_REQUEUE]) - 1)
    return True


def will_requeue(reason: str) -> bool:
    """Whether the job comes back after stopping for ``reason`` (the time limit: while ``max_requeues`` lasts)."""
    return reason != TIME_LIMIT or int(os.environ.get(ENV_REQUEUE, "0")) > 0


def requeue_followers() -> list[str]:
    """An elastic trainer's: requeue the ``--join`` jobs that registered, and remove the rendezvous
    file they would find stale; the ids requeued (one line on stderr says which)."""
    folder = os.environ.get(ENV_FOLLOWERS)
    if folder is None or not Path(folder).is_dir():
        return []
    Path(os.environ[ENV_RENDEZVOUS]).unlink(missing_ok=True)
    requeued = []
    for job_id in sorted(path.name for path in Path(folder).iterdir()):
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            requeued.append(job_id)
        else:  # it ended for good (cancelled, or no longer known): it is not a follower any more
            Path(folder, job_id).unlink(missing_ok=True)
    if requeued:
        print(f"rpc_collectors: requeued the collector jobs that joined: {', '.join(requeued)}", file=sys.stderr, flush=True)
    return requeued


def job_state(job_id: str) -> str | None:
    """SLURM's state of job ``job_id`` now, from its accounting (``sacct``); None if it cannot say.

    submitit caches a job as finished the first time ``sacct`` shows a state it takes for an end,
    which a requeued job can pass through; this asks again every time."""
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], capture_output=True,
                             text=True, timeout=60).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        return None
    states = [line.split()[0] for line in out if line.strip()]
    return states[-1] if states else None


def reset() -> None:
    """Forget a stop request (for a process that runs several jobs' functions, and tests)."""
    global _reason, _signalled_at
    _reason = _signalled_at = None
