"""PPO on CartPole-v1 with an RPCCollector of local worker processes.

The algorithm is in ``rpc_collectors/ppo.py``, written top to bottom: the policy the workers
run, episode returns from the batch, GAE, the clipped PPO update, and the loop
``for batch in collector: ... update ...; collector.update_policy_weights_(policy)``.
This script builds the pieces and prints one line per batch:

    python examples/ppo.py                       # 2 local workers, until mean return >= 475
    python examples/ppo.py --total-frames 2000   # a short run
    torchrun --nproc-per-node 3 examples/ppo.py --launcher torchrun   # rank 0 trains, 1..2 collect
    python examples/ppo.py --checkpoint-dir runs/ppo  # saves the run every 10 batches; run again to resume

On SLURM, ``slurm/submit.py examples/ppo.py --launcher slurm --requeue --checkpoint-dir DIR ...``
runs past the time limit: the job checkpoints after its batch and requeues, and resumes here.

``rpc-collectors demo`` runs the same training with a progress bar, a summary and a plot.
"""
from __future__ import annotations

import argparse
import os
from functools import partial
from typing import Sequence

import torch

from rpc_collectors import GymEnv, RPCCollector, RunCheckpoint
from rpc_collectors.apps.ppo import PPOConfig, make_agent, make_optimizer, make_policy, train

ENVS_PER_WORKER = 4
STEPS_PER_BATCH = 128  # per env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (torchrun: WORLD_SIZE - 1)")
    parser.add_argument("--total-frames", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launcher", default="local", choices=["auto", "local", "torchrun", "slurm", "debug"])
    parser.add_argument("--checkpoint-dir", default=os.environ.get("RPC_COLLECTORS_CHECKPOINT_DIR"),
                        help="keep the run there and resume from it (in a job submitted with --checkpoint-dir: that one)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="batches between checkpoints")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    cfg = PPOConfig()
    actor, critic = make_agent(args.env, cfg.hidden)
    policy = make_policy(actor)  # writes "action" and "sample_log_prob"

    distributed = args.launcher in ("torchrun", "slurm") or (args.launcher == "auto" and "WORLD_SIZE" in os.environ)
    workers = int(os.environ["WORLD_SIZE"]) - 1 if distributed else args.workers
    # Under torchrun every rank runs this line; ranks > 0 serve a collector inside it and exit.
    collector = RPCCollector(
        partial(GymEnv, args.env, num_envs=ENVS_PER_WORKER), policy,
        frames_per_batch=workers * ENVS_PER_WORKER * STEPS_PER_BATCH, total_frames=args.total_frames,
        num_collectors=None if distributed else workers, sync=True, launcher=args.launcher, cat_results="stack",
    )
    try:
        collector.set_seed(args.seed)
        optimizer = make_optimizer(actor, critic, cfg)
        checkpoint = None
        if args.checkpoint_dir is not None:  # resume where the last run (or allocation) stopped
            checkpoint = RunCheckpoint(args.checkpoint_dir, collector=collector, modules={"actor": actor, "critic": critic},
                                       optimizers={"adam": optimizer}, every=args.checkpoint_every)
            checkpoint.resume()
        for it in train(collector, policy, critic, cfg, num_workers=workers, optimizer=optimizer):
            mean = "-" if it.mean_return is None else f"{it.mean_return:6.1f}"
            print(f"frames {it.frames:>8,}  mean return (last {cfg.window}) {mean}  policy lag {it.policy_lag}"
                  f"  value loss {it.losses['value_loss']:.3f}", flush=True)
            if checkpoint is not None:
                checkpoint.after_batch()  # on SLURM's stop signal: saves, requeues the job and ends the script
        if checkpoint is not None:
            checkpoint.finish()
        print(f"{'solved' if it.solved else 'stopped'} after {it.frames:,} frames")
    finally:
        collector.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
