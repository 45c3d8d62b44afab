"""Start-up and shutdown of 8 local workers, and no process left behind.

Each repeat runs in a fresh Python process (torch already imported, as in a training script):
``RPCCollector(..., num_collectors=8, launcher="local")`` on CartPole-v1 with an
argmax ``nn.Linear(4, 2)`` policy (so the weight plane is joined too), timed from the constructor
call to the first batch in the trainer's hands, then ``shutdown()`` timed. After shutdown
the benchmark checks that no descendant of the trainer process is alive and that every
worker pid (and the spawner's) is gone.

    python benchmarks/rpc_startup.py [--workers 8] [--repeats 3] [--transport auto]

Goals: first batch <= 3 s (TorchRL's RPCCollector: 26.6 s), shutdown <= 2 s, no process left.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import _common
from _common import ArgmaxLinear, alive, children_of, emit, run_case
from rpc_collectors import RPCCollector
from rpc_collectors.worker import spawner as spawner_module


def run(case: dict) -> dict:
    _common.quiet()
    torch.set_num_threads(1)
    n = case["workers"]
    policy = ArgmaxLinear()
    t0 = time.perf_counter()
    collector = RPCCollector(
        "CartPole-v1", policy, num_collectors=n, frames_per_batch=50 * n, launcher="local",
        weight_transport=case["transport"], cat_results="stack",
    )
    t_built = time.perf_counter() - t0
    batch = collector.next()
    t_first = time.perf_counter() - t0
    assert batch.shape == (n, 50), batch.shape
    pids = [info["pid"] for info in collector.infos]
    # the process that forks workers: per collector, or shared by the collectors of this process
    shared = getattr(spawner_module, "shared_pid", lambda: None)()
    own = getattr(getattr(collector.workers, "spawner", None), "pid", None)
    spawner = own if own is not None and own != shared else None
    before = len(children_of())
    t1 = time.perf_counter()
    collector.shutdown()
    t_shutdown = time.perf_counter() - t1
    t2 = time.perf_counter()
    collector.shutdown()  # idempotent
    t_again = time.perf_counter() - t2
    left = [p for p in children_of() if p != shared]  # a shared spawner outlives collectors, by design
    workers_alive = [p for p in pids + ([spawner] if spawner else []) if alive(p)]
    return {
        "built": t_built, "first": t_first, "shutdown": t_shutdown, "again": t_again,
        "children_before": before, "children_left": left, "workers_alive": workers_alive,
        "shared_spawner": shared is not None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transport", default="auto", choices=["auto", "shm", "broadcast"])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        emit(run(json.loads(args.case)))
        return
    results = [
        run_case(__file__, {"workers": args.workers, "transport": args.transport}, timeout=120)
        for _ in range(args.repeats)
    ]
    med = {k: statistics.median(r[k] for r in results) for k in ("built", "first", "shutdown", "again")}
    left = sorted({p for r in results for p in r["children_left"] + r["workers_alive"]})
    print(f"{args.workers} local workers, CartPole-v1, argmax nn.Linear(4,2) policy, weight_transport={args.transport!r}; "
          f"median of {args.repeats} fresh processes")
    print(f"{'':<32} {'median s':>9}  {'runs':<24} goal")
    rows = [
        ("construction", "built", ""),
        ("construction to first batch", "first", "<= 3 s (TorchRL 26.6 s)"),
        ("shutdown", "shutdown", "<= 2 s (TorchRL 5-6 s)"),
        ("second shutdown (idempotent)", "again", ""),
    ]
    for label, key, goal in rows:
        runs = ", ".join(f"{r[key]:.2f}" for r in results)
        status = ""
        if key == "first":
            status = "  met" if med[key] <= 3 else "  MISSED"
        if key == "shutdown":
            status = "  met" if med[key] <= 2 else "  MISSED"
        print(f"{label:<32} {med[key]:>9.3f}  {runs:<24} {goal}{status}")
    print(f"processes before shutdown (workers + spawner): {[r['children_before'] for r in results]}")
    print(f"processes left after shutdown: {left if left else 'none'}  (goal: none)"
          + ("; the process-wide worker spawner stays for later collectors" if results[0]["shared_spawner"] else ""))


if __name__ == "__main__":
    main()
