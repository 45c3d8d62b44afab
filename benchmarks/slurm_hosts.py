"""256 workers on 8 hosts started by SLURM: 8 node collectors of 32 local workers, one per host, on
a 50 ms env (``_common.SleepEnv``), sync, 20 steps per local worker per batch; ideal = 256 / 0.05
frames/s.

Starts the dev cluster with 8 nodes (``slurm/devcluster.py``: each slurmd in its own network
namespace, 10.77.0.1-8; this machine at 10.77.0.254), in a fresh folder under /tmp, and stops it at
the end whatever happened. Then three cases (the trainer of the first two:
``benchmarks/slurm_hosts_trainer.py``):

- ``job``: one SLURM job, the path of ``slurm/submit.py``: ``slurm.submit(slurm.run_script, trainer,
  nodes=8, tasks_per_node=2, sbatch_flags={"ntasks": 9}, cpus_per_task=4)``: 9 tasks on 8 nodes, SLURM's
  block layout puts tasks 0 (the trainer) and 1 on n1 and one task on each other node; every task but
  0 serves a node collector (``launcher="slurm"``).
- ``submitit``: the trainer runs in a process of this script on this machine (the bridge's
  10.77.0.254) and submits its 8 collector jobs itself (``launcher="submitit"``, one single-task job
  of 8 CPUs each: a node each).
- ``local``: no SLURM, for comparison: ``scale.py``'s 8 node collectors x 32 local workers on this host
  (local launcher; weights through shared memory, not broadcast).

Per case: constructor to first batch (and submission to first batch), frames/s over ``--seconds``
after a warm-up (ratio to ideal), the trainer's CPU per round, a 4 MB weight push over gloo broadcast
(median of 5), ``shutdown()``, the local workers left, then each job's ``sacct`` state and the
processes whose environment still holds the job's ``SLURM_JOB_ID``; the load average around each,
and just before each case the ratio of 256 bare processes sleeping the same steps with a barrier per
round (``scale.py``'s ``bare_case``: no collector, no SLURM), the machine's own ceiling at the time.

    flock /tmp/rpc-cluster.lock python benchmarks/slurm_hosts.py [--seconds 15] [--cases job submitit local]   # root; about 6 min
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAINER = REPO / "benchmarks" / "slurm_hosts_trainer.py"
SCALE = REPO / "benchmarks" / "scale.py"
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
from _common import devcluster, run_case  # noqa: E402
from rpc_collectors import slurm  # noqa: E402
from rpc_collectors.cluster import requeue  # noqa: E402


def final_states(job_ids: list[str], timeout_s: float = 60.0) -> dict[str, str]:
    """``sacct`` states of the jobs, once accounting has them all ended (or after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                              capture_output=True, text=True, timeout=30)
        states = dict(line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line)
        if (len(states) == len(job_ids) and not set(requeue.UNFINISHED) & set(states.values())) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def job_processes(job_ids: list[str], timeout_s: float = 30.0) -> list[int]:
    """Pids whose environment holds ``SLURM_JOB_ID=<one of job_ids>``, once none is left (or after
    ``timeout_s``)."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode() for job_id in job_ids}
    deadline = time.monotonic() + timeout_s
    while True:
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if wanted & set((entry / "environ").read_bytes().split(b"\0")):
                        pids.append(int(entry.name))
                except OSError:
                    continue
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.5)


def read_json(path: Path) -> dict:
    if not path.exists():
        raise RuntimeError(f"the trainer wrote no {path}")
    return json.loads(path.read_text())


def case_job(root: Path, args) -> dict:
    """One SLURM job: task 0 trains, tasks 1-8 serve a node collector each (task 1 beside it on n1)."""
    logs, out = root / "logs-job", root / "job.json"
    load = os.getloadavg()
    submitted = time.time()
    job = slurm.submit(slurm.run_script, str(TRAINER), ["--launcher", "slurm", "--out", str(out),
                                                        "--seconds", str(args.seconds)],
                       log_dir=logs, nodes=8, tasks_per_node=2, sbatch_flags={"ntasks": 9}, cpus_per_task=4,
                       time_min=15, job_name="slurm-hosts")
    print(f"job: SLURM job {job.job_id}, logs in {logs}", flush=True)
    try:
        slurm.result(job, timeout_s=600)
    finally:
        subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30)
    ended = time.time()
    result = read_json(out)
    layout = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,NNodes,NTasks,NodeList", "-j", job.job_id],
                            capture_output=True, text=True, timeout=30).stdout.split()
    return {**result, "submit_to_first_batch_s": result["first_batch_at"] - submitted,
            "submit_to_end_s": ended - submitted, "load_before": load, "layout": layout}


def case_submitit(root: Path, args) -> dict:
    """The trainer in a process of its own on this machine, submitting its 8 collector jobs."""
    folder, out = root / "logs-submitit", root / "submitit.json"
    load = os.getloadavg()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    started = time.time()
    proc = subprocess.run([sys.executable, str(TRAINER), "--launcher", "submitit", "--folder", str(folder),
                           "--out", str(out), "--seconds", str(args.seconds)],
                          capture_output=True, text=True, env=env, timeout=900)
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"the submitit trainer failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = read_json(out)
    return {**result, "submit_to_first_batch_s": result["first_batch_at"] - started,
            "submit_to_end_s": ended - started, "load_before": load}


def bare_ratio() -> float:
    """256 bare processes sleeping the same steps with a barrier per round, no collector and no SLURM
    (``scale.py``'s ``bare_case``): what a sync round of 256 workers can reach on this machine now."""
    case = {"workers": 256, "rounds": 8, "steps": 20, "step_s": 0.05}
    return run_case(str(SCALE), case, timeout=300)["ratio"]


def case_local(root: Path, args) -> dict:
    """No SLURM: ``scale.py``'s 8 node collectors x 32 local workers on this host (the local launcher,
    weights through shared memory), the same env, batches and measurements."""
    load = os.getloadavg()
    case = {"nodes": 8, "per": 32, "sync": True, "step_s": 0.05, "steps": 20, "seconds": args.seconds}
    row = run_case(str(SCALE), case, timeout=600)
    return {**row, "ratio": row["frames_per_s"] / (256 / 0.05), "load_before": load, "load": os.getloadavg(),
            "job_ids": []}


def report(rows: dict[str, dict]) -> None:
    names = list(rows)
    lines = [
        ("ratio to ideal (256 / 0.05 s)", "ratio", "{:.3f}"),
        ("256 bare processes just before", "bare_ratio", "{:.3f}"),
        ("frames/s", "frames_per_s", "{:,.0f}"),
        ("constructor to first batch (s)", "first_batch_s", "{:.1f}"),
        ("start to first batch (s)", "submit_to_first_batch_s", "{:.1f}"),
        ("trainer CPU per round (ms)", "cpu_ms_per_round", "{:.2f}"),
        ("4 MB weight push, median of 5 (ms)", "push_ms", "{:.1f}"),
        ("version after the pushes", "version_after_pushes", "{}"),
        ("shutdown() (s)", "shutdown_s", "{:.2f}"),
        ("local workers left", "workers_left", "{}"),
        ("local worker USS, median (MiB)", "uss_mib_median", "{:.1f}"),
        ("start to all jobs ended (s)", "submit_to_end_s", "{:.1f}"),
        ("job processes left", "processes_left", "{}"),
    ]
    print(f"\n{'':38}" + "".join(f"{name:>16}" for name in names))
    for title, key, fmt in lines:
        cells = [fmt.format(rows[n][key]) if key in rows[n] else "-" for n in names]
        print(f"{title:38}" + "".join(f"{cell:>16}" for cell in cells))
    for name in names:
        row = rows[name]
        where = (f"jobs {row['states']}; collectors at {row['addresses']}, {row['local_workers']} local workers; "
                 if row["job_ids"] else "")
        print(f"{name}: {where}load average {row['load_before'][0]:.1f} before, {row['load'][0]:.1f} at the end"
              + (f"; layout {row['layout']}" if "layout" in row else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured collection after a warm-up")
    parser.add_argument("--cases", nargs="+", default=["job", "submitit", "local"], choices=["job", "submitit", "local"])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rpcc-slurm-hosts-"))
    root.chmod(0o755)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the jobs inherit it: the tasks and the collector jobs import _common and scale
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "benchmarks"),
                                                             os.environ.get("PYTHONPATH")]))
    cluster = devcluster()
    rows: dict[str, dict] = {}
    try:
        started = time.perf_counter()
        up = cluster.start(8, root / "cluster")
        os.environ["SLURM_CONF"] = str(up.slurm_conf)
        print(f"dev cluster up in {time.perf_counter() - started:.1f} s: {up.nodes}", flush=True)
        for name in args.cases:
            try:
                bare = bare_ratio()
                row = {"job": case_job, "submitit": case_submitit, "local": case_local}[name](root, args)
            except Exception as err:
                print(f"{name}: FAILED: {err}", flush=True)
                continue
            row["bare_ratio"] = bare
            if row["job_ids"]:
                row["states"] = final_states(row["job_ids"])
                row["processes_left"] = len(job_processes(row["job_ids"]))
            rows[name] = row
            print(f"{name}: {row['ratio']:.3f} of ideal, first batch {row['first_batch_s']:.1f} s", flush=True)
    finally:
        cluster.stop(root / "cluster")
    if rows:
        report(rows)
        print(json.dumps(rows))
    return 0 if len(rows) == len(args.cases) else 1


if __name__ == "__main__":
    sys.exit(main())
