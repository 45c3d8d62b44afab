"""``rpc-collectors demo``: PPO on CartPole-v1 with local collector workers, end to end.

Builds the policy and critic (:mod:`rpc_collectors.apps.ppo`), a collector of ``workers`` local
worker processes with ``envs_per_worker`` envs each, and trains until the mean return of the last 20
episodes reaches the target. Shows a progress bar, prints a summary table, and writes ``run.json``
(the record of the run) and ``learning_curve.png`` to the output folder, and with ``--trace`` a
timeline of the first batches
(:meth:`~rpc_collectors.trainer.collector_front.CollectorFront.trace`). Ctrl-C stops cleanly: the
collector is shut down and the record so far is saved.

With ``--checkpoint-dir`` the run is checkpointed
(:class:`~rpc_collectors.cluster.run_checkpoint.RunCheckpoint`) and resumed from there when started
again, also as a SLURM job submitted with ``--requeue``, which checkpoints and requeues at its time
limit; ``run.json`` then lists every allocation of the run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import tensordict
import torch
from tqdm import tqdm

from rpc_collectors.apps import ppo
from rpc_collectors.cluster import checkpoint as checkpoint_files
from rpc_collectors.cluster import requeue
from rpc_collectors.cluster.run_checkpoint import RunCheckpoint
from rpc_collectors.collectors.rpc import RPCCollector
from rpc_collectors.core import checks
from rpc_collectors.single_process.envs import GymEnv
from rpc_collectors.single_process.metric_exports import Export

TOTAL_FRAMES = 500_000
"""The default frame budget, rounded up to whole batches (a budget the user gives is taken as
given)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's command-line options."""
    parser.add_argument("--env", default="CartPole-v1",
                        help="gymnasium id (Box observations, Discrete actions)")
    parser.add_argument("--workers", type=int, default=2,
                        help="collector worker processes (default 2)")
    parser.add_argument("--envs-per-worker", type=int, default=4,
                        help="vector envs in each worker (default 4)")
    parser.add_argument("--steps", type=int, default=128,
                        help="steps per env in each batch (default 128)")
    parser.add_argument(
        "--total-frames", type=int, default=None,
        help=f"stop after this many frames (default {TOTAL_FRAMES}, rounded up to whole batches)"
    )
    parser.add_argument(
        "--target-return", type=float, default=475.0,
        help="stop when the mean return of the last 20 episodes reaches it (default 475)"
    )
    parser.add_argument("--seed", type=int, default=0)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sync", dest="sync", action="store_true", default=True,
                      help="one batch from all workers at a time (default)")
    mode.add_argument("--async", dest="sync", action="store_false",
                      help="first ready worker's batch first; policy lag may exceed 0")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where run.json and learning_curve.png go (default: the checkpoint "
                        "folder if there is one, else runs/<env>-<date>-<time>)")
    parser.add_argument("--checkpoint-dir", type=Path,
                        default=os.environ.get(checkpoint_files.ENV_DIR),
                        help="checkpoint the run there and resume from it when started again "
                        f"(default ${checkpoint_files.ENV_DIR}, set in SLURM jobs "
                        "submitted with --checkpoint-dir)")
    parser.add_argument("--checkpoint-every", type=int, default=10,
                        help="batches between checkpoints (default 10)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="write a timeline of the first --trace-rounds batches there (Chrome "
                        "trace format: open it in Perfetto or chrome://tracing)")
    parser.add_argument("--trace-rounds", type=int, default=3,
                        help="batches the timeline covers (default 3)")
    parser.add_argument("--metrics", action="append", default=[], metavar="TARGET",
                        help="write the collector's metrics to tensorboard:DIR, prometheus:PORT or "
                        "jsonl:PATH (repeatable; needs the metrics extra for the first two)")
    every = parser.add_mutually_exclusive_group()
    every.add_argument("--metrics-every", type=float, default=None, metavar="SECONDS",
                       help="seconds between metrics exports (default 10)")
    every.add_argument("--metrics-batches", type=int, default=None, metavar="N",
                       help="batches between metrics exports")


def metrics_of(args: argparse.Namespace) -> Export | None:
    """Where the demo's collector writes its metrics (``--metrics``), checked
    before any worker starts."""
    if not args.metrics:
        return None
    try:
        export = Export(*args.metrics, seconds=args.metrics_every, batches=args.metrics_batches)
        export.probe()
    except (ValueError, ImportError) as err:
        raise SystemExit(f"--metrics: {err}") from None
    return export


def make_collector(env_id: str, policy: Any, *, workers: int, envs_per_worker: int, steps: int,
                   total_frames: int, sync: bool, metrics: Export | None = None) -> RPCCollector:
    """The demo's collector: ``workers`` local processes, each stepping ``envs_per_worker`` envs.

    Sync batches are ``[workers, envs_per_worker, steps]``; async ones one worker's
    ``[envs_per_worker, workers * steps]``, so both modes train on batches of the same size.
    """
    frames_per_batch = workers * envs_per_worker * steps
    return RPCCollector(
        partial(GymEnv, env_id, num_envs=envs_per_worker), policy,
        frames_per_batch=frames_per_batch, total_frames=total_frames,
        num_collectors=workers, sync=sync, launcher="local", cat_results="stack", metrics=metrics,
    )


class RunRecord:
    """Everything worth keeping about a run; saved as JSON, also when the run is interrupted."""

    def __init__(self, args: argparse.Namespace, cfg: ppo.PPOConfig) -> None:
        self.data: dict[str, Any] = {
            "command": " ".join(sys.argv),
            "started": datetime.now().isoformat(timespec="seconds"),
            "settings": {k: str(v) if isinstance(v, Path) else v
                         for k, v in vars(args).items() if k != "func"},
            "ppo": dataclasses.asdict(cfg),
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "tensordict": tensordict.__version__},
            "status": "running",
            # one point per batch
            "curve": [],
            # [frames when it ended, return]
            "episodes": [],
        }
        self.worker_frames: dict[int, int] = {}
        # a resumed run's frames and training time before this allocation
        self.start_frames, self.earlier_s = 0, 0.0

    def carried(self) -> dict[str, Any]:
        """What a checkpoint keeps of the record, for the allocation that resumes from it."""
        return {
            "curve": self.data["curve"], "episodes": self.data["episodes"],
            "train_s": self.data["curve"][-1]["time_s"] if self.data["curve"] else self.earlier_s
        }

    def resume(self, carried: dict[str, Any], frames: int) -> None:
        self.data["curve"] = list(carried["curve"])
        self.data["episodes"] = list(carried["episodes"])
        self.start_frames, self.earlier_s = frames, float(carried["train_s"])

    def add(self, it: ppo.Iteration, elapsed: float) -> None:
        self.data["curve"].append({
            "frames": it.frames, "time_s": round(self.earlier_s + elapsed, 3),
            "mean_return": it.mean_return,
            "policy_lag": it.policy_lag, **{k: round(v, 5) for k, v in it.losses.items()},
        })
        self.data["episodes"].extend([it.frames, r] for r in it.episode_returns)
        for w, n in it.worker_frames.items():
            self.worker_frames[w] = self.worker_frames.get(w, 0) + n

    def finish(self, status: str, startup_s: float, train_s: float) -> dict[str, Any]:
        curve = self.data["curve"]
        frames = curve[-1]["frames"] if curve else self.start_frames
        self.data.update(
            status=status,
            frames=frames,
            startup_s=round(startup_s, 3),
            wall_time_s=round(train_s, 3),
            frames_per_s=round((frames - self.start_frames) / train_s, 1) if train_s > 0 else None,
            worker_frames_per_s={str(w): round(n / train_s, 1) for w,
                                 n in sorted(self.worker_frames.items())}
            if train_s > 0 else {},
            final_mean_return=curve[-1]["mean_return"] if curve else None,
        )
        return self.data

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "run.json"
        path.write_text(json.dumps(self.data, indent=1))
        return path


