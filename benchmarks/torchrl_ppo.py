"""TorchRL's PPO tutorial loop (``examples/torchrl_ppo.py``) with our ``MultiSyncCollector`` and with TorchRL's.

Both runs use the same seed, env, networks and hyperparameters, each in a fresh process; the
script prints frames/s, collector construction and shutdown times, and the mean reward per
step of every batch side by side. Needs torchrl (tested with 0.14.1).

    python benchmarks/torchrl_ppo.py                         # Pendulum-v1 (HalfCheetah-v4 with mujoco), 4 workers
    python benchmarks/torchrl_ppo.py --total-frames 20480 --frames-per-batch 2048
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "torchrl_ppo.py"
LINE = re.compile(r"frames\s+(\d+)\s+reward\s+(-?[\d.]+)\s+fps\s+(\d+)")
TIMES = re.compile(r"collector built in ([\d.]+) s, shut down in ([\d.]+) s")


def run(collector: str, args: list[str], timeout: float) -> dict:
    """Run the example with ``--collector collector``; parse its per-batch lines."""
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--collector", collector, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{collector}: exit code {proc.returncode}\n{proc.stderr[-3000:]}")
    rows = [tuple(float(x) for x in m.groups()) for m in LINE.finditer(proc.stdout)]
    built, shutdown = (float(x) for x in TIMES.search(proc.stdout).groups())
    return {"rows": rows, "built": built, "shutdown": shutdown}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for each run")
    known, rest = p.parse_known_args()  # everything else goes to the example
    results = {name: run(name, rest, known.timeout) for name in ("ours", "torchrl")}
    ours, theirs = results["ours"], results["torchrl"]
    print(f"example arguments: {' '.join(rest) or '(defaults)'}")
    print(f"{'frames':>8} | {'reward ours':>11} {'reward torchrl':>14} | {'fps ours':>8} {'fps torchrl':>11}")
    for (f, r_o, fps_o), (_, r_t, fps_t) in zip(ours["rows"], theirs["rows"]):
        print(f"{int(f):>8} | {r_o:>11.4f} {r_t:>14.4f} | {int(fps_o):>8} {int(fps_t):>11}")
    fps_o, fps_t = ours["rows"][-1][2], theirs["rows"][-1][2]
    print(f"frames/s of the whole loop: ours {fps_o:.0f}, torchrl {fps_t:.0f} ({fps_o / fps_t:.2f}x)")
    print(f"collector construction: ours {ours['built']:.1f} s, torchrl {theirs['built']:.1f} s")
    print(f"collector shutdown:     ours {ours['shutdown']:.1f} s, torchrl {theirs['shutdown']:.1f} s")


if __name__ == "__main__":
    main()
