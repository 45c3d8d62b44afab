"""Cancels a trainer's collector jobs once the trainer is gone (run as a script, not imported).

:mod:`rpc_collectors.cluster.jobs` starts it in a session of its own (so Ctrl-C at the
terminal does not reach it) and writes the id of every job it submits to its stdin, one per
line. When stdin ends, because the trainer closed it at shutdown or because the trainer died
(even by SIGKILL), it runs ``scancel`` on every job it was given; jobs that already ended are
left as they are.
"""
import subprocess
import sys


def main() -> None:
    jobs = [line.strip() for line in sys.stdin if line.strip()]
    if jobs:
        subprocess.run(["scancel", *jobs], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120, check=False)


if __name__ == "__main__":
    main()
