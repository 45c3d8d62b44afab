"""Requeueing a SLURM job that runs out of time or is preempted, after the trainer checkpointed.

A job submitted with ``requeue=True`` asks SLURM for submitit's signal (``SIGUSR2``)
``signal_delay_s`` seconds before its time limit. Every task starts with both signals blocked
(:mod:`.task_start`), so one that comes while it starts waits for its handler. :func:`install`
replaces submitit's handlers, which would checkpoint from inside the signal handler, in the middle
of a batch: the signal, and SIGTERM (preemption, ``scontrol requeue``, ``scancel``), only note that
the run must stop. The trainer sees it after the batch in progress (:func:`stop_requested`),
checkpoints, shuts its collector down and calls :func:`requeue`: for the time-limit signal that runs
``scontrol requeue`` (submitit's ``_requeue``), while SLURM requeues a preempted job itself; after a
SIGTERM that is neither (``scancel -s TERM``), :func:`outcome` says the job ends there. It then
raises :class:`Requeued`, which ends the task without a result, so the submitter keeps waiting for
the requeued job. Collector tasks ignore both signals: the trainer stops them.

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

# in a job's tasks: how many requeues the job may still use
ENV_REQUEUE = "RPC_COLLECTORS_REQUEUE"
# an elastic trainer's: the folder where its --join jobs register
ENV_FOLLOWERS = "RPC_COLLECTORS_FOLLOWERS"
# an elastic trainer's rendezvous file
ENV_RENDEZVOUS = "RPC_COLLECTORS_RENDEZVOUS"
# a requeueable job's least run before its time-limit signal (start-up and a batch)
RUN_BEFORE_SIGNAL_S = 60
TIME_LIMIT = "time limit"
STOPPED = "stopped by SLURM (SIGTERM: preempted, requeued, cancelled or signalled)"

# submitit's states of a job that is not over (Job.done), a requeued one's included
UNFINISHED = ("READY", "PENDING", "RUNNING", "UNKNOWN", "REQUEUED", "COMPLETING", "PREEMPTED",
              "CONFIGURING",
              "RESIZING", "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT",
              "STOPPED")

_reason: str | None = None
# time.time() of the first signal
_signalled_at: float | None = None


class Requeued(SystemExit):
    """Raised in the trainer's task once it checkpointed and its job is (being) requeued: it ends
    the task without a result, which tells submitit the job did not finish."""

    def __init__(self, reason: str) -> None:
        super().__init__(3)
        self.reason = reason


def check_signal_delay(signal_delay_s: int, time_min: int, requeueable: bool) -> None:
    """Refuse a ``signal_delay_s`` that leaves a job no run before its signal (a requeueable one:
    less than ``RUN_BEFORE_SIGNAL_S``, or it would be signalled while it
    starts, every allocation)."""
    least = RUN_BEFORE_SIGNAL_S if requeueable else 1
    if time_min * 60 - signal_delay_s < least:
        why = (" and requeue=True: SLURM would signal each allocation "
               f"{time_min * 60 - signal_delay_s} s after it starts, so each would stop after its "
               "first batch" if requeueable else "")
        raise ValueError(f"signal_delay_s={signal_delay_s} is invalid with "
                         f"time_min={time_min}{why}; accepted: signal_delay_s <= "
                         f"{time_min * 60 - least} (a run of {least} s before the signal at "
                         "least), or a longer time_min")


def usr_signal() -> signal.Signals:
    """The signal submitit asks SLURM for before the time limit
    (``SUBMITIT_PREEMPT_SIGNAL``, USR2)."""
    # the slurm extra; only in tasks of its jobs
    from submitit.slurm.slurm import SlurmJobEnvironment

    return SlurmJobEnvironment._usr_sig()


def install(trainer: bool, max_requeues: int, followers: Path | None = None,
            rendezvous: Path | None = None) -> None:
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


def unblock() -> None:
    """Deliver the stop signals to their handlers from now on (the task started with them blocked,
    see :mod:`.task_start`); one that came while the task started is handled now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {usr_signal(), signal.SIGTERM})


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
    """How many times SLURM restarted this job (``SLURM_RESTART_COUNT``; 0 in
    its first allocation)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def requeue(reason: str) -> None:
    """Requeue this job after the time-limit signal (``scontrol requeue``), while ``max_requeues``
    lasts; SLURM requeues a preempted one itself."""
    if reason == TIME_LIMIT and will_requeue(reason):
        from submitit.slurm.slurm import SlurmJobEnvironment

        SlurmJobEnvironment()._requeue(int(os.environ[ENV_REQUEUE]) - 1)


def will_requeue(reason: str) -> bool | None:
    """Whether the job comes back after stopping for ``reason``: after the time-limit signal while
    ``max_requeues`` lasts; after SIGTERM if SLURM is requeueing it (preempted,
    ``scontrol requeue``: its restart count went up), not if it was cancelled or only signalled
    (``scancel -s TERM``). None when SLURM cannot say."""
    if reason == TIME_LIMIT:
        return int(os.environ.get(ENV_REQUEUE, "0")) > 0
    state = _slurm_job()
    return None if state is None else int(state.get("Restarts", 0)) > restart_count()


def outcome(reason: str, requeued: bool | None) -> str:
    """What happens to the job after stopping for ``reason`` (``requeued``:
    :func:`will_requeue`'s answer), in words."""
    if reason == TIME_LIMIT:
        return "requeued" if requeued else ("ends here: it reached its time limit and has no "
                                            "requeue left (max_requeues)")
    if requeued:
        return "stops; SLURM requeues it (preempted or `scontrol requeue`)"
    if requeued is None:
        return ("stops; SLURM requeues it if it was preempted or requeued, not if it was "
                "cancelled or only signalled")
    state = (_slurm_job() or {}).get("JobState", "unknown")
    if state == "RUNNING":
        return ("ends here: the SIGTERM was neither a preemption nor a requeue (`scancel -s "
                "TERM`?), so SLURM does not requeue it; submit it again with the same "
                "checkpoint_dir to continue")
    return ("ends here: SLURM is ending it without a requeue (cancelled or out of time; its "
            f"state: {state})")


def _slurm_job() -> dict[str, str] | None:
    """This job's fields in SLURM's controller now (``scontrol show job``), or
    None if it cannot say."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        done = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return dict(field.split("=", 1) for field in done.stdout.split() if "=" in field)


def requeue_followers() -> list[str]:
    """An elastic trainer's: requeue the ``--join`` jobs that registered, and remove the rendezvous
    file they would find stale; the ids requeued (one line on stderr says which)."""
    folder = os.environ.get(ENV_FOLLOWERS)
    if folder is None or not Path(folder).is_dir():
        return []
    Path(os.environ[ENV_RENDEZVOUS]).unlink(missing_ok=True)
    requeued = []
    for job_id in sorted(path.name for path in Path(folder).iterdir()):
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True,
                              timeout=60)
        if done.returncode == 0:
            requeued.append(job_id)
        else:
            # it ended for good (cancelled, or no longer known): it is not a follower any more
            Path(folder, job_id).unlink(missing_ok=True)
    if requeued:
        print(f"rpc_collectors: requeued the collector jobs that joined: {', '.join(requeued)}",
              file=sys.stderr, flush=True)
    return requeued


def job_state(job_id: str) -> str | None:
    """SLURM's state of job ``job_id`` now, from its accounting (``sacct``); None if it cannot say.

    submitit caches a job as finished the first time ``sacct`` shows a state it takes for an end,
    which a requeued job can pass through; this asks again every time."""
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                             capture_output=True, text=True, timeout=60).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        return None
    states = [line.split()[0] for line in out if line.strip()]
    return states[-1] if states else None


def reset() -> None:
    """Forget a stop request (for a process that runs several jobs' functions, and tests)."""
    global _reason, _signalled_at
    _reason = _signalled_at = None
