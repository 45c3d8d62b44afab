"""Collector overhead: frames/s of ``Collector`` against a hand-written gymnasium loop.

Both loops step CartPole-v1 with the same ``nn.Linear(4, 2)`` argmax policy under
``torch.no_grad()``, side by side in one run; the printed ratio is what matters (goal >= 0.5).
Also compares a vector env of 8 against a hand-written vector loop.

    python benchmarks/collector_overhead.py [--frames 50000] [--repeats 3] [--metrics]

``--metrics`` measures instead ``Collector`` with ``collector.metrics()`` on (the default) against
``metrics=False``, interleaved, and prints the ratio (goal: on/off >= 0.99).
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import gymnasium as gym
import torch
from torch import nn

from _common import ArgmaxLinear
from rpc_collectors import Collector, GymEnv


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


def collector_loop(policy: nn.Module, frames: int, env: object, frames_per_batch: int, metrics: bool = True) -> float:
    return collector_rates(policy, frames, env, frames_per_batch, metrics)[0]


def collector_rates(policy: nn.Module, frames: int, env: object, frames_per_batch: int,
                    metrics: bool = True) -> tuple[float, float]:
    """Frames per second of wall time, and per second of this process's CPU time."""
    collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=frames,
                          metrics=None if metrics else False)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in collector:
        pass
    rates = frames / (time.perf_counter() - start), frames / (time.process_time() - cpu)
    collector.shutdown()
    return rates


def metrics_on_off(args: argparse.Namespace) -> None:
    """``Collector`` with ``collector.metrics()`` on against ``metrics=False``: pairs run back to back (each
    pair's order alternated), the median of the pairs' ratios, of wall-time and of CPU-time rates (the
    second is steadier on a loaded machine)."""
    policy = ArgmaxLinear()
    print(f"{'case':<16} {'on f/s':>9} {'off f/s':>9} {'on/off wall':>12} {'on/off CPU':>11}  ({args.repeats} pairs)")
    for name, env, frames_per_batch in [("single env", "CartPole-v1", 1000),
                                        ("vector env B=8", functools.partial(GymEnv, "CartPole-v1", num_envs=8), 1000),
                                        ("single, T=50", "CartPole-v1", 50)]:
        on, off, wall, cpu = [], [], [], []
        for repeat in range(args.repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            rates = {metrics: collector_rates(policy, args.frames, env, frames_per_batch, metrics) for metrics in order}
            on.append(rates[True][0])
            off.append(rates[False][0])
            wall.append(rates[True][0] / rates[False][0])
            cpu.append(rates[True][1] / rates[False][1])
        print(f"{name:<16} {statistics.median(on):>9,.0f} {statistics.median(off):>9,.0f} "
              f"{statistics.median(wall):>12.4f} {statistics.median(cpu):>11.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--metrics", action="store_true",
                        help="instead: Collector with metrics on (the default) against metrics=False, interleaved")
    args = parser.parse_args()
    if args.metrics:
        metrics_on_off(args)
        return
    torch.set_num_threads(1)
    policy = ArgmaxLinear()
    rows = []
    for name, hand, ours in [
        ("single env", lambda: hand_loop(policy, args.frames),
         lambda: collector_loop(policy, args.frames, "CartPole-v1", 1000)),
        ("vector env B=8", lambda: hand_vector_loop(policy, args.frames, 8),
         lambda: collector_loop(policy, args.frames, GymEnv("CartPole-v1", num_envs=8), 1000)),
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
