"""Scaling of latency-bound workers: frames/s of N local workers against N x one process.

The env's step sleeps 5 ms (``_common.SleepEnv``), so one process delivers a bit under
200 frames/s whatever the number of cores, and N worker processes should deliver N times
that. Printed ratio = frames/s of ``RPCCollector`` with N local workers (sync and async)
divided by N x frames/s of the single-process ``Collector`` on the same env, measured in the
same run (the hand-written gymnasium loop is printed too, as a second denominator).

frames_per_batch: each worker collects ``--steps`` (default 100) steps per batch, i.e.
0.5 s of env time: sync batches are ``N x 100`` frames, async batches 100 frames. A sync
round ends with the slowest worker and the trainer's turn-around (receive N results, stack,
ask again) idles every worker once per round, so rounds must be long against that; 100 steps
is also a typical rollout length per env for PPO. Async workers are asked again as soon as
their batch arrives, so the batch size matters less there.

    python benchmarks/rpc_scaling.py [--workers 8 32] [--seconds 6] [--steps 100]

Goals: ratio >= 0.9 at N=8, >= 0.85 at N=32 (TorchRL's RPCCollector: about 0.72 at 8).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import _common
from _common import SleepEnv, emit, make_sleep_env, run_case, steady_rate
from rpc_collectors import Collector, RPCCollector

GOALS = {8: 0.9, 32: 0.85}


def hand_loop(seconds: float) -> float:
    """A hand-written gymnasium loop on the sleeping env with random actions."""
    env = SleepEnv()
    env.reset(seed=0)
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        frames += 1
        if term or trunc:
            env.reset()
    return frames / (time.perf_counter() - start)


def single_collector(seconds: float, steps: int) -> float:
    collector = Collector(make_sleep_env, None, frames_per_batch=steps)
    try:
        return steady_rate(collector, seconds)
    finally:
        collector.shutdown()


def multi(num_workers: int, sync: bool, seconds: float, steps: int) -> tuple[float, float, float, float]:
    """frames/s, seconds to the first batch, workers' memory (MiB) and CPU (cores) of ``num_workers`` workers."""
    start = time.perf_counter()
    collector = RPCCollector(
        make_sleep_env, None, num_collectors=num_workers, sync=sync, launcher="local",
        frames_per_batch=steps * num_workers if sync else steps,
    )
    try:
        it = iter(collector)
        next(it)
        first = time.perf_counter() - start
        # reach the steady state first: async workers all start together, so right after the
        # first batch the other N-1 are nearly done, which would inflate a short measurement
        for _ in range(1 if sync else 2 * num_workers):
            next(it)
        children = _common.children_of()
        mem = _common.rss_mib(children)
        frames, t0, c0 = 0, time.perf_counter(), _common.cpu_seconds(children)
        while time.perf_counter() - t0 < seconds:
            frames += next(it).numel()
        wall = time.perf_counter() - t0
        return frames / wall, first, mem, (_common.cpu_seconds(children) - c0) / wall
    finally:
        collector.shutdown()


def run(case: dict) -> dict:
    """One case, in this (fresh) process."""
    _common.quiet()
    torch.set_num_threads(1)
    if case["kind"] == "hand":
        return {"rate": hand_loop(case["seconds"])}
    if case["kind"] == "single":
        return {"rate": single_collector(case["seconds"], case["steps"])}
    rate, first, mem, cores = multi(case["workers"], case["sync"], case["seconds"], case["steps"])
    return {"rate": rate, "first": first, "mem": mem, "cores": cores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--seconds", type=float, default=6.0, help="steady-state measuring time per case")
    parser.add_argument("--steps", type=int, default=100, help="env steps per worker per batch")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        emit(run(json.loads(args.case)))
        return

    def case(**kw: object) -> dict:
        return run_case(__file__, {"seconds": args.seconds, "steps": args.steps, **kw})

    hand = case(kind="hand", seconds=args.seconds / 2)["rate"]
    singles = [case(kind="single", seconds=args.seconds / 2)["rate"]]
    rows = []
    for n in args.workers:
        for sync in (True, False):
            r = case(kind="multi", workers=n, sync=sync)
            rows.append((n, "sync" if sync else "async", r["rate"], r["first"], r["mem"], r["cores"]))
    # the single-process rate again, after the multi-process runs: the denominator is their mean
    singles.append(case(kind="single", seconds=args.seconds / 2)["rate"])
    single = sum(singles) / len(singles)

    print(f"env step sleeps 5 ms; {args.steps} steps per worker per batch; {args.seconds:.0f} s per case")
    print(f"one process: hand-written loop {hand:,.1f} frames/s, Collector {single:,.1f} frames/s "
          f"({', '.join(f'{s:,.1f}' for s in singles)})")
    print(f"{'N':>3} {'mode':<6} {'frames/s':>10} {'N x single':>11} {'ratio':>6} {'vs hand':>8} {'goal':>7} "
          f"{'1st batch s':>12} {'workers MiB':>12} {'workers CPU':>12}")
    for n, mode, rate, first, mem, cores in rows:
        ratio = rate / (n * single)
        goal = GOALS.get(n)
        mark = "" if goal is None else ("  met" if ratio >= goal else "  MISSED")
        print(
            f"{n:>3} {mode:<6} {rate:>10,.0f} {n * single:>11,.0f} {ratio:>6.3f} {rate / (n * hand):>8.3f} "
            f"{'>= ' + str(goal) if goal else '':>7} {first:>12.2f} {mem:>12,.0f} {cores:>12.2f}{mark}"
        )
    print("workers MiB: proportional set size (shared pages split) of every child process; "
          "workers CPU: cores they used while measured")
    print("ratio = frames/s / (N x single-process Collector); 'vs hand' divides by N x the hand-written loop")
    print("TorchRL's RPCCollector: about 0.72 at N=8")


if __name__ == "__main__":
    main()
