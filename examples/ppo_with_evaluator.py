"""PPO on CartPole-v1 with an Evaluator in a worker process of its own, beside training.

The training is examples/ppo.py's (the PPO of ``rpc_collectors/apps/ppo.py`` on an RPCCollector of
local workers). Every ``--eval-every`` batches the trainer hands the new weights to an
``Evaluator(backend="process")`` with ``trigger_eval(policy, step=frames, version=...)`` and goes
on training; the evaluator plays ``--eval-episodes`` greedy episodes in its worker and the trainer
picks the result up with ``poll()`` (a trigger while one is running is skipped). Each result is
stamped with the weights version it evaluated, the collector's ``policy_version``.

With ``--eval-on worker`` the evaluations run in the collector's last worker instead
(``Evaluator(backend="worker", worker_of=collector)``), beside its collection: no process of their
own, and none of the trainer's cores.

The progress bar shows the training return (``ret``) and the last evaluation return (``eval``).
The evaluator is given the collector as ``metrics=``: the last result and the count of them are
in ``collector.metrics()`` (``"eval/reward"``, ``"eval/results"``, ...) and in whatever its
``metrics=`` exports write. The run record (``run.json``) keeps every batch, every evaluation and
the collector's metrics at the end, and the learning curve
(``learning_curve.png``, with matplotlib) plots the evaluation returns against frames:

    python examples/ppo_with_evaluator.py                       # until a greedy return of 475
    python examples/ppo_with_evaluator.py --total-frames 4096   # a short run
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import torch
from tensordict.nn import TensorDictModule
from tqdm import tqdm

from rpc_collectors import Evaluator, GymEnv, RPCCollector
from rpc_collectors.apps.ppo import Actor, PPOConfig, make_agent, make_policy, train

ENVS_PER_WORKER = 4
STEPS_PER_BATCH = 128  # per env
EVAL_MAX_STEPS = 500  # CartPole-v1's own limit


class GreedyActor(Actor):
    """The actor's most likely action: the same weights as the one that trains, no sampling."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).argmax(-1)


def greedy_policy(env_id: str, hidden: int) -> TensorDictModule:
    """What the evaluator's worker builds; the trainer's weights are loaded into it."""
    actor, _ = make_agent(env_id, hidden)
    greedy = GreedyActor(actor.net[0].in_features, actor.net[-1].out_features, hidden)
    return TensorDictModule(greedy, in_keys=["observation"], out_keys=["action"])


def plot(record: dict[str, Any], path: Path) -> Path | None:
    """Evaluation returns (mean and spread) and the training return against frames; None (with a
    notice) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "learning curve skipped: matplotlib is not installed "
            "(pip install 'rpc_collectors[plot]')"
        )
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    train_points = [
        (p["frames"], p["mean_return"]) for p in record["curve"] if p["mean_return"] is not None
    ]
    if train_points:
        ax.plot(
            *zip(*train_points), color="C0", alpha=0.5, label="training return (last 20 episodes)"
        )
    evals = record["evaluations"]
    if evals:
        frames = [e["eval/step"] for e in evals]
        mean = torch.tensor([e["eval/reward"] for e in evals])
        std = torch.tensor([e["eval/reward_std"] for e in evals])
        ax.plot(frames, mean, color="C1", marker="o", label="evaluation return (greedy)")
        ax.fill_between(frames, mean - std, mean + std, color="C1", alpha=0.2)
    ax.set(
        xlabel="frames",
        ylabel="return",
        title=f"PPO on {record['settings']['env']}, evaluated beside training",
    )
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(result: dict[str, Any]) -> str:
    """One evaluation in a line: when, which weights, the return over how many episodes."""
    step, version = result["eval/step"], result["eval/policy_version"]
    mean, std = result["eval/reward"], result["eval/reward_std"]
    episodes = result["eval/num_episodes"]
    return (f"eval at {step:>7,} frames (weights v{version}): return {mean:6.1f} +- {std:5.1f} "
            f"over {episodes} episodes")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=2, help="local collector worker processes")
    parser.add_argument("--total-frames", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=2, help="batches between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=5, help="episodes per evaluation")
    parser.add_argument(
        "--target-return", type=float, default=475.0, help="stop at this evaluation return"
    )
    parser.add_argument(
        "--eval-on", choices=("process", "worker"), default="process",
        help="a worker process of the evaluator's own, or the collector's last worker",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="default: runs/<env>-eval-<date>-<time>"
    )
    args = parser.parse_args(argv)
    output = args.output_dir or Path("runs") / f"{args.env}-eval-{datetime.now():%Y%m%d-%H%M%S}"

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = PPOConfig(target_return=None)  # the evaluations decide when to stop
    actor, critic = make_agent(args.env, cfg.hidden)
    policy = make_policy(actor)
    record: dict[str, Any] = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "curve": [],
        "evaluations": [],
    }
    collector = RPCCollector(
        partial(GymEnv, args.env, num_envs=ENVS_PER_WORKER),
        policy,
        frames_per_batch=args.workers * ENVS_PER_WORKER * STEPS_PER_BATCH,
        total_frames=args.total_frames,
        num_collectors=args.workers,
        sync=True,
        launcher="local",
        cat_results="stack",
    )
    where = {"backend": "worker", "worker_of": collector} if args.eval_on == "worker" else {
        "backend": "process"}
    evaluator = Evaluator(
        partial(GymEnv, args.env),
        policy_factory=partial(greedy_policy, args.env, cfg.hidden),
        num_trajectories=args.eval_episodes,
        max_steps=EVAL_MAX_STEPS,
        frames_per_batch=EVAL_MAX_STEPS,
        busy_policy="skip",
        metrics=collector,  # each result also lands in collector.metrics() and its exports
        **where,
    )
    bar = tqdm(total=args.total_frames, unit="frame", unit_scale=True, dynamic_ncols=True)
    try:
        collector.set_seed(args.seed)
        last = "-"
        iterations = train(collector, policy, critic, cfg, num_workers=args.workers)
        for batch, it in enumerate(iterations, 1):
            record["curve"].append({"frames": it.frames, "mean_return": it.mean_return,
                                    **it.losses})
            if batch % args.eval_every == 0:  # the weights train() just pushed, and their version
                evaluator.trigger_eval(policy, step=it.frames, version=collector.policy_version)
            result = evaluator.poll()
            if result is not None:
                bar.write(report(result))
                last = f"{result['eval/reward']:.1f}"
            bar.update(it.batch_frames)
            ret = "-" if it.mean_return is None else f"{it.mean_return:.1f}"
            bar.set_postfix(ret=ret, eval=last)
            if result is not None and result["eval/reward"] >= args.target_return:
                break
        in_flight = evaluator.wait(timeout=120)  # None: none was running
        bar.close()
        if in_flight is not None:
            print(report(in_flight))
        final = evaluator.evaluate(policy, step=it.frames, version=collector.policy_version)
        print(f"final {report(final)}")
        record["metrics"] = collector.metrics().scalars()
    finally:
        bar.close()
        evaluator.shutdown()
        collector.shutdown()
    record["evaluations"] = evaluator.results
    output.mkdir(parents=True, exist_ok=True)
    (output / "run.json").write_text(json.dumps(record, indent=1))
    curve = plot(record, output / "learning_curve.png")
    print(f"run record: {output / 'run.json'}" + (f"\nlearning curve: {curve}" if curve else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
