"""Collector overhead: frames/s of ``Collector`` against a hand-written gymnasium loop.

Both loops step CartPole-v1 with the same ``nn.Linear(4, 2)`` argmax policy under
``torch.no_grad()``, side by side in one run; the printed ratio is what matters (goal >= 0.5).
Also compares a vector env of 8 against a hand-written vector loop.

    python benchmarks/collector_overhead.py [--frames 50000] [--repeats 3] [--metrics]

``--metrics`` measures instead ``Collector`` with ``collector.metrics()`` on (the default) against
``metrics=False`` and prints the ratio (goal: on/off >= 0.99). Two collectors in this process,
same policy, same env seed, step the same frames in turns, block by block (1,000 frames, ``--frames``
each); before each pair of blocks one of them, drawn, has its metrics on and the other off. A
pair's ratio compares the same frames (CartPole's resets make blocks differ by several %), and the
two collectors' medians, each on in half of the pairs, are combined so that what differs between
the two objects (their memory layouts: 1-4 %) cancels.
"""
from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import time

import gymnasium as gym
import torch
from torch import nn

from _common import ArgmaxLinear
from rpc_collectors import Collector, GymEnv
from rpc_collectors.single_process.phase_clock import PhaseClock

BLOCK = 1000  # frames of one turn of --metrics: one batch of 1,000 frames, or 20 of 50


def hand_loop(policy: nn.Module, frames: int) -> float:
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(frames):
            action = policy(torch.from_numpy(obs)).item()
            obs, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
    return frames / (time.perf_counter() - start)


def hand_vector_loop(policy: nn.Module, frames: int, num_envs: int) -> float:
    envs = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    obs, _ = envs.reset(seed=0)
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(frames // num_envs):
            action = policy(torch.from_numpy(obs)).numpy()
            obs, reward, terminated, truncated, _ = envs.step(action)
    return frames / (time.perf_counter() - start)


def collector_rates(policy: nn.Module, frames: int, env: object, frames_per_batch: int) -> float:
    """Frames per second of wall time."""
    collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=frames)
    start = time.perf_counter()
    for _ in collector:
        pass
    rate = frames / (time.perf_counter() - start)
    collector.shutdown()
    return rate


def switch_metrics(collector: Collector, clock: PhaseClock, on: bool) -> None:
    """Turn ``collector``'s metrics on (``clock``: its rollout's phase clock), or off as ``metrics=False``
    builds it: a meter that counts nothing and a rollout clock that reads no time."""
    collector._meter.on = on
    collector.rollout.clock = collector._meter.watch(clock)


def metrics_on_off(args: argparse.Namespace) -> None:
    """``Collector`` with ``collector.metrics()`` on against off: each side's frames/s (the mean of its
    blocks'), and on/off of wall and of thread CPU time (the second leaves out the time this process
    waited for a core): the geometric mean of the two collectors' medians of the pairs' ratios (a
    median, as the garbage collector's rare long pauses would otherwise decide a sum)."""
    policy = ArgmaxLinear()
    print(f"{'case':<16} {'on f/s':>9} {'off f/s':>9} {'on/off wall':>12} {'on/off CPU':>11}  "
          f"({args.frames:,} frames each, pairs of blocks of {BLOCK:,} frames)")
    for name, env, frames_per_batch in [("single env", "CartPole-v1", 1000),
                                        ("vector env B=8", functools.partial(GymEnv, "CartPole-v1", num_envs=8), 1000),
                                        ("single, T=50", "CartPole-v1", 50)]:
        twins = []
        for _ in range(2):
            collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=-1)
            collector.set_seed(0)
            twins.append((collector, iter(collector), collector.rollout.clock))
        rates = {True: [], False: []}
        wall: list[list[float]] = [[], []]  # by the twin that had its metrics on: the pairs' on/off
        cpu: list[list[float]] = [[], []]
        draw = random.Random(0)  # drawn, not alternating: a periodic cost would fall on one side
        for pair in range(-1, args.frames // BLOCK):  # pair -1: warm-up, not counted
            on_twin = draw.randrange(2)
            took = {}
            for twin in draw.sample((0, 1), 2):
                collector, batches, clock = twins[twin]
                switch_metrics(collector, clock, twin == on_twin)
                start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
                for _ in range(BLOCK // frames_per_batch):
                    next(batches)
                took[twin == on_twin] = time.perf_counter_ns() - start, time.thread_time_ns() - start_cpu
            if pair >= 0:
                wall[on_twin].append(took[False][0] / took[True][0])
                cpu[on_twin].append(took[False][1] / took[True][1])
                for on, (ns, _) in took.items():
                    rates[on].append(BLOCK / ns * 1e9)
        for collector, _, _ in twins:
            collector.shutdown()
        on_off = [math.sqrt(statistics.median(ratios[0]) * statistics.median(ratios[1])) for ratios in (wall, cpu)]
        print(f"{name:<16} {statistics.fmean(rates[True]):>9,.0f} {statistics.fmean(rates[False]):>9,.0f} "
              f"{on_off[0]:>12.4f} {on_off[1]:>11.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--metrics", action="store_true",
                        help="instead: Collector with metrics on (the default) against metrics=False, interleaved")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.metrics:
        metrics_on_off(args)
        return
    policy = ArgmaxLinear()
    rows = []
    for name, hand, ours in [
        ("single env", lambda: hand_loop(policy, args.frames),
         lambda: collector_rates(policy, args.frames, "CartPole-v1", 1000)),
        ("vector env B=8", lambda: hand_vector_loop(policy, args.frames, 8),
         lambda: collector_rates(policy, args.frames, GymEnv("CartPole-v1", num_envs=8), 1000)),
    ]:
        hand_rates, our_rates = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            hand_rates.append(hand())
            our_rates.append(ours())
        h, o = statistics.median(hand_rates), statistics.median(our_rates)
        rows.append((name, h, o, o / h))
    print(f"{'case':<16} {'hand-written f/s':>17} {'Collector f/s':>14} {'ratio':>6}")
    for name, h, o, r in rows:
        print(f"{name:<16} {h:>17,.0f} {o:>14,.0f} {r:>6.2f}")
    print("goal: ratio >= 0.5 (TorchRL's Collector: 0.054 on the single env)")


if __name__ == "__main__":
    main()
