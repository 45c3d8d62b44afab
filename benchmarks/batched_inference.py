"""Batched inference off the env workers: our AsyncBatchedCollector against TorchRL's, and
against our MultiCollector with a policy copy in every worker.

1. Pixels: 8 no-work envs with 4x84x84 uint8 observations (``_common.NoWorkEnv``, TorchRL's
   mock-pixel setting), a Nature-CNN policy on the CPU. TorchRL 0.14.1's ``AsyncBatchedCollector``
   (env workers as processes, its default thread server; and ``transport="auto"``, its
   dedicated inference process), ours, and our async ``MultiCollector`` of 8 workers each running
   its own copy of the CNN.
2. CartPole-v1 with a 2-layer MLP of growing width, ours against the ``MultiCollector`` with
   per-worker policies: where batching one forward pass starts to pay (the crossover).
3. Node collectors (with ``--nodes``): the pixel setting's 8 envs as 2 nodes of 4 local workers
   (local launcher, ``collector_class`` ``"sync"`` and ``"async"``), a Nature-CNN in every local
   worker against one per node (``inference="node"``).
4. ``max_policy_lag`` (with ``--lag``): an async ``MultiCollector`` on CartPole whose trainer
   updates the weights after every batch: frames dropped and mean lag against K.
5. The inference thread (with ``--inference``, alone): the pixel envs and Nature-CNN with
   ``--processes`` env processes, ``AsyncBatchedCollector``'s default torch threads for its
   inference thread (:func:`rpc_collectors.trainer.threads.inference_threads`)
   against the old behaviour (the process's count) and against 1, and ``envs_per_worker=2``
   (two halves per process, twice the envs) against 1: ``--rounds`` interleaved rounds, medians.
6. Metrics (with ``--metrics``, alone): ``AsyncBatchedCollector`` with ``collector.metrics()`` on
   (the default: each env worker's phase clock, the inference loop's counters) against
   ``metrics=False``, on no-work envs of 4 floats and a width-64 MLP (where a step costs least, so
   a clock read weighs most), ``--processes`` env processes of 2 envs each: ``--rounds``
   back-to-back pairs, their order alternating, the median of the pairs' ratios.

Every case runs in a fresh process for ``--seconds`` after a warm-up; ratios are of cases run
side by side in this one run. Needs torchrl for TorchRL's cases (run it with the TorchRL venv's
python); without torchrl they are left out.

    /work/venv-torchrl/bin/python benchmarks/batched_inference.py [--seconds 8] [--nodes] [--lag]
    python benchmarks/batched_inference.py --inference [--processes 2] [--rounds 3] [--seconds 8]
    python benchmarks/batched_inference.py --metrics [--processes 2] [--rounds 3] [--seconds 8]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import time

import torch
from torch import nn

import _common
from _common import NoWorkEnv, emit, run_case, steady_rate

PIXELS = (4, 84, 84)
NUM_ENVS = 8


class NatureCNN(nn.Module):
    """DQN's Nature CNN: uint8 frames in, the greedy action out (one-hot with ``one_hot``)."""

    def __init__(self, actions: int = 2, one_hot: bool = False) -> None:
        super().__init__()
        self.one_hot, self.actions = one_hot, actions
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
            nn.Linear(512, actions),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:-3]
        action = self.net(obs.reshape(-1, *obs.shape[-3:]).float() / 255.0).argmax(-1)
        if self.one_hot:
            action = nn.functional.one_hot(action, self.actions)
        return action.reshape(tuple(lead) + tuple(action.shape[1:]))


