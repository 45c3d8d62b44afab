"""A run checkpointed every 3 batches that kills itself with SIGKILL after 5 (test_continuity.py).

Usage: ``python killed_run.py KIND CHECKPOINT_DIR OUT_DIR RUN``; every batch handed out is saved
as ``OUT_DIR/RUN-<n>.pt``, and the pids of its worker processes to ``OUT_DIR/RUN.pids``.
"""
from __future__ import annotations

import os
import signal
import sys

import torch

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv, MultiCollector, RunCheckpoint


def count_env() -> GymEnv:
    return GymEnv(CountEnv())  # episodes of 3, 5 and 2 steps: every batch starts new trajectories


def main(kind: str, directory: str, out: str, run: str) -> None:
    if kind == "Collector":
        collector = Collector(count_env, None, frames_per_batch=7)
    else:
        collector = MultiCollector([count_env] * 2, None, frames_per_batch=14, cat_results="stack", rpc_timeout=60)
        with open(os.path.join(out, f"{run}.pids"), "w") as f:
            f.write(" ".join(str(info["pid"]) for info in collector.infos))
    checkpoint = RunCheckpoint(directory, collector=collector, every=3)
    checkpoint.resume()
    for n, batch in enumerate(collector):
        torch.save(batch.clone(), os.path.join(out, f"{run}-{n:03d}.pt"))
        checkpoint.after_batch()
        if n == 4:  # two batches after the last checkpoint
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(*sys.argv[1:])
