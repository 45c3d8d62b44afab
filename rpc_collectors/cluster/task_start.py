"""Starts a SLURM task's Python with the job's stop signals blocked (run as a script, not imported).

SLURM may signal a job (submitit's time-limit signal, ``SIGUSR2``, or ``SIGTERM``) at any moment,
also while its tasks start Python, torch and the user's code, before a handler is installed;
the signal's default action would end the task. :func:`rpc_collectors.cluster.submission.submit`
starts every task through this script (:func:`python_command`, then Python's arguments): it blocks
both signals and execs the same Python with the task's arguments. The mask survives ``exec``, so
a signal that comes during start-up waits, pending, until the task has installed its handlers
and unblocks it (:func:`rpc_collectors.cluster.requeue.unblock`).
"""
import os
import shlex
import signal
import sys


def python_command() -> str:
    """The command that starts Python in a task (submitit's ``python``
    option): through this script."""
    return f"{shlex.quote(sys.executable)} -S {shlex.quote(os.path.abspath(__file__))}"


def main() -> None:
    # as submitit names it
    usr = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
    signal.pthread_sigmask(signal.SIG_BLOCK, {usr, signal.SIGTERM})
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


if __name__ == "__main__":
    main()