class MLP(nn.Module):
    """A 2-layer MLP for CartPole: the greedy action out."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


def pixel_env() -> NoWorkEnv:
    return NoWorkEnv(PIXELS, "uint8")


def torchrl_pixel_env():
    from torchrl.envs import GymWrapper

    return GymWrapper(pixel_env())


def torchrl_policy(device: str = "cpu"):
    from tensordict.nn import TensorDictModule

    return TensorDictModule(NatureCNN(one_hot=True), in_keys=["observation"], out_keys=["action"])


def _policy(case: dict) -> nn.Module:
    return NatureCNN() if case["env"] == "pixels" else MLP(case["width"])


def run(case: dict) -> dict:
    _common.quiet()
    from rpc_collectors import AsyncBatchedCollector, MultiCollector, RPCCollector

    kind, seconds = case["kind"], case["seconds"]
    env = {"pixels": functools.partial(_common.make_no_work_env, PIXELS, "uint8"),
           "floats": _common.make_no_work_env}.get(case["env"], "CartPole-v1")
    fpb = case["frames_per_batch"]
    if kind == "ours":
        collector = AsyncBatchedCollector([env] * case.get("envs", NUM_ENVS), policy=_policy(case), frames_per_batch=fpb,
                                          envs_per_worker=case.get("envs_per_worker", 1),
                                          num_threads=case.get("num_threads"),
                                          metrics=None if case.get("metrics", True) else False)
    elif kind == "node":  # 2 nodes of NUM_ENVS / 2 local workers
        per_node = NUM_ENVS // 2
        collector = RPCCollector(env, _policy(case), num_collectors=2, collector_class=case["node"],
                                 num_workers_per_collector=per_node, sync=case["node"] == "sync",
                                 frames_per_batch=fpb if case["node"] == "sync" else fpb // 2,
                                 inference=case["inference"])
    elif kind == "multi":
        collector = MultiCollector([env] * NUM_ENVS, _policy(case), sync=False, frames_per_batch=fpb // NUM_ENVS)
    else:
        from torchrl.collectors import AsyncBatchedCollector as TorchRLCollector

        extra = {"policy_factory": torchrl_policy, "transport": "auto"} if kind == "torchrl-auto" else \
            {"policy": torchrl_policy(), "transport": "driver"}
        collector = TorchRLCollector([torchrl_pixel_env] * NUM_ENVS, frames_per_batch=fpb,
                                     env_backend="multiprocessing", **extra)
    try:
        return {"rate": steady_rate(collector, seconds, 3)}
    finally:
        collector.shutdown()


def lag_case(case: dict) -> dict:
    """Async MultiCollector on CartPole; the trainer bumps the weights after every batch."""
    _common.quiet()
    from rpc_collectors import MultiCollector

    collector = MultiCollector(["CartPole-v1"] * 4, _common.ArgmaxLinear(), sync=False, frames_per_batch=200,
                               max_policy_lag=case["k"])
    frames, lags, start = 0, [], time.perf_counter()
    try:
        for batch in collector:
            frames += batch.numel()
            lags.append(collector.last_batch.lag)
            collector.update_policy_weights_()
            if time.perf_counter() - start > case["seconds"]:
                break
        return {"frames": frames, "dropped": collector.dropped_frames, "mean_lag": sum(lags) / len(lags),
                "max_lag": max(lags), "rate": frames / (time.perf_counter() - start)}
    finally:
        collector.shutdown()


def inference_thread(args: argparse.Namespace) -> None:
    """Section 5: the inference thread's torch threads and envs_per_worker, interleaved rounds."""
    from rpc_collectors.trainer.threads import inference_threads

    procs, cores = args.processes, len(os.sched_getaffinity(0))
    rule, old = inference_threads(None, procs, procs), torch.get_num_threads()
    cases = {
        f"rule ({rule} thread(s)), 1 env per process": {"num_threads": None},
        f"old ({old} threads: the process's), 1 env per process": {"num_threads": old},
        "1 thread, 1 env per process": {"num_threads": 1},
        f"rule, envs_per_worker=2 (halves), {2 * procs} envs": {"envs_per_worker": 2},
        f"old ({old} threads), envs_per_worker=2 (halves)": {"envs_per_worker": 2, "num_threads": old},
    }
    print(f"inference thread: {procs} env processes, 4x84x84 uint8 no-work envs, Nature-CNN on the CPU, {cores} "
          f"cores (sched_getaffinity), {args.rounds} interleaved rounds of {args.seconds:.0f} s, medians")
    rates: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(args.rounds):
        for label, extra in cases.items():
            epw = extra.get("envs_per_worker", 1)
            case = {"kind": "ours", "env": "pixels", "seconds": args.seconds, "frames_per_batch": 256,
                    "envs": procs * epw, **extra}
            rates[label].append(run_case(__file__, case, timeout=120 + 4 * args.seconds)["rate"])
    base = statistics.median(rates[next(iter(cases))])
    print(f"{'case':<52} {'frames/s':>9} {'/ rule':>7}   rounds")
    for label, values in rates.items():
        median = statistics.median(values)
        print(f"{label:<52} {median:>9,.0f} {median / base:>7.2f}   {' '.join(f'{v:,.0f}' for v in values)}")


