"""The training script of ``benchmarks/slurm_hosts.py``: node collectors of local workers (8 of 32 by
default) on a 50 ms env, sync, measured as ``benchmarks/scale.py`` measures (``scale.measure``).

- ``--launcher slurm``: every task of one SLURM job runs it (``slurm.submit(slurm.run_script, ...)``);
  task 0 trains, each other task serves a node collector (its constructor does not return there).
- ``--launcher submitit``: this process trains and submits the ``--nodes`` collector jobs itself
  (``slurm_kwargs["folder"]`` is ``--folder``).

The trainer writes its figures as JSON to ``--out``: constructor to first batch, frames/s over
``--seconds`` after a warm-up, the trainer's CPU per round, a 4 MB weight push (median of 5),
``shutdown()`` and the local workers left, the collectors' addresses and its SLURM job ids.

    python benchmarks/slurm_hosts_trainer.py --launcher submitit --folder DIR --out FILE
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import _common  # noqa: E402
from scale import STEP_S, ScalePolicy, measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launcher", choices=["slurm", "submitit"], required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the trainer writes its JSON")
    parser.add_argument("--folder", type=Path, help="submitit: the collector jobs' folder")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=8, help="node collectors (slurm: the job's tasks but 0)")
    parser.add_argument("--per-node", type=int, default=32, help="local workers of each node collector")
    parser.add_argument("--steps", type=int, default=20, help="steps per local worker per batch")
    parser.add_argument("--time-min", type=int, default=15, help="submitit: the jobs' time limit")
    args = parser.parse_args()
    from rpc_collectors import RPCCollector

    _common.quiet()
    torch.set_num_threads(1)
    launch = {"launcher": "slurm"} if args.launcher == "slurm" else {
        "launcher": "submitit", "num_collectors": args.nodes, "join_timeout": 400,
        # a whole node (8 declared CPUs) per job: one collector per host
        "slurm_kwargs": {"folder": str(args.folder), "timeout_min": args.time_min, "slurm_cpus_per_task": 8},
    }
    t0, t0_epoch = time.perf_counter(), time.time()
    # the collector tasks of a SLURM job serve inside this call and exit there
    collector = RPCCollector(
        functools.partial(_common.make_sleep_env, STEP_S), ScalePolicy(), rpc_timeout=120,
        collector_class="sync", num_workers_per_collector=args.per_node, sync=True,
        frames_per_batch=args.nodes * args.per_node * args.steps, track_policy_version=True,
        weight_transport="broadcast", **launch,
    )
    built = time.perf_counter() - t0
    infos = collector.infos
    jobs = getattr(collector.workers, "jobs", None)
    job_ids = [job.job_id for job in jobs.jobs] if jobs is not None else [os.environ.get("SLURM_JOB_ID")]
    out = measure(collector, args.seconds, args.nodes, t0)
    out.update(
        constructor_s=built, first_batch_at=t0_epoch + out["first_batch_s"], started_at=t0_epoch,
        addresses=[info.get("address") for info in infos], local_workers=[len(info["local_pids"]) for info in infos],
        trainer_address=os.environ.get("MASTER_ADDR"), job_ids=job_ids, launcher=args.launcher,
        ratio=out["frames_per_s"] / (args.nodes * args.per_node / STEP_S), nodes=args.nodes,
        per_node=args.per_node, load=os.getloadavg(),
    )
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(args.out)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
