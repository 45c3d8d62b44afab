"""The ``rpc-collectors`` command.

```text
rpc-collectors demo [--workers 2] [--total-frames N] [--seed S] [--env ID] [--sync|--async]
                    [--output-dir DIR] [--checkpoint-dir DIR] [--checkpoint-every N]
```
"""
from __future__ import annotations

import argparse
from typing import Sequence

from rpc_collectors.apps import demo


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``rpc-collectors`` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="rpc-collectors",
        description="Reinforcement-learning experience collectors over torch.distributed.rpc.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo_parser = commands.add_parser(
        "demo", help="train PPO on CartPole-v1 with 2 local collector workers until it reaches 475",
        description="Train PPO with a collector of local worker processes until the mean return of "
        "the last 20 episodes reaches the target; print a summary and write run.json and "
        "learning_curve.png to the output folder. Ctrl-C stops cleanly and keeps the record. With "
        "--checkpoint-dir the run is checkpointed there and resumes when started "
        "again (also as a requeued SLURM job).",
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(func=demo.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rpc-collectors`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
