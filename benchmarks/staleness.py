"""Bounded policy lag, admitted or dropped, against unbounded async collection: what each costs and
what each does to the data.

8 async workers (``MultiAsyncCollector``, ``track_policy_version=True``), 6 fast and 2 slow (each
step sleeps ``--fast-ms`` / ``--slow-ms``), on an env whose episode lengths are long-tailed
(``1 + floor(20 * Pareto(1.2))`` steps, at most 400) and whose long episodes step slower (up to 3x;
each env logs every episode it finished, and counts its steps). The trainer takes each batch (20 steps of one
worker) and pushes new weights after it, as a training loop does. Cases, each in a fresh process
for ``--seconds`` after a warm-up, side by side in one run:

- ``unbounded``: ``max_policy_lag=None``;
- ``admit K``: ``max_policy_lag=K`` (``policy_lag_mode="admit"``, the default);
- ``drop K``: ``max_policy_lag=K, policy_lag_mode="drop"``.

Per case: frames/s handed out (and its ratio to unbounded), frames dropped, the lag histogram of
the batches handed out and its max; the bias: the lengths of the complete episodes handed out
(every step from the first to the done, under one trajectory id) against the lengths of every
episode the envs finished (two-sample KS test, p-value), and each worker's share of the frames
handed out against its share of the steps its env took meanwhile (chi-square test on batch counts,
p-value).

With ``--nodes W`` the 8 are ``8 / W`` async node collectors of ``W`` local workers each
(``collector_class="async"``), and the shares are the nodes'. With ``--batched`` they are the 8
envs of one ``AsyncBatchedCollector`` (one env per worker process, the policy in the trainer's
process; a batch holds 20 transitions of any envs, told apart by ``env_index``; no drop mode),
and the shares are the envs' frames.

    python benchmarks/staleness.py [--k 8 16] [--seconds 20] [--fast-ms 10] [--slow-ms 30]
                                   [--nodes 2 | --batched]
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from _common import emit, run_case

WORKERS, SLOW, STEPS = 8, 2, 20
TRAJ_IDS, DONE, VERSION = ("collector", "traj_ids"), ("next", "done"), ("collector", "policy_version")


class TailEnv(gym.Env):
    """Sleeps ``step_s`` a step, times ``min(3, 0.5 + length / 100)`` for an episode of ``length``;
    observation ``[t]``, the step within the episode; episodes last
    ``1 + floor(20 * Pareto(1.2))`` steps (at most 400). Each env process claims a slot of
    ``folder`` (the file ``slot<k>`` names its worker, ``worker``: a node's local workers share
    it); every finished episode's length is appended to ``worker<k>.txt``, and its steps are
    counted in slot k of the int64 file ``steps.bin``."""

    metadata: dict = {"render_modes": []}

    def __init__(self, step_s: float, folder: str, worker: int) -> None:
        self.step_s = step_s
        self.slot = next(k for k in range(WORKERS) if _claimed(Path(folder) / f"slot{k}", worker))
        self.log = str(Path(folder) / f"worker{self.slot}.txt")
        self.counts = np.memmap(Path(folder) / "steps.bin", dtype=np.int64, mode="r+", shape=(WORKERS,))
        self.observation_space = gym.spaces.Box(0.0, 1e4, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.rng = np.random.default_rng(os.getpid())
        self._t, self._length = 0, 1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t, self._length = 0, int(min(400, 1 + np.floor(20 * self.rng.pareto(1.2))))
        return np.array([0.0], np.float32), {}

    def step(self, action):
        # a long episode steps slower (a larger scene): its worker falls behind while it runs
        time.sleep(self.step_s * min(3.0, 0.5 + self._length / 100))
        self._t += 1
        self.counts[self.slot] += 1
        done = self._t >= self._length
        if done:
            with open(self.log, "a") as f:
                f.write(f"{self._length}\n")
        return np.array([self._t], np.float32), 1.0, done, False, {}


def _claimed(path: Path, worker: int) -> bool:
    """Whether this process took the slot file ``path`` (for ``worker``)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(worker).encode())
    os.close(fd)
    return True


def make_env(step_s: float, folder: str, worker: int):
    from rpc_collectors import GymEnv

    return GymEnv(TailEnv(step_s, folder, worker))


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def runs_by_id(batches: list) -> dict[int, list[tuple[int, bool]]]:
    """The (step, done) of each id's frames, in order, from ``(ids, steps, dones)`` per batch."""
    runs: dict[int, list[tuple[int, bool]]] = collections.defaultdict(list)
    for ids, t, done in batches:
        for i, s, d in zip(ids, t, done):
            runs[i].append((s, d))
    return runs


