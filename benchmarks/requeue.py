"""Requeue at the time limit on a local SLURM cluster: the time from SLURM's signal to the requeued
job's first batch, and the frames lost per requeue.

A trainer job with two collector tasks (``tests/scripts/requeue_trainer.py``: CartPole slowed by 20 ms a
step, 100 frames a batch, about a second each) is submitted with ``--time 2``, the signal 60 s
before, ``requeue=True``, and enough frames for several allocations. Its ``run.json`` gives, for
each requeue: seconds from the signal to the next allocation's start, and to its first batch
trained on; frames the workers collected that no batch delivered (lost), besides the batch in
progress, which is trained on before the checkpoint. Needs root and the dev cluster's packages;
uses the cluster ``SLURM_CONF`` points at, or starts one (``slurm/devcluster.py``).

    python benchmarks/requeue.py [--frames 9000]      # about 5 minutes
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from _common import devcluster  # noqa: E402
from rpc_collectors.cluster import submission as slurm  # noqa: E402


def epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=9000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rpcc-requeue-bench-"))
    root.chmod(0o755)
    started = None
    if "SLURM_CONF" not in os.environ:
        started = devcluster().start(1, root / "cluster")
        os.environ["SLURM_CONF"] = str(started.slurm_conf)
    try:
        job = slurm.submit(slurm.run_script, str(REPO / "tests" / "scripts" / "requeue_trainer.py"),
                           ["--frames", str(args.frames), "--batch", "100", "--step-sleep", "0.02"],
                           log_dir=root / "logs", tasks_per_node=3, time_min=2, signal_delay_s=60,
                           requeue=True, checkpoint_dir=root / "ckpt")
        print(f"job {job.job_id}: {args.frames} frames; logs in {root / 'logs'}", flush=True)
        slurm.result(job, timeout_s=1800)
        starts = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job.job_id, "-o", "Start"],
                                capture_output=True, text=True, timeout=60, check=True).stdout.split()
    finally:
        if started is not None:
            devcluster().stop(started.workdir)
            shutil.rmtree(started.workdir)  # MariaDB's data: hundreds of MB
    allocations = json.loads((root / "ckpt" / "run.json").read_text())["allocations"]
    print("| requeue | signal -> SLURM restarts the job | -> collector up | -> first batch trained | "
          "frames lost | frames trained in the allocation |")
    print("| --- | --- | --- | --- | --- | --- |")
    lost_before = 0
    for i, (ended, nxt) in enumerate(zip(allocations, allocations[1:]), start=1):
        lost = ended.get("undelivered_frames", 0) - lost_before
        lost_before = ended.get("undelivered_frames", 0)
        signal = ended["signal_at"]
        print(f"| {i} ({ended['end']}) | {epoch(starts[i]) - signal:.0f} s | {epoch(nxt['start']) - signal:.0f} s "
              f"| {nxt['first_batch_at'] - signal:.1f} s | {lost} | {ended['frames'] - ended['start_frames']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
