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

A GPU trainer and CPU collector nodes in one job (a SLURM heterogeneous job): one ``--group`` per
resource group, the first the trainer's (task 0), the others the collectors'; ``--nodes``,
``--tasks-per-node``, ``--gpus-per-node``, ``--cpus-per-task``, ``--partition`` and ``--mem`` then go in the groups:

    python slurm/submit.py examples/ppo.py --group partition=gpu,gpus-per-node=1 \
        --group partition=cpu,nodes=2,tasks-per-node=32 --time 240 --log-dir ~/jobs/ppo
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


GROUP_KEYS = {"nodes": int, "tasks-per-node": int, "gpus-per-node": int, "cpus-per-task": int, "partition": str,
              "mem": str}
# the options that, with --group, belong in each group
GROUP_OPTIONS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "partition", "mem")


def _group(text: str) -> dict[str, int | str]:
    """``partition=cpu,nodes=2,tasks-per-node=32`` -> {"partition": "cpu", "nodes": 2, "tasks_per_node": 32}."""
    group: dict[str, int | str] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if key not in GROUP_KEYS or not sep:
            raise argparse.ArgumentTypeError(f"{item!r} in --group {text!r}: accepted: KEY=VALUE with KEY one of "
                                             f"{', '.join(GROUP_KEYS)}, e.g. partition=cpu,nodes=2,tasks-per-node=32")
        try:
            group[key.replace("-", "_")] = GROUP_KEYS[key](value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}={value!r} in --group {text!r}: accepted: an integer") from None
    return group


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("script", type=Path, help="training script, run as __main__ in each task")
    # None: SlurmConfig's default (1, 1, 0, 1)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--tasks-per-node", type=int)
    parser.add_argument("--gpus-per-node", type=int)
    parser.add_argument("--cpus-per-task", type=int)
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
    parser.add_argument("--group", type=_group, action="append", default=[], metavar="KEY=VALUE,...",
                        help="one resource group of a heterogeneous job, e.g. partition=cpu,nodes=2,tasks-per-node=32; "
                        f"keys: {', '.join(GROUP_KEYS)}; repeatable, the first runs the trainer (task 0)")
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
    given = [name for name in GROUP_OPTIONS if options[name] is not None]
    options = {key: value for key, value in options.items() if value is not None}
    if args.group and given:
        print(f"submit.py: --{given[0].replace('_', '-')} with --group: accepted: {given[0].replace('_', '-')}=... "
              f"in each --group", file=sys.stderr)
        return 2
    groups = dict(groups=args.group) if args.group else {}
    try:
        if args.dry_run:
            config = slurm.HetConfig(args.group, **options) if args.group else slurm.SlurmConfig(**options)
            print(slurm.sbatch_script(config))
            return 0
        job = slurm.submit(slurm.run_script, str(args.script.resolve()), script_args, **groups, **options)
    except (ValueError, TypeError, FileNotFoundError, slurm.CheckpointError, slurm.HetJobRefused) as err:
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