def plot_curve(record: dict[str, Any], path: Path) -> Path | None:
    """Episode returns and their 20-episode mean against frames; None (with a
    notice) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("learning curve skipped: matplotlib is not installed (pip "
              "install 'rpc_collectors[plot]')")
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if record["episodes"]:
        frames, returns = zip(*record["episodes"])
        ax.scatter(frames, returns, s=4, alpha=0.3, label="episode return")
    points = [(p["frames"], p["mean_return"]) for p in record["curve"]
              if p["mean_return"] is not None]
    if points:
        ax.plot(*zip(*points), color="C1", label="mean of last 20 episodes")
    target = record["settings"].get("target_return")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    s = record["settings"]
    ax.set(xlabel="frames", ylabel="return",
           title=f"PPO on {s['env']}: {s['workers']} workers, {'sync' if s['sync'] else 'async'}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary_table(record: dict[str, Any]) -> str:
    """The end-of-run table: frames, wall time, frames/s, per-worker frames/s, final return."""
    ret = record["final_mean_return"]
    rows = [
        ("status", record["status"]),
        ("frames", f"{record['frames']:,}"),
        ("wall "
         "time", f"{record['wall_time_s']:.1f} s (+ {record['startup_s']:.1f} s worker start-up)"),
        ("frames/s", f"{record['frames_per_s'] or 0:,.0f}"),
        *[(f"  worker {w} "
           "frames/s", f"{v:,.0f}") for w, v in record["worker_frames_per_s"].items()],
        ("final return (last 20)", "n/a" if ret is None else f"{ret:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _checkpoint_dir(args: argparse.Namespace) -> Path | None:
    """``--checkpoint-dir`` checked before any process starts: writable, and a
    checkpoint there readable."""
    if args.checkpoint_dir is None:
        return None
    if args.checkpoint_every < 1:
        raise SystemExit(f"--checkpoint-every={args.checkpoint_every} is invalid; it must be >= 1")
    try:
        folder = checkpoint_files.check_directory(args.checkpoint_dir, "--checkpoint-dir")
        if (folder / checkpoint_files.FILE_NAME).exists():
            checkpoint_files.read(folder / checkpoint_files.FILE_NAME)
    except (ValueError, checkpoint_files.CheckpointError) as err:
        raise SystemExit(str(err)) from None
    return folder


def _check_trace(args: argparse.Namespace) -> None:
    """``--trace`` and ``--trace-rounds`` checked before any process starts."""
    if args.trace is None:
        return
    try:
        checks.writable_file("--trace", args.trace)
        checks.positive_int("--trace-rounds", args.trace_rounds)
    except (TypeError, ValueError) as err:
        raise SystemExit(str(err)) from None


def _checked(args: argparse.Namespace) -> tuple[Path | None, Export | None]:
    """Every argument checked before any process starts: the checkpoint folder
    and the metrics export."""
    for name in ("workers", "envs_per_worker", "steps", "total_frames"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(args, name)} "
                             "is invalid; it must be >= 1")
    # the default budget in whole batches: the collector warns of a budget given
    if args.total_frames is None:
        batch = args.workers * args.envs_per_worker * args.steps
        args.total_frames = -(-TOTAL_FRAMES // batch) * batch
    checkpoint_dir = _checkpoint_dir(args)
    _check_trace(args)
    return checkpoint_dir, metrics_of(args)


def _close_bar(bar: tqdm, status: str) -> None:
    """The progress bar ends with how the run ended (full when the target was reached first)."""
    # the target ended the run before the frame budget: done
    if status.startswith("reached"):
        bar.total = bar.n
    bar.set_description_str(status, refresh=False)
    bar.close()


def _print_outcome(args: argparse.Namespace, data: dict[str, Any], path: Path, output: Path,
                   collector: Any) -> None:
    """The summary, where the run record, the learning curve and the timeline were written."""
    print(summary_table(data))
    if data["status"].startswith("reached"):
        print(f"reached a mean return of {args.target_return:g} over the last 20 episodes after "
              f"{data['frames']:,} frames in {data['wall_time_s']:.1f} s")
    plot = plot_curve(data, output / "learning_curve.png")
    print(f"run record: {path}" + (f"\nlearning curve: {plot}" if plot else ""))
    if args.trace is not None and collector is not None:
        written = not collector.tracing.rounds_left and args.trace.exists()
        print(f"timeline: {args.trace}" if written else "timeline: not written (fewer than "
                                                        f"{args.trace_rounds} batches)")


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed ``args``; returns the exit code (0, or 130 when interrupted). A
    requeueable SLURM job's stop signal ends it with
    :class:`~rpc_collectors.cluster.requeue.Requeued` once the run is checkpointed and the record
    written."""
    checkpoint_dir, metrics = _checked(args)
    output = (args.output_dir or checkpoint_dir
              or Path("runs") / f"{args.env}-{datetime.now():%Y%m%d-%H%M%S}")
    # small networks: threads only compete with the workers for cores
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = ppo.PPOConfig(target_return=args.target_return)
    actor, critic = ppo.make_agent(args.env, cfg.hidden)
    policy = ppo.make_policy(actor)
    optimizer = ppo.make_optimizer(actor, critic, cfg)
    record = RunRecord(args, cfg)
    status, start = "failed", time.perf_counter()
    collector, ckpt, bar, train_start, stop = None, None, None, start, None
    print(f"PPO on {args.env}: starting {args.workers} collector workers "
          f"({'sync' if args.sync else 'async'}, {args.envs_per_worker} envs each)", flush=True)
    try:
        collector = make_collector(args.env, policy, workers=args.workers,
                                   envs_per_worker=args.envs_per_worker, steps=args.steps,
                                   total_frames=args.total_frames, sync=args.sync, metrics=metrics)
        collector.set_seed(args.seed)
        if args.trace is not None:
            collector.trace(args.trace, rounds=args.trace_rounds)
        if checkpoint_dir is not None:
            ckpt = RunCheckpoint(checkpoint_dir, collector=collector,
                                 modules={"actor": actor, "critic": critic},
                                 optimizers={"adam": optimizer}, every=args.checkpoint_every)
            carried = ckpt.resume()
            if carried is not None:
                record.resume(carried, collector.frames)
        bar = tqdm(total=args.total_frames, initial=record.start_frames, unit="frame",
                   unit_scale=True, dynamic_ncols=True)
        train_start = time.perf_counter()
        status = "frame budget spent"
        for it in ppo.train(collector, policy, critic, cfg, num_workers=args.workers,
                            optimizer=optimizer):
            record.add(it, time.perf_counter() - train_start)
            bar.update(it.batch_frames)
            bar.set_postfix(ret="-" if it.mean_return is None else f"{it.mean_return:.1f}",
                            lag=it.policy_lag)
            if it.solved:
                status = f"reached {args.target_return:g}"
            if ckpt is not None and not it.solved:
                # after a stop signal: checkpoints, requeues, raises Requeued
                ckpt.after_batch(record.carried())
        if ckpt is not None:
            ckpt.finish(record.carried())
    except KeyboardInterrupt:
        status = "interrupted"
    except requeue.Requeued as requeued:
        status, stop = f"stopped ({requeued.reason}), resumes from {checkpoint_dir}", requeued
    finally:
        end = time.perf_counter()
        if bar is not None:
            _close_bar(bar, status)
        if collector is not None:
            collector.shutdown()
        data = record.finish(status, train_start - start, end - train_start)
        # every allocation of the run: start, frames, how it ended
        if ckpt is not None:
            current = {**ckpt.allocation, "frames": data["frames"]}
            current["end"] = status if current["end"] == "running" else current["end"]
            data["allocations"] = [*ckpt.allocations, current]
        path = record.save(output)
    _print_outcome(args, data, path, output, collector)
    if stop is not None:
        raise stop
    return 130 if status == "interrupted" else 0
