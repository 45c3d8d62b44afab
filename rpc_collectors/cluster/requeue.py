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
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

ENV_REQUEUE = "RPC_COLLECTORS_REQUEUE"  # in a job's tasks: how many requeues the job may still use
TIME_LIMIT = "time limit"
STOPPED = "stopped by SLURM (SIGTERM: preempted, requeued or cancelled)"

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


def install(trainer: bool, max_requeues: int) -> None:
    """In a task of a requeueable job: note the stop signals (trainer) or ignore them (collectors)."""
    os.environ[ENV_REQUEUE] = str(max(0, max_requeues - restart_count()))
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


def enabled() -> bool:
    """Whether this process is a task of a job submitted with ``requeue=True``."""
    return ENV_REQUEUE in os.environ


def restart_count() -> int:
    """How many times SLURM restarted this job (``SLURM_RESTART_COUNT``; 0 in its first allocation)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def requeue(reason: str) -> bool:
    """Requeue this job after the time-limit signal (``scontrol requeue``); SLURM requeues a preempted
    one itself. False when the job used up its ``max_requeues``; then it ends here."""
    if reason != TIME_LIMIT:
        return True
    left = int(os.environ.get(ENV_REQUEUE, "0"))
    if left <= 0:
        print(f"rpc_collectors: job {os.environ.get('SLURM_JOB_ID')} reached its time limit and has no requeue left "
              "(max_requeues); it ends here", file=sys.stderr, flush=True)
        return False
    from submitit.slurm.slurm import SlurmJobEnvironment

    SlurmJobEnvironment()._requeue(left - 1)
    return True


def reset() -> None:
    """Forget a stop request (for a process that runs several jobs' functions, and tests)."""
    global _reason, _signalled_at
    _reason = _signalled_at = None
