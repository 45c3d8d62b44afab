"""PPO for discrete-action envs, written plainly: one file, read top to bottom.

The pieces, in the order a batch meets them:

1. :class:`Actor` samples actions in the collector's workers and writes ``"action"`` and
   ``"sample_log_prob"`` (wrapped in a ``TensorDictModule`` by :func:`make_policy`).
2. :class:`EpisodeReturns` sums ``("next", "reward")`` per ``("collector", "traj_ids")`` and
   reports the episodes that ended (``("next", "done")``) in the batch.
3. :func:`gae` computes advantages and value targets along the batch's time dim.
4. :func:`ppo_update` runs the clipped-objective optimisation (epochs x minibatches).
5. :func:`train` ties them together: ``for batch in collector`` -> returns -> GAE -> update ->
   ``collector.update_policy_weights_(policy)``, and yields one :class:`Iteration` per batch.

The CLI's ``rpc-collectors demo`` and ``examples/ppo.py`` both run :func:`train`.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Iterator

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

TRAJ_IDS = ("collector", "traj_ids")
POLICY_VERSION = ("collector", "policy_version")
WORKER_ID = ("collector", "worker_id")


@dataclass
class PPOConfig:
    """PPO hyperparameters; the defaults solve CartPole-v1 in 20k-30k frames
    (1024-frame batches)."""

    lr: float = 2.5e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    epochs: int = 6
    minibatch_size: int = 128
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    # stop once the mean of the last `window` episodes reaches it
    target_return: float | None = 475.0
    window: int = 20


# ----------------------------------------------------------------------------- networks
def mlp(n_in: int, n_out: int, hidden: int, out_std: float) -> nn.Sequential:
    """Two tanh hidden layers, orthogonal init (as CleanRL's PPO)."""
    layers = [nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
              nn.Linear(hidden, n_out)]
    for layer in layers:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, 2 ** 0.5 if layer is not layers[-1] else out_std)
            nn.init.zeros_(layer.bias)
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """Categorical policy: ``forward(obs) -> (action, log_prob)``; also scores given actions."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = mlp(obs_dim, n_actions, hidden, out_std=0.01)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = torch.log_softmax(self.net(obs), -1)
        action = torch.multinomial(log_probs.exp().reshape(-1, log_probs.shape[-1]), 1).reshape(
            log_probs.shape[:-1]
        )
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor,
                 action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of ``action`` and the policy's entropy at ``obs``."""
        log_probs = torch.log_softmax(self.net(obs), -1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), entropy


def make_policy(actor: Actor) -> TensorDictModule:
    """The policy the collector runs: reads ``"observation"``, writes
    ``"action"`` and ``"sample_log_prob"``."""
    return TensorDictModule(actor, in_keys=["observation"], out_keys=["action", "sample_log_prob"])


def make_agent(env_id: str, hidden: int = 64) -> tuple[Actor, nn.Module]:
    """Actor and critic sized for ``env_id``'s spaces (flat Box observations, Discrete actions)."""
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    flat_box = isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1
    if not isinstance(act_space, gym.spaces.Discrete) or not flat_box:
        raise ValueError(
            f"env={env_id!r} has observation space {obs_space} and action space {act_space}; this "
            "PPO accepts a flat Box observation space and a Discrete action "
            "space (e.g. CartPole-v1, Acrobot-v1)"
        )
    obs_dim = int(obs_space.shape[0])
    return Actor(obs_dim, int(act_space.n), hidden), mlp(obs_dim, 1, hidden, out_std=1.0)


# ------------------------------------------------------------------------ episode returns
class EpisodeReturns:
    """Episode returns from batches: rewards summed per trajectory id, across batch boundaries."""

    def __init__(self) -> None:
        self.partial: dict[int, float] = {}

    def update(self, batch: TensorDictBase) -> list[float]:
        """Returns of the episodes that ended in ``batch``, oldest trajectory first."""
        ids = batch.get(TRAJ_IDS).reshape(-1)
        reward = batch.get(("next", "reward")).reshape(-1).double()
        done = batch.get(("next", "done")).reshape(-1)
        unique, inverse = torch.unique(ids, return_inverse=True)
        sums = torch.zeros(len(unique), dtype=torch.float64).index_add_(0, inverse, reward)
        ended = torch.zeros(len(unique), dtype=torch.bool).index_put_(
            (inverse[done],), torch.tensor(True)
        )
        finished = []
        for traj, total, is_done in zip(unique.tolist(), sums.tolist(), ended.tolist()):
            total += self.partial.pop(traj, 0.0)
            if is_done:
                finished.append(total)
            else:
                self.partial[traj] = total
        return finished


