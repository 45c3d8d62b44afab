"""Requeueing a SLURM job that runs out of time or is preempted, after the trainer checkpointed.

A job submitted with ``requeue=True`` asks SLURM for submitit's signal (``SIGUSR2``)
``signal_delay_s`` seconds before its time limit. Every task starts with both signals blocked
(:mod:`.task_start`), so one that comes while it starts waits for its handler. :func:`install`
replaces submitit's handlers, which would checkpoint from inside the signal handler, in the middle
of a batch: the signal, and SIGTERM (preemption, ``scontrol requeue``, ``scancel``), only note that
the run must stop. SLURM may signal any one task of the job, so the job's collector tasks keep
both signals blocked and a thread of theirs takes them (:func:`forward_stops`) and tells the
trainer, which notes the stop as its own: the trainer alone decides, for the whole job. A signal
that comes as the trainer's task exits, its run over, is ignored (:func:`_ignore_stops`).

The trainer sees the stop after the batch in progress (:func:`stop_requested`), checkpoints, shuts
its collector down, and brings the job back as :func:`next_step` says: after the time-limit
signal, and after a SIGTERM that came without a requeue from SLURM (a task or a node signalled
alone, ``scancel -s TERM``), it requeues the job itself (``scontrol requeue``, submitit's
``_requeue``) while ``max_requeues`` lasts; SLURM requeues a preempted job itself, and a cancelled
one ends. It then raises :class:`Requeued`, which ends the task without a result, so the submitter
keeps waiting for the requeued job.

Collector jobs that joined an elastic trainer (``join=JOBID``, also submitted with ``requeue=True``)
ignore both signals and register in the trainer's followers folder; the trainer requeues them with
itself and removes its rendezvous file, so that when they start again they wait for the one its
next allocation writes.
"""
from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from rpc_collectors.worker import rpc_rank

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

# how long a collector task's stop signal waits for its RPC agent, and then for the trainer
FORWARD_WAIT_S = 600.0
# seconds between a forwarding thread's looks at its signals
FORWARD_POLL_S = 5.0
# who brings a stopped job back (next_step)
NextStep = Literal["library", "slurm", "none", "unknown"]

