"""Restart soak: what 200 worker restarts leave in the trainer, and whether batches keep their slots.

2 local workers step ``_common.NoWorkEnv`` with 4x84x84 uint8 observations (batches of 64
frames, about 3.6 MB: the shared-memory data plane) under ``max_worker_restarts``. Each
iteration takes a batch, SIGKILLs one worker (alternating) and pushes the trainer's weights,
so most deaths are noticed inside ``update_policy_weights_``, as in a training loop. Printed:
the trainer's open descriptors, threads and RSS after the first restarts and after all of
them, and how each worker's batches travel at the end (``shm`` with every slot free but the
ones asked for: none was lost to a dead worker).

    python benchmarks/restart_soak.py [--restarts 200]
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time
import warnings

import torch
from torch import nn

from _common import make_no_work_env, quiet, rss_mib
from rpc_collectors import MultiCollector
from rpc_collectors.transport.membership import WorkerRestartWarning


class FirstPixel(nn.Module):
    """A policy with weights to push: ``argmax`` of a linear map of the first 4 pixels."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation.flatten(-3)[..., :4].float()).argmax(-1)


def snapshot() -> dict:
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
            "rss_mib": round(rss_mib([os.getpid()]), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--restarts", type=int, default=200)
    args = parser.parse_args()
    quiet()
    warnings.simplefilter("ignore", WorkerRestartWarning)
    env = lambda: make_no_work_env((4, 84, 84), "uint8")  # noqa: E731
    collector = MultiCollector([env, env], FirstPixel(), frames_per_batch=64, sync=False,
                               max_worker_restarts=args.restarts, rpc_timeout=30)
    started = time.monotonic()
    marks: dict[int, dict] = {}
    with collector:
        batches = iter(collector)
        for k in range(args.restarts):
            next(batches)
            os.kill(collector.infos[k % 2]["pid"], signal.SIGKILL)
            collector.update_policy_weights_()
            if k + 1 in (10, args.restarts // 2):
                marks[k + 1] = snapshot()
        for _ in range(20):
            next(batches)
        late = snapshot()
        plane = collector.slots.plane
        paths = [plane.path_of(w) for w in range(2)]
        lost = [len(plane.pools[w]._written) - collector.roster[w].outstanding for w in range(2)]
        print(f"restarts: {sum(collector.worker_restarts)} in {time.monotonic() - started:.1f} s")
        marks[args.restarts] = late
        for count, mark in marks.items():
            print(f"after {count:4d} restarts: {mark}")
        print(f"batch paths at the end: {paths}; slots held beyond requests in flight: {lost}")


if __name__ == "__main__":
    main()