# ----------------------------------------------------------------------------------- GAE
def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation along the last dim (time); returns (advantage, value
    target).

    ``next_value`` is the critic at ``("next", "observation")``: it bootstraps truncated episodes
    and the batch's last step; ``terminated`` zeroes it, ``done`` stops the recursion.
    """
    delta = reward + gamma * next_value * (~terminated) - value
    keep = gamma * lam * (~done).to(value.dtype)
    advantage = torch.empty_like(delta)
    running = torch.zeros_like(delta[..., 0])
    for t in reversed(range(delta.shape[-1])):
        running = delta[..., t] + keep[..., t] * running
        advantage[..., t] = running
    return advantage, advantage + value


# -------------------------------------------------------------------------------- update
def ppo_update(actor: Actor, critic: nn.Module, optimizer: torch.optim.Optimizer,
               data: TensorDictBase, cfg: PPOConfig) -> dict[str, float]:
    """Clipped-objective PPO on a flat batch with ``advantage`` and
    ``value_target``; returns mean losses."""
    stats = collections.defaultdict(float)
    n_updates = 0
    for _ in range(cfg.epochs):
        for idx in torch.randperm(data.numel()).split(cfg.minibatch_size):
            mb = data[idx]
            log_prob, entropy = actor.evaluate(mb["observation"], mb["action"])
            ratio = (log_prob - mb["sample_log_prob"]).exp()
            adv = mb["advantage"]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            clipped = ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps)
            policy_loss = torch.max(-adv * ratio, -adv * clipped).mean()
            value_error = critic(mb["observation"]).squeeze(-1) - mb["value_target"]
            value_loss = 0.5 * value_error.pow(2).mean()
            entropy = entropy.mean()
            loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_([*actor.parameters(), *critic.parameters()], cfg.max_grad_norm)
            optimizer.step()

            stats["policy_loss"] += policy_loss.item()
            stats["value_loss"] += value_loss.item()
            stats["entropy"] += entropy.item()
            stats["clip_fraction"] += ((ratio - 1).abs() > cfg.clip_eps).float().mean().item()
            n_updates += 1
    return {k: v / n_updates for k, v in stats.items()}


# --------------------------------------------------------------------------------- train
@dataclass
class Iteration:
    """What :func:`train` reports after each batch."""

    # frames collected so far
    frames: int
    batch_frames: int
    # episodes that ended in this batch
    episode_returns: list[float]
    # mean of the last `window` episodes
    mean_return: float | None
    # trainer's weights version minus the batch's oldest policy_version
    policy_lag: int
    # frames of this batch per worker
    worker_frames: dict[int, int]
    losses: dict[str, float]
    solved: bool


def worker_frames(batch: TensorDictBase, num_workers: int) -> dict[int, int]:
    """Frames per worker: from ``("collector", "worker_id")`` if present, else
    dim 0 of a stacked batch."""
    if WORKER_ID in batch.keys(include_nested=True):
        ids, counts = torch.unique(batch.get(WORKER_ID), return_counts=True)
        return dict(zip(ids.tolist(), counts.tolist()))
    if num_workers > 1:
        return {w: batch[w].numel() for w in range(num_workers)}
    return {0: batch.numel()}


def make_optimizer(actor: nn.Module, critic: nn.Module, cfg: PPOConfig) -> torch.optim.Optimizer:
    """Adam over the actor's and the critic's parameters."""
    return torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=cfg.lr, eps=1e-5)


def train(
    collector, policy: TensorDictModule, critic: nn.Module, cfg: PPOConfig, num_workers: int = 1,
    optimizer: torch.optim.Optimizer | None = None,
) -> Iterator[Iteration]:
    """The PPO loop; yields after every batch and stops when ``cfg.target_return`` is reached.

    ``collector`` was built with ``policy`` (from :func:`make_policy`) and ``num_workers``
    workers; its batches have TorchRL's layout ``[..., T]``. ``optimizer``: default
    :func:`make_optimizer`'s (pass one to checkpoint it).
    """
    actor = policy.module
    optimizer = optimizer if optimizer is not None else make_optimizer(actor, critic, cfg)
    returns = EpisodeReturns()
    recent: collections.deque[float] = collections.deque(maxlen=cfg.window)
    # bumped at every push, as the collector's (resumed: from there)
    version = getattr(collector, "policy_version", 0)
    frames = getattr(collector, "frames", 0)
    for batch in collector:
        frames += batch.numel()
        finished = returns.update(batch)
        recent.extend(finished)
        lag = version - collector.last_batch.oldest_version

        # advantages with the critic as it is now, before the update
        with torch.no_grad():
            value = critic(batch["observation"]).squeeze(-1)
            next_value = critic(batch["next", "observation"]).squeeze(-1)
        advantage, value_target = gae(
            batch["next", "reward"].squeeze(-1), value, next_value,
            batch["next", "terminated"].squeeze(-1), batch["next", "done"].squeeze(-1),
            cfg.gamma, cfg.gae_lambda,
        )
        batch.set("advantage", advantage)
        batch.set("value_target", value_target)
        keys = ("observation", "action", "sample_log_prob", "advantage", "value_target")
        data = batch.select(*keys).reshape(-1)

        losses = ppo_update(actor, critic, optimizer, data, cfg)

        # push the new weights: the next batches are collected with them
        collector.update_policy_weights_(policy)
        version += 1

        mean_return = sum(recent) / len(recent) if recent else None
        solved = (cfg.target_return is not None and len(recent) == cfg.window
                  and mean_return >= cfg.target_return)
        yield Iteration(
            frames=frames, batch_frames=batch.numel(), episode_returns=finished,
            mean_return=mean_return, policy_lag=lag,
            worker_frames=collector.last_batch.worker_frames or worker_frames(batch, num_workers),
            losses=losses, solved=solved
        )
        if solved:
            return