def complete_episodes(batches: list) -> list[int]:
    """Lengths of the episodes handed out whole: steps 0 to the done, consecutive, under one id."""
    lengths = []
    for run in runs_by_id(batches).values():
        t = [s for s, _ in run]
        if t[0] == 0 and run[-1][1] and t == list(range(len(t))):
            lengths.append(len(t))
    return lengths


def case(spec: dict) -> dict:
    from rpc_collectors import MultiAsyncCollector

    torch.set_num_threads(1)
    folder, width = Path(spec["dir"]), spec["nodes"]
    logs = [str(folder / f"worker{i}.txt") for i in range(WORKERS)]
    counts = np.memmap(folder / "steps.bin", dtype=np.int64, mode="w+", shape=(WORKERS,))
    # workers (flat) or async nodes of `width` local workers: the first SLOW processes are slow
    fns = [functools.partial(make_env, (spec["slow_ms"] if i * width < SLOW else spec["fast_ms"]) / 1e3,
                             spec["dir"], i) for i in range(WORKERS // width)]
    lag = {} if spec["k"] is None else {"max_policy_lag": spec["k"], "policy_lag_mode": spec["mode"]}
    nodes = {} if width == 1 else {"collector_class": "async", "num_workers_per_collector": width}
    policy = Policy()
    if spec["batched"]:
        return batched_case(spec, fns, policy, lag, counts, logs)
    with MultiAsyncCollector(fns, policy, frames_per_batch=STEPS, track_policy_version=True, **lag, **nodes) as c:
        it = iter(c)
        warm = time.perf_counter()
        while time.perf_counter() - warm < 3:
            next(it)
            c.update_policy_weights_()
        dropped0, stepped0 = c.dropped_frames, counts.copy()
        kept, lags, per_worker, start = [], collections.Counter(), collections.Counter(), time.perf_counter()
        frames = 0
        while time.perf_counter() - start < spec["seconds"]:
            batch = next(it)
            frames += batch.numel()
            lags[int(c.pushed_version - batch.get(VERSION).min())] += 1
            worker = int(batch.get(("collector", "worker_id")).reshape(-1)[0]) if ("collector", "worker_id") in \
                batch.keys(True) else None
            per_worker[worker] += 1
            kept.append((batch.get(TRAJ_IDS).reshape(-1).tolist(), batch.get("observation").reshape(-1).long().tolist(),
                         batch.get(DONE).reshape(-1).tolist()))
            with torch.no_grad():
                policy.linear.bias.add_(0.001)
            c.update_policy_weights_()
        wall = time.perf_counter() - start
        dropped, by_slot = c.dropped_frames - dropped0, (counts - stepped0).tolist()
    stepped, env_episodes = tallies(folder, len(fns), by_slot, logs)
    return {"frames_per_s": frames / wall, "dropped_frames": dropped, "lags": dict(lags),
            "episodes": complete_episodes(kept), "env_episodes": env_episodes,
            "stepped": stepped, "per_worker": {str(k): v for k, v in per_worker.items()}}


def tallies(folder: Path, workers: int, by_slot: list[int], logs: list[str]) -> tuple[list[int], list[int]]:
    """Each worker's (node's, env's) steps, its processes' slots summed, and the length of every
    episode the envs finished."""
    stepped = [0] * workers
    for k in range(WORKERS):
        stepped[int((folder / f"slot{k}").read_text())] += by_slot[k]
    env_lengths = [[int(x) for x in Path(log).read_text().split()] for log in logs if Path(log).exists()]
    return stepped, [x for ls in env_lengths for x in ls]


def batched_case(spec: dict, fns: list, policy: nn.Module, lag: dict, counts: np.ndarray,
                 logs: list[str]) -> dict:
    """``case`` for one ``AsyncBatchedCollector`` of the 8 envs (``--batched``)."""
    from rpc_collectors import AsyncBatchedCollector

    with AsyncBatchedCollector(fns, policy=policy, frames_per_batch=STEPS, total_frames=-1, **lag) as c:
        it = iter(c)
        warm = time.perf_counter()
        while time.perf_counter() - warm < 3:
            next(it)
            c.update_policy_weights_()
        stepped0 = counts.copy()
        kept, lags, per_env, start = [], collections.Counter(), collections.Counter(), time.perf_counter()
        frames = 0
        while time.perf_counter() - start < spec["seconds"]:
            batch = next(it)
            frames += batch.numel()
            lags[c.last_batch.lag] += 1
            envs = batch.get("env_index").tolist()
            per_env.update(envs)
            # an env's stream has no cut: its index names its episodes' steps, in order
            kept.append((envs, batch.get("observation").reshape(-1).long().tolist(),
                         batch.get(DONE).reshape(-1).tolist()))
            with torch.no_grad():
                policy.linear.bias.add_(0.001)
            c.update_policy_weights_()
        wall = time.perf_counter() - start
        by_slot = (counts - stepped0).tolist()
    stepped, env_episodes = tallies(Path(spec["dir"]), len(fns), by_slot, logs)
    return {"frames_per_s": frames / wall, "dropped_frames": 0, "lags": dict(lags),
            "episodes": episodes_by_env(kept), "env_episodes": env_episodes,
            "stepped": stepped, "per_worker": {str(k): v for k, v in per_env.items()}}


def episodes_by_env(batches: list) -> list[int]:
    """Lengths of the episodes handed out whole, each env's transitions read in order: an episode
    starts at step 0 after the env's first done (the first one seen may have begun in warm-up)."""
    lengths = []
    for run in runs_by_id(batches).values():
        episode: list[int] | None = None  # None: before the env's first done
        for s, d in run:
            if episode is not None:
                episode.append(s)
            if d:
                if episode is not None and episode == list(range(len(episode))):
                    lengths.append(len(episode))
                episode = []
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--fast-ms", type=float, default=10.0)
    parser.add_argument("--slow-ms", type=float, default=30.0)
    parser.add_argument("--nodes", type=int, default=1, help="async nodes of this many local workers each")
    parser.add_argument("--batched", action="store_true", help="one AsyncBatchedCollector of the 8 envs")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        emit(case(json.loads(args.case)))
        return
    from scipy import stats

    modes = ("admit",) if args.batched else ("admit", "drop")
    specs = [(None, None)] + [(k, mode) for k in args.k for mode in modes]
    rows = []
    for k, mode in specs:
        with tempfile.TemporaryDirectory() as folder:
            spec = {"k": k, "mode": mode, "seconds": args.seconds, "fast_ms": args.fast_ms, "slow_ms": args.slow_ms,
                    "dir": folder, "nodes": args.nodes, "batched": args.batched}
            rows.append((k, mode, run_case(__file__, spec, timeout=120 + 3 * args.seconds)))
    base = rows[0][2]["frames_per_s"]
    layout = "" if args.nodes == 1 else f" as {WORKERS // args.nodes} async nodes of {args.nodes} local workers"
    layout = " as the envs of one AsyncBatchedCollector" if args.batched else layout
    slow = -(-SLOW // args.nodes)  # the slow workers (nodes): their processes are slow
    print(f"\n{WORKERS} async workers{layout} ({slow * args.nodes} at {args.slow_ms:g} ms a step, "
          f"{WORKERS - slow * args.nodes} at {args.fast_ms:g} ms), "
          f"{STEPS}-step batches, a push after every batch, {args.seconds:g} s per case")
    print(f"{'case':>12}{'frames/s':>10}{'x unbounded':>13}{'dropped':>9}{'max lag':>9}{'episodes':>10}"
          f"{'KS p':>9}{'shares p':>10}  slow workers' share (stepped)")
    for k, mode, r in rows:
        name = "unbounded" if k is None else f"{mode} {k}"
        ks = stats.ks_2samp(r["episodes"], r["env_episodes"]).pvalue if r["episodes"] else float("nan")
        stepped = np.array(r["stepped"], dtype=float)
        handed = np.array([r["per_worker"].get(str(i), 0) for i in range(len(stepped))], dtype=float)
        expected = stepped / stepped.sum() * handed.sum()
        shares = stats.chisquare(handed, expected).pvalue
        slow_share, slow_stepped = handed[:slow].sum() / handed.sum(), stepped[:slow].sum() / stepped.sum()
        print(f"{name:>12}{r['frames_per_s']:>10,.0f}{r['frames_per_s'] / base:>13.3f}{r['dropped_frames']:>9,}"
              f"{max(map(int, r['lags'])):>9}{len(r['episodes']):>10}{ks:>9.3f}{shares:>10.3f}"
              f"  {slow_share:.3f} ({slow_stepped:.3f})")
        print(f"{'':>12}lag histogram: {dict(sorted((int(a), b) for a, b in r['lags'].items()))}")


if __name__ == "__main__":
    main()
