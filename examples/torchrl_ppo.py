"""The PPO loop of TorchRL's PPO tutorial, with one import changed: the collector is ours.

TorchRL's env (``GymEnv`` in a ``TransformedEnv`` with ``ObservationNorm``, ``DoubleToFloat``
and ``StepCounter``), its ``ProbabilisticActor`` with a ``TanhNormal``, ``ValueOperator``,
``GAE``, ``ClipPPOLoss`` and a ``ReplayBuffer`` to cut minibatches. The only line that differs
from a pure-TorchRL script is the import of ``MultiSyncCollector``; ``--collector torchrl``
switches it back, which ``benchmarks/torchrl_ppo.py`` uses to compare the two.

    python examples/torchrl_ppo.py                                  # Pendulum-v1 (HalfCheetah-v4 with mujoco)
    python examples/torchrl_ppo.py --total-frames 2000 --frames-per-batch 1000 --epochs 2   # a short run

Needs ``pip install torchrl`` (tested with torchrl 0.14.1). Each batch prints one line:
``frames``, mean reward per step, frames/s of the whole loop so far.
"""
from __future__ import annotations

import argparse
import importlib.util
import time
import warnings
from functools import partial

import torch
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn

with warnings.catch_warnings():  # torchrl 0.14.1 deprecates some of its own classes as it imports them
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
    from torchrl.envs import Compose, DoubleToFloat, ObservationNorm, StepCounter, TransformedEnv
    from torchrl.envs.libs.gym import GymEnv
    from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from rpc_collectors import MultiSyncCollector  # was: from torchrl.collectors import MultiSyncCollector


def default_env() -> str:
    return "HalfCheetah-v4" if importlib.util.find_spec("mujoco") else "Pendulum-v1"


def make_env(env_id: str, loc: torch.Tensor | None = None, scale: torch.Tensor | None = None) -> TransformedEnv:
    """The tutorial's env; ``loc``/``scale`` are the observation statistics, computed once by the trainer."""
    if loc is None:
        norm = ObservationNorm(in_keys=["observation"])
    else:
        norm = ObservationNorm(loc=loc, scale=scale, in_keys=["observation"])
    return TransformedEnv(GymEnv(env_id, device="cpu"), Compose(norm, DoubleToFloat(), StepCounter()))


def observation_stats(env_id: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    env = make_env(env_id)
    env.set_seed(seed)
    env.transform[0].init_stats(num_iter=1000, reduce_dim=0, cat_dim=0)
    norm = env.transform[0]
    loc, scale = norm.loc.clone(), norm.scale.clone()
    env.close()
    return loc, scale


def make_modules(env: TransformedEnv, num_cells: int) -> tuple[ProbabilisticActor, ValueOperator]:
    obs_dim = env.observation_spec["observation"].shape[-1]
    act_dim = env.action_spec.shape[-1]
    actor_net = nn.Sequential(
        nn.Linear(obs_dim, num_cells), nn.Tanh(), nn.Linear(num_cells, num_cells), nn.Tanh(),
        nn.Linear(num_cells, num_cells), nn.Tanh(), nn.Linear(num_cells, 2 * act_dim), NormalParamExtractor(),
    )
    policy_module = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        spec=env.action_spec, in_keys=["loc", "scale"], distribution_class=TanhNormal,
        distribution_kwargs={"low": env.action_spec.space.low, "high": env.action_spec.space.high},
        return_log_prob=True,
    )
    value_net = nn.Sequential(
        nn.Linear(obs_dim, num_cells), nn.Tanh(), nn.Linear(num_cells, num_cells), nn.Tanh(),
        nn.Linear(num_cells, num_cells), nn.Tanh(), nn.Linear(num_cells, 1),
    )
    return policy_module, ValueOperator(value_net, in_keys=["observation"])


def collector_class(name: str):
    if name == "torchrl":
        from torchrl.collectors import MultiSyncCollector as TorchRLMultiSync

        return TorchRLMultiSync
    return MultiSyncCollector


def train(args: argparse.Namespace, log=print) -> dict:
    """Run the tutorial's loop; returns frames, mean reward per batch, fps and set-up/shut-down times."""
    torch.manual_seed(args.seed)
    loc, scale = observation_stats(args.env, args.seed)
    env_fn = partial(make_env, args.env, loc, scale)
    probe = env_fn()
    policy_module, value_module = make_modules(probe, args.num_cells)
    probe.close()

    replay_buffer = ReplayBuffer(storage=LazyTensorStorage(max_size=args.frames_per_batch),
                                 sampler=SamplerWithoutReplacement())
    advantage_module = GAE(gamma=0.99, lmbda=0.95, value_network=value_module, average_gae=True)
    loss_module = ClipPPOLoss(
        actor_network=policy_module, critic_network=value_module, clip_epsilon=0.2,
        entropy_bonus=True, entropy_coeff=1e-4, critic_coeff=1.0, loss_critic_type="smooth_l1",
    )
    optim = torch.optim.Adam(loss_module.parameters(), args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optim, args.total_frames // args.frames_per_batch, 0.0)

    t0 = time.perf_counter()
    collector = collector_class(args.collector)(
        [env_fn] * args.workers, policy_module,
        frames_per_batch=args.frames_per_batch, total_frames=args.total_frames, split_trajs=False,
    )
    record = {"frames": [], "reward": [], "fps": [], "build_s": time.perf_counter() - t0}
    frames, start = 0, time.perf_counter()
    try:
        collector.set_seed(args.seed)
        for tensordict_data in collector:
            for _ in range(args.epochs):
                advantage_module(tensordict_data)
                replay_buffer.extend(tensordict_data.reshape(-1).cpu())
                for _ in range(args.frames_per_batch // args.sub_batch_size):
                    subdata = replay_buffer.sample(args.sub_batch_size)
                    loss_vals = loss_module(subdata)
                    loss_value = loss_vals["loss_objective"] + loss_vals["loss_critic"] + loss_vals["loss_entropy"]
                    loss_value.backward()
                    torch.nn.utils.clip_grad_norm_(loss_module.parameters(), 1.0)
                    optim.step()
                    optim.zero_grad()
            frames += tensordict_data.numel()
            reward = tensordict_data["next", "reward"].mean().item()
            fps = frames / (time.perf_counter() - start)
            record["frames"].append(frames)
            record["reward"].append(reward)
            record["fps"].append(fps)
            log(f"frames {frames:8d}  reward {reward:8.4f}  fps {fps:7.0f}")
            collector.update_policy_weights_()
            scheduler.step()
    finally:
        t1 = time.perf_counter()
        collector.shutdown()
        record["shutdown_s"] = time.perf_counter() - t1
    return record


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default=default_env(), help="gymnasium id (default: HalfCheetah-v4 with mujoco, else Pendulum-v1)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--frames-per-batch", type=int, default=4096)
    p.add_argument("--total-frames", type=int, default=81_920)
    p.add_argument("--sub-batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--num-cells", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--collector", choices=("ours", "torchrl"), default="ours",
                   help="whose MultiSyncCollector collects (the benchmark runs both)")
    return p


def main() -> None:
    args = parser().parse_args()
    record = train(args)
    print(f"collector built in {record['build_s']:.1f} s, shut down in {record['shutdown_s']:.1f} s")


if __name__ == "__main__":  # TorchRL's collectors start their workers with spawn: this guard is theirs
    main()
