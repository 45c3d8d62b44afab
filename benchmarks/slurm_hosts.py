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
- ``fit`` (not run by default): the cost model's per-request term across hosts. The ``submitit`` case
  at each of ``--shapes`` (nodes x local workers; by default 1 x 256, 2 x 128, 4 x 64, 8 x 32: the same 256
  workers, frames and load, so only the node requests per round change), ``--repeats`` times,
  interleaved; the trainer's CPU per round fitted as ``c + a x nodes`` (least squares; ``+ b x frames``
  where the shapes' workers differ), each point printed with the fit's value and its error.

Per case: constructor to first batch (and submission to first batch), frames/s over ``--seconds``
after a warm-up (ratio to ideal), the trainer's CPU per round, a 4 MB weight push over gloo broadcast
(median of 5), ``shutdown()``, the local workers left, then each job's ``sacct`` state and the
processes whose environment still holds the job's ``SLURM_JOB_ID``; the load average around each,
and just before each case the ratio of 256 bare processes sleeping the same steps with a barrier per
round (``scale.py``'s ``bare_case``: no collector, no SLURM), the machine's own ceiling at the time.

    flock /tmp/rpc-cluster.lock python benchmarks/slurm_hosts.py [--seconds 15] [--cases job submitit local]   # root; about 6 min
    flock /tmp/rpc-cluster.lock python benchmarks/slurm_hosts.py --cases fit --seconds 30   # root; about 11 min
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

import torch

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


def with_job_ends(row: dict) -> dict:
    """``row`` with its jobs' ``sacct`` states once ended and the count of their processes left."""
    return {**row, "states": final_states(row["job_ids"]),
            "processes_left": len(job_processes(row["job_ids"]))}


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


def case_submitit(root: Path, args, nodes: int = 8, per_node: int = 32) -> dict:
    """The trainer in a process of its own on this machine, submitting its ``nodes`` collector jobs of
    ``per_node`` local workers each."""
    name = f"submitit-{nodes}x{per_node}-{time.monotonic_ns()}"
    folder, out = root / f"logs-{name}", root / f"{name}.json"
    load = os.getloadavg()
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR"}
    started = time.time()
    proc = subprocess.run([sys.executable, str(TRAINER), "--launcher", "submitit", "--folder", str(folder),
                           "--out", str(out), "--seconds", str(args.seconds), "--nodes", str(nodes),
                           "--per-node", str(per_node)],
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


def shape(text: str) -> tuple[int, int]:
    """``"NxW"``: N node collectors of W local workers."""
    nodes, _, per_node = text.partition("x")
    if not (nodes.isdigit() and per_node.isdigit() and int(nodes) >= 1 and int(per_node) >= 1):
        raise argparse.ArgumentTypeError(f"shape {text!r}: accepted NxW, N node collectors of W local workers")
    return int(nodes), int(per_node)


def case_fit(root: Path, args) -> list[dict]:
    """The ``submitit`` case at each of ``args.shapes``, ``args.repeats`` times, interleaved; a case that
    fails is reported and left out."""
    rows = []
    for repeat in range(args.repeats):
        for nodes, per_node in args.shapes:
            try:
                row = with_job_ends(case_submitit(root, args, nodes, per_node))
            except Exception as err:
                print(f"fit {nodes}x{per_node} (run {repeat + 1}): FAILED: {err}", flush=True)
                continue
            rows.append(row)
            print(f"fit {nodes}x{per_node} (run {repeat + 1}): {row['ratio']:.3f} of ideal, trainer CPU "
                  f"{row['cpu_ms_per_round']:.2f} ms per round over {row['batches']} rounds, load "
                  f"{row['load_before'][0]:.1f} -> {row['load'][0]:.1f}, jobs {sorted(set(row['states'].values()))}, "
                  f"processes left {row['processes_left']}", flush=True)
    return rows


def report_fit(rows: list[dict]) -> None:
    """``cpu_ms_per_round = c + a x nodes (+ b x frames, where the frames per round differ)`` over
    ``rows`` (least squares), each point beside the fit."""
    if len({row["nodes"] for row in rows}) < 2:
        print("fit: fewer than two node counts measured, no fit")
        return
    frames = {row["nodes"] * row["frames_per_request"] for row in rows}
    terms = [lambda row: 1.0, lambda row: row["nodes"]]
    if len(frames) > 1:
        terms.append(lambda row: row["nodes"] * row["frames_per_request"])
    x = torch.tensor([[term(row) for term in terms] for row in rows], dtype=torch.float64)
    y = torch.tensor([row["cpu_ms_per_round"] for row in rows], dtype=torch.float64)
    coefficients = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()
    c, a = coefficients[:2]
    per_frame = f" + {coefficients[2] * 1e3:.3f} us x frames" if len(frames) > 1 else ""
    print(f"\ntrainer CPU per round = {c:.2f} ms + {a:.3f} ms x nodes{per_frame} (least squares over "
          f"{len(rows)} runs)")
    print(f"{'nodes x workers':>16}{'frames':>8}{'measured ms':>13}{'fit ms':>8}{'error':>8}{'ratio':>8}{'rounds':>8}")
    for row in rows:
        model = sum(k * term(row) for k, term in zip(coefficients, terms))
        print(f"{row['nodes']:>9} x {row['per_node']:<4}{row['nodes'] * row['frames_per_request']:>8.0f}"
              f"{row['cpu_ms_per_round']:>13.2f}{model:>8.2f}{(row['cpu_ms_per_round'] - model) / model:>+8.0%}"
              f"{row['ratio']:>8.3f}{row['batches']:>8}")


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
    parser.add_argument("--cases", nargs="+", default=["job", "submitit", "local"],
                        choices=["job", "submitit", "local", "fit"])
    parser.add_argument("--shapes", nargs="+", type=shape, default=[(1, 256), (2, 128), (4, 64), (8, 32)],
                        help="fit: NxW, N node collectors of W local workers each")
    parser.add_argument("--repeats", type=int, default=2, help="fit: runs of each shape, interleaved")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rpcc-slurm-hosts-"))
    root.chmod(0o755)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the jobs inherit it: the tasks and the collector jobs import _common and scale
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(REPO / "benchmarks"),
                                                             os.environ.get("PYTHONPATH")]))
    cluster = devcluster()
    rows: dict[str, dict] = {}
    fitted: list[dict] = []
    try:
        started = time.perf_counter()
        up = cluster.start(8, root / "cluster")
        os.environ["SLURM_CONF"] = str(up.slurm_conf)
        print(f"dev cluster up in {time.perf_counter() - started:.1f} s: {up.nodes}", flush=True)
        for name in args.cases:
            if name == "fit":
                fitted = case_fit(root, args)
                continue
            try:
                bare = bare_ratio()
                row = {"job": case_job, "submitit": case_submitit, "local": case_local}[name](root, args)
            except Exception as err:
                print(f"{name}: FAILED: {err}", flush=True)
                continue
            row["bare_ratio"] = bare
            rows[name] = with_job_ends(row) if row["job_ids"] else row
            print(f"{name}: {row['ratio']:.3f} of ideal, first batch {row['first_batch_s']:.1f} s", flush=True)
    finally:
        cluster.stop(root / "cluster")
    if rows:
        report(rows)
        print(json.dumps(rows))
    if fitted:
        report_fit(fitted)
        print(json.dumps(fitted))
    expected = len(args.shapes) * args.repeats if "fit" in args.cases else 0
    return 0 if len(rows) == len(set(args.cases) - {"fit"}) and len(fitted) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
