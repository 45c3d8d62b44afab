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
    collector = Collector(env, policy, frames_per_batch=frames_per_batch, total_frames=frames,
                          metrics=None if metrics else False)
    start = time.perf_counter()
    for _ in collector:
        pass
    rate = frames / (time.perf_counter() - start)
    collector.shutdown()
    return rate


def metrics_on_off(args: argparse.Namespace) -> None:
    """Frames/s of ``Collector`` with ``collector.metrics()`` on and off (``metrics=False``), interleaved."""
    policy = ArgmaxLinear()
    print(f"{'case':<16} {'metrics on f/s':>15} {'off f/s':>10} {'on/off':>7}")
    for name, env, frames_per_batch in [("single env", "CartPole-v1", 1000),
                                        ("vector env B=8", functools.partial(GymEnv, "CartPole-v1", num_envs=8), 1000),
                                        ("single, T=50", "CartPole-v1", 50)]:
        on, off = [], []
        for repeat in range(args.repeats):  # alternated: neither always goes first
            for metrics in (True, False) if repeat % 2 == 0 else (False, True):
                (on if metrics else off).append(collector_loop(policy, args.frames, env, frames_per_batch, metrics))
        o, f = statistics.median(on), statistics.median(off)
        print(f"{name:<16} {o:>15,.0f} {f:>10,.0f} {o / f:>7.4f}")


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
