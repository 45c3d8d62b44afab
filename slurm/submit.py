"""Submit a training script to SLURM: every task runs it as ``__main__`` with torch variables set.

    python slurm/submit.py launch/train.py --lr 3e-4 --nodes 2 --tasks-per-node 4 \\
        --gpus-per-node 4 --partition gpu --time 120 --log-dir ~/jobs/ppo --wait

Options this script knows are taken wherever they appear; everything else is passed to the
training script. Task 0 (RANK=0) trains, the other tasks serve collectors. ``--dry-run``
prints the sbatch script without submitting.

Elastic runs (the script builds its collector with ``elastic=True``): submit the trainer with
``--elastic``, then any number of collector-only jobs with ``--join JOBID`` and the same
``--log-dir``; they join the running trainer, and may be cancelled or preempted:

    python slurm/submit.py train.py --elastic --partition gpu --gpus-per-node 1 --log-dir ~/jobs/ppo
    python slurm/submit.py train.py --join 1234 --partition cpu-preempt --tasks-per-node 32 --log-dir ~/jobs/ppo

Runs longer than the time limit (the script checkpoints with ``RunCheckpoint``): ``--requeue
--checkpoint-dir DIR``; SLURM signals the job ``--signal-delay`` seconds before the limit, the
trainer checkpoints after its batch and the job requeues (as on preemption), then resumes:

    python slurm/submit.py examples/ppo.py --requeue --checkpoint-dir ~/jobs/ppo/ckpt --time 240 --log-dir ~/jobs/ppo
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from submitit.core.utils import FailedJobError, UncompletedJobError

REPO = Path(__file__).resolve().parents[1]
try:
    from rpc_collectors import slurm
except ImportError:  # running from a checkout without installing: jobs need the path too
    sys.path.insert(0, str(REPO))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    from rpc_collectors import slurm


def _sbatch_flag(text: str) -> tuple[str, str | bool]:
    """``key=value`` -> (key, value); ``key`` -> (key, True)."""
    key, sep, value = text.partition("=")
    return key, (value if sep else True)


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("script", type=Path, help="training script, run as __main__ in each task")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--tasks-per-node", type=int, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--cpus-per-task", type=int, default=1)
    parser.add_argument("--partition")
    parser.add_argument("--time", type=int, default=60, help="time limit in minutes")
    parser.add_argument("--mem", help="memory per node, sbatch format: 16G, 500M")
    parser.add_argument("--sbatch-flag", type=_sbatch_flag, action="append", default=[],
                        metavar="KEY[=VALUE]", help="extra sbatch option, e.g. account=proj; repeatable")
    parser.add_argument("--interface", help="network interface for gloo/TensorPipe (default: "
                        "the one that routes to MASTER_ADDR)")
    parser.add_argument("--job-name", default="rpc_collectors")
    parser.add_argument("--log-dir", type=Path, required=True, help="folder shared by all nodes")
    parser.add_argument("--wait", action="store_true", help="wait and print the job's outcome")
    parser.add_argument("--timeout", type=float, help="with --wait: give up waiting after SECONDS")
    parser.add_argument("--dry-run", action="store_true", help="print the sbatch script only")
    parser.add_argument("--elastic", action="store_true", help="a trainer that collector jobs may join "
                        "(--join); a failed task does not end the job")
    parser.add_argument("--join", metavar="JOBID", help="run collectors only, joining the elastic trainer "
                        "of job JOBID (same --log-dir)")
    parser.add_argument("--requeue", action="store_true", help="at the time limit or on preemption: the "
                        "trainer checkpoints after its batch and the job requeues")
    parser.add_argument("--signal-delay", type=int, default=120, metavar="SECONDS",
                        help="with --requeue: SLURM's signal this many seconds before the time limit")
    parser.add_argument("--max-requeues", type=int, default=10, help="with --requeue: at most this many "
                        "requeues at the time limit or after a stray SIGTERM")
    parser.add_argument("--checkpoint-dir", type=Path, help="where the script's RunCheckpoint keeps the run "
                        "($RPC_COLLECTORS_CHECKPOINT_DIR in the job); checked before submitting")
    return parser.parse_known_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args, script_args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.script.is_file():
        print(f"submit.py: script {args.script} does not exist", file=sys.stderr)
        return 2
    options = dict(
        log_dir=args.log_dir.expanduser().resolve(), nodes=args.nodes, tasks_per_node=args.tasks_per_node,
        gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task, partition=args.partition,
        time_min=args.time, mem=args.mem, sbatch_flags=dict(args.sbatch_flag), interface=args.interface,
        job_name=args.job_name, elastic=args.elastic, join=args.join, requeue=args.requeue,
        signal_delay_s=args.signal_delay, max_requeues=args.max_requeues, checkpoint_dir=args.checkpoint_dir,
    )
    try:
        if args.dry_run:
            print(slurm.sbatch_script(slurm.SlurmConfig(**options)))
            return 0
        job = slurm.submit(slurm.run_script, str(args.script.resolve()), script_args, **options)
    except (ValueError, TypeError, FileNotFoundError, slurm.CheckpointError) as err:
        print(f"submit.py: {err}", file=sys.stderr)
        return 2
    print(f"submitted SLURM job {job.job_id}; logs: {job.paths.stdout} and {job.paths.stderr} "
          f"(%t = task number)", flush=True)
    if not args.wait:
        return 0
    try:
        slurm.result(job, timeout_s=args.timeout)
    except (FailedJobError, UncompletedJobError, TimeoutError) as err:
        print(f"submit.py: {err}", file=sys.stderr)
        return 1
    finally:
        print(f"--- task 0 output ---\n{job.task(0).stdout() or ''}", flush=True)
    print(f"job {job.job_id} completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