# The first stop of the run, whichever task it reached: why, when (time.time()) and where;
# _first is taken by the one that set them.
_reason: str | None = None
_signalled_at: float | None = None
_signalled_task: str | None = None
_first = threading.Lock()
# whether this task's stop signals go to the trainer (forward_stops)
_forwarding = False


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
            rendezvous: Path | None = None, forward: bool = False) -> None:
    """In a task of a requeueable job: note the stop signals (``trainer``), forward them to the
    trainer (``forward``: a collector task of the trainer's job), or ignore them (a ``--join``
    job's, whose own allocation may end without the trainer's). ``followers``: an elastic
    trainer's folder of its ``--join`` jobs (which register there)."""
    global _forwarding
    os.environ[ENV_REQUEUE] = str(max(0, max_requeues - restart_count()))
    if followers is not None and trainer:
        os.environ[ENV_FOLLOWERS], os.environ[ENV_RENDEZVOUS] = str(followers), str(rendezvous)
    elif followers is not None:
        followers.mkdir(parents=True, exist_ok=True)
        (followers / os.environ["SLURM_JOB_ID"]).touch()
    if trainer:
        signal.signal(usr_signal(), _note)
        signal.signal(signal.SIGTERM, _note)
        # once registered (install may run again in one process)
        atexit.unregister(_ignore_stops)
        atexit.register(_ignore_stops)
    elif forward:
        _forwarding = True
        threading.Thread(target=forward_stops, name="rpc-collectors-stop-signals",
                         daemon=True).start()
    else:
        signal.signal(usr_signal(), signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _ignore_stops() -> None:
    """At the trainer task's exit: ignore the stop signals. Python puts back their default action
    (to end the process) as it finalizes, after its exit handlers; one that came then (SLURM's
    time-limit signal may come up to 60 s early, so as a finished run exits) would end the task by
    a signal, and SLURM would count the job FAILED although it completed."""
    signal.signal(usr_signal(), signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def unblock() -> None:
    """Deliver the stop signals to their handlers from now on (the task started with them blocked,
    see :mod:`.task_start`); one that came while the task started is handled now. Not in a task
    that forwards them: there they stay blocked, for its forwarding thread to take."""
    if not _forwarding:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {usr_signal(), signal.SIGTERM})


def task_name() -> str:
    """This SLURM task, in words: ``task 3 on n2``."""
    return (f"task {os.environ.get('SLURM_PROCID', '?')} on "
            f"{os.environ.get('SLURMD_NODENAME', 'this node')}")


def _reason_of(signum: int) -> str:
    return TIME_LIMIT if signum == usr_signal() else STOPPED


def _note(signum: int, frame: Any) -> None:
    noted(_reason_of(signum), task_name(), time.time())


def noted(reason: str, task: str, at: float) -> None:
    """RPC (served by the trainer), and the trainer's own handler: ``task`` of this job got a stop
    signal at ``at``; the first one of the run is kept."""
    global _reason, _signalled_at, _signalled_task
    # taken for good by the first (no wait: a signal handler may run inside another)
    if _first.acquire(blocking=False):
        _reason, _signalled_at, _signalled_task = reason, at, task


def forward_stops() -> None:
    """A collector task's thread: take the stop signals (blocked in every thread of the task, so
    only this one receives them, also those that came while it started) and tell the trainer of
    each, once its RPC agent runs."""
    told: set[str] = set()
    while True:
        signum = signal.sigtimedwait({usr_signal(), signal.SIGTERM}, FORWARD_POLL_S)
        if signum is None or _reason_of(signum.si_signo) in told:
            continue
        reason = _reason_of(signum.si_signo)
        told.add(reason)
        try:
            rpc_rank.tell_trainer(noted, (reason, task_name(), time.time()), FORWARD_WAIT_S)
        except (RuntimeError, TimeoutError) as err:
            print(f"rpc_collectors: {task_name()} got SLURM's stop signal ({reason}) and could "
                  f"not tell the trainer: {err}", file=sys.stderr, flush=True)


def stop_requested() -> str | None:
    """Why the run must stop (the time-limit signal, or SIGTERM), or None."""
    return _reason


def signalled_at() -> float | None:
    """When the first stop signal arrived (``time.time()``), or None."""
    return _signalled_at


def signalled_task() -> str | None:
    """Which task of the job the first stop signal reached (``task 2 on n2``), or None."""
    return _signalled_task


def restart_count() -> int:
    """How many times SLURM restarted this job (``SLURM_RESTART_COUNT``; 0 in
    its first allocation)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def next_step(reason: str) -> NextStep:
    """Who brings the job back after it stopped for ``reason``: ``"library"`` (:func:`requeue`
    asks SLURM: after the time-limit signal, or a SIGTERM that came without SLURM's requeue, while
    ``max_requeues`` lasts), ``"slurm"`` (preempted, ``scontrol requeue``: its restart count went
    up), ``"none"`` (cancelled, out of time, or no requeue left), ``"unknown"`` (SLURM cannot
    say)."""
    left = int(os.environ.get(ENV_REQUEUE, "0")) > 0
    if reason == TIME_LIMIT:
        return "library" if left else "none"
    state = _slurm_job()
    if state is None:
        return "unknown"
    if int(state.get("Restarts", 0)) > restart_count():
        return "slurm"
    return "library" if left and state.get("JobState") == "RUNNING" else "none"


def requeue() -> None:
    """Requeue this job (``scontrol requeue``), counting one of ``max_requeues``."""
    from submitit.slurm.slurm import SlurmJobEnvironment

    SlurmJobEnvironment()._requeue(int(os.environ[ENV_REQUEUE]) - 1)


def outcome(reason: str, step: NextStep) -> str:
    """What happens to the job after stopping for ``reason`` (``step``: :func:`next_step`'s
    answer), in words."""
    if step == "library":
        return "requeued" if reason == TIME_LIMIT else (
            "requeued (SLURM sent the SIGTERM without a requeue: a task or node signalled alone, "
            "or `scancel -s TERM`)")
    if step == "slurm":
        return "stops; SLURM requeues it (preempted or `scontrol requeue`)"
    if step == "unknown":
        return ("stops; SLURM requeues it if it was preempted or requeued, not if it was "
                "cancelled")
    state = (_slurm_job() or {}).get("JobState", "unknown")
    if reason == TIME_LIMIT or state == "RUNNING":
        return ("ends here: it has no requeue left (max_requeues); submit it again with the same "
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
    # a heterogeneous job (SLURM_JOB_ID: its leader's in every task) has a line per group; the
    # first is the leader's, whose state and restarts `scontrol requeue` changes
    leader = done.stdout.partition("\n")[0]
    return dict(field.split("=", 1) for field in leader.split() if "=" in field)


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
    global _reason, _signalled_at, _signalled_task
    _reason = _signalled_at = _signalled_task = None
    if _first.locked():
        _first.release()
