"""Frames and wall time for ``rpc-collectors demo`` (PPO, CartPole-v1, 2 local workers) to reach 475.

Runs the demo as a user does, with default settings, once per seed, and prints for each run
the frames and wall time to a mean return of 475 over the last 20 episodes, the worker
start-up time and frames/s. Not part of the test suite.

    python benchmarks/ppo_to_475.py [--seeds 0 1 2] [--workers 2] [--timeout 600]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_demo(seed: int, workers: int, extra: list[str], timeout: float) -> dict:
    """One demo run; its run.json plus the process's own wall time."""
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "rpc_collectors.apps.cli", "demo", "--seed", str(seed), "--workers", str(workers),
               "--output-dir", folder, *extra]
        start = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        elapsed = time.perf_counter() - start
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited with {result.returncode}:\n{result.stderr[-3000:]}")
        record = json.loads((Path(folder) / "run.json").read_text())
    record["process_s"] = elapsed
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--async", dest="extra", action="append_const", const="--async", default=[])
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for one run")
    args = parser.parse_args()

    print(f"{'seed':>4}  {'status':<18} {'frames':>8}  {'train s':>7}  {'start-up s':>10}  "
          f"{'process s':>9}  {'frames/s':>8}  final return")
    reached = 0
    for seed in args.seeds:
        r = run_demo(seed, args.workers, args.extra, args.timeout)
        reached += r["status"].startswith("reached")
        print(f"{seed:>4}  {r['status']:<18} {r['frames']:>8,}  {r['wall_time_s']:>7.1f}  {r['startup_s']:>10.1f}  "
              f"{r['process_s']:>9.1f}  {r['frames_per_s']:>8,.0f}  {r['final_mean_return']:.1f}", flush=True)
    print(f"{reached}/{len(args.seeds)} runs reached 475")
    return 0 if reached == len(args.seeds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
