"""CartPole-v1 with 2 local workers (sync and async) against the single-process Collector.

All cases step CartPole-v1 with the same argmax ``nn.Linear(4, 2)`` policy; each case runs
in a fresh process for ``--seconds`` after a warm-up, and the single-process ``Collector`` is
measured before and after the multi-process cases (the denominator is their mean). A
hand-written gymnasium loop is printed as the ceiling of one process.

frames_per_batch: 1000 frames per worker per batch (sync: 2000 per batch, async: 1000),
the same 1000 for the single-process Collector. CartPole steps take about 20 us, so a
batch is tens of milliseconds of work against a fraction of a millisecond of RPC.

This machine has 2 cores: 2 workers plus the trainer share them, so the ideal is about
2x the single process only if the trainer is idle while it waits (it is: see trainer_cpu.py).

    python benchmarks/cartpole_throughput.py [--seconds 5] [--frames-per-worker 1000]

No fixed goal; TorchRL 0.14.1 on this kind of machine: Collector 2,900 frames/s,
MultiSyncCollector (2 workers) 5,000, RPCCollector (2 workers) 3,500 sync / 3,500 async.
"""
from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import torch

import _common
from _common import ArgmaxLinear, emit, run_case, steady_rate
from rpc_collectors import Collector, MultiCollector


def hand_loop(seconds: float) -> float:
    policy = ArgmaxLinear()
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    frames, start = 0, time.perf_counter()
    with torch.no_grad():
        while time.perf_counter() - start < seconds:
            for _ in range(1000):
                obs, _, term, trunc, _ = env.step(policy(torch.from_numpy(obs)).item())
                if term or trunc:
                    obs, _ = env.reset()
            frames += 1000
    return frames / (time.perf_counter() - start)


def run(case: dict) -> dict:
    _common.quiet()
    torch.set_num_threads(1)
    seconds, per_worker = case["seconds"], case["frames_per_worker"]
    if case["kind"] == "hand":
        return {"rate": hand_loop(seconds)}
    if case["kind"] == "single":
        collector = Collector("CartPole-v1", ArgmaxLinear(), frames_per_batch=per_worker)
        warmup = 2
    else:
        sync = case["kind"] == "sync"
        collector = MultiCollector(
            ["CartPole-v1"] * 2, ArgmaxLinear(), sync=sync,
            frames_per_batch=2 * per_worker if sync else per_worker,
        )
        warmup = 2 if sync else 4
    try:
        return {"rate": steady_rate(collector, seconds, warmup)}
    finally:
        collector.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--frames-per-worker", type=int, default=1000)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        emit(run(json.loads(args.case)))
        return

    def case(kind: str) -> float:
        return run_case(__file__, {"kind": kind, "seconds": args.seconds, "frames_per_worker": args.frames_per_worker})["rate"]

    hand = case("hand")
    singles = [case("single")]
    sync, async_ = case("sync"), case("async")
    singles.append(case("single"))
    single = sum(singles) / 2
    print(f"CartPole-v1, argmax nn.Linear(4,2), {args.frames_per_worker} frames per worker per batch, "
          f"{args.seconds:.0f} s per case, 2 cores")
    print(f"{'case':<34} {'frames/s':>10} {'x Collector':>12}")
    print(f"{'hand-written gymnasium loop':<34} {hand:>10,.0f} {hand / single:>12.2f}")
    print(f"{'Collector (1 process)':<34} {single:>10,.0f} {1:>12.2f}   runs: {singles[0]:,.0f}, {singles[1]:,.0f}")
    print(f"{'MultiCollector 2 workers, sync':<34} {sync:>10,.0f} {sync / single:>12.2f}")
    print(f"{'MultiCollector 2 workers, async':<34} {async_:>10,.0f} {async_ / single:>12.2f}")
    print("TorchRL 0.14.1 here: Collector 2,900; MultiSyncCollector x2 5,000; RPCCollector x2 3,500 sync / 3,500 async")


if __name__ == "__main__":
    main()