def metrics_on_off(args: argparse.Namespace) -> None:
    """Section 6: metrics on against ``metrics=False``, back-to-back pairs in fresh processes."""
    print(f"metrics on / off: {args.processes} env processes x 2 no-work envs of 4 floats, MLP width 64, "
          f"{args.rounds} pairs of {args.seconds:.0f} s, order alternating")
    ratios, rates = [], {True: [], False: []}
    for pair in range(args.rounds):
        got = {}
        for on in ((True, False) if pair % 2 == 0 else (False, True)):
            case = {"kind": "ours", "env": "floats", "width": 64, "seconds": args.seconds, "frames_per_batch": 256,
                    "envs": 2 * args.processes, "envs_per_worker": 2, "metrics": on}
            got[on] = run_case(__file__, case, timeout=120 + 4 * args.seconds)["rate"]
            rates[on].append(got[on])
        ratios.append(got[True] / got[False])
    for on, label in ((True, "metrics on"), (False, "metrics=False")):
        print(f"{label:<14} median {statistics.median(rates[on]):>9,.0f} f/s   {' '.join(f'{v:,.0f}' for v in rates[on])}")
    print(f"on / off: median of the pairs' ratios {statistics.median(ratios):.3f}   "
          f"{' '.join(f'{r:.3f}' for r in ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--widths", default="64,512,2048")
    parser.add_argument("--lag", action="store_true", help="also the max_policy_lag cases")
    parser.add_argument("--nodes", action="store_true", help="also node collectors: inference per node or per worker")
    parser.add_argument("--inference", action="store_true", help="only the inference thread's cases (section 5)")
    parser.add_argument("--processes", type=int, default=2, help="env processes of the --inference/--metrics cases")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the --inference/--metrics cases")
    parser.add_argument("--metrics", action="store_true", help="only metrics on against metrics=False (section 6)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        case = json.loads(args.case)
        emit(lag_case(case) if case["kind"] == "lag" else run(case))
        return
    if args.inference:
        inference_thread(args)
        return
    if args.metrics:
        metrics_on_off(args)
        return

    def rate(kind: str, env: str, **kw) -> float:
        case = {"kind": kind, "env": env, "seconds": args.seconds, **kw}
        return run_case(__file__, case, timeout=120 + 4 * args.seconds)["rate"]

    have_torchrl = importlib.util.find_spec("torchrl") is not None
    print(f"{NUM_ENVS} no-work envs, 4x84x84 uint8, Nature-CNN on the CPU, {args.seconds:.0f} s per case, "
          f"{torch.get_num_threads()} torch threads, 2 shared cores")
    ours = rate("ours", "pixels", frames_per_batch=256)
    multi = rate("multi", "pixels", frames_per_batch=256)
    print(f"{'case':<52} {'frames/s':>9} {'ours / it':>10}")
    print(f"{'ours: AsyncBatchedCollector':<52} {ours:>9,.0f} {1:>10.2f}")
    print(f"{'ours: MultiCollector async, a CNN per worker':<52} {multi:>9,.0f} {ours / multi:>10.2f}")
    if have_torchrl:
        for kind, label in (("torchrl", "TorchRL AsyncBatchedCollector (thread server)"),
                            ("torchrl-auto", "TorchRL AsyncBatchedCollector transport='auto'")):
            try:
                theirs = rate(kind, "pixels", frames_per_batch=256)
                print(f"{label:<52} {theirs:>9,.0f} {ours / theirs:>10.2f}")
            except RuntimeError as err:
                print(f"{label:<52} failed: {str(err).splitlines()[-1][:80]}")
    print(f"\nCartPole-v1, {NUM_ENVS} envs, 2-layer MLP (tanh) of width w")
    print(f"{'w':>6} {'ours f/s':>10} {'multi f/s':>10} {'ours / multi':>13}")
    for width in [int(w) for w in args.widths.split(",")]:
        a = rate("ours", "cartpole", width=width, frames_per_batch=1024)
        b = rate("multi", "cartpole", width=width, frames_per_batch=1024)
        print(f"{width:>6} {a:>10,.0f} {b:>10,.0f} {a / b:>13.2f}")
    if args.nodes:
        print(f"\nnode collectors, 2 nodes x {NUM_ENVS // 2} local workers, the pixel envs and Nature-CNN, local launcher")
        print(f"{'node class':<11} {'per node f/s':>13} {'per worker f/s':>15} {'node / worker':>14}")
        for node in ("sync", "async"):
            one = rate("node", "pixels", node=node, inference="node", frames_per_batch=256)
            each = rate("node", "pixels", node=node, inference="worker", frames_per_batch=256)
            print(f"{node:<11} {one:>13,.0f} {each:>15,.0f} {one / each:>14.2f}")
    if args.lag:
        print("\nmax_policy_lag, async MultiCollector, 4 CartPole workers, weights bumped after every batch")
        print(f"{'K':>5} {'frames':>8} {'dropped':>8} {'mean lag':>9} {'max lag':>8} {'frames/s':>9}")
        for k in (None, 0, 1, 2, 4):
            r = run_case(__file__, {"kind": "lag", "k": k, "seconds": args.seconds}, timeout=120 + 4 * args.seconds)
            print(f"{str(k):>5} {r['frames']:>8} {r['dropped']:>8} {r['mean_lag']:>9.2f} {r['max_lag']:>8} "
                  f"{r['rate']:>9,.0f}")


if __name__ == "__main__":
    main()
