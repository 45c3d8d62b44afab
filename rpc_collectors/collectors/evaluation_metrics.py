"""What an evaluation reports, as TorchRL 0.14.1's ``Evaluator`` reports it: episode metrics of a
batch of whole trajectories, named ``"<prefix>/<metric>"``, and the flat TensorDict its
``on_result`` callback receives.

A batch is ``[n, T]`` zero-padded with ``("collector", "mask")`` (``traj_format="padded"``),
``[sum T_i]`` with ``("collector", "traj_ids")`` (``"cat"``), or, with neither, cut into
trajectories after each step whose done flag is set. An episode's return is its last
``("next", "episode_reward")`` (TorchRL's ``RewardSum``) or else the sum of its rewards; its length
is its last ``("next", "step_count")`` (a ``StepCounter``) or else its number of steps.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase

MASK = ("collector", "mask")
TRAJ_IDS = ("collector", "traj_ids")
EPISODE_REWARD = ("next", "episode_reward")
STEP_COUNT = ("next", "step_count")
# TorchRL's, in its order
EPISODE_METRICS = ("reward", "reward_std", "num_episodes", "episode_length", "fps")
# what metrics_fn returned, before it is named with the prefix
CUSTOM = "custom/"


def trajectories(batch: TensorDictBase, done_key: Any) -> list[TensorDictBase]:
    """The trajectories of ``batch``, each ``[T_i]``, empty ones left out."""
    mask = batch.get(MASK, None)
    if mask is not None:
        rows, masks = batch.reshape(-1, batch.shape[-1]), mask.reshape(-1, mask.shape[-1])
        found = [row[keep] for row, keep in zip(rows.unbind(0), masks.unbind(0))]
    elif batch.get(TRAJ_IDS, None) is not None:
        flat = batch.reshape(-1)
        ids = flat.get(TRAJ_IDS)
        found = [flat[ids == traj] for traj in ids.unique(sorted=True)]
    else:
        # each env's row of steps, cut after its done steps
        rows = batch.reshape(-1, batch.shape[-1]) if batch.batch_dims > 1 else batch.unsqueeze(0)
        found = []
        for row in rows.unbind(0):
            steps = row.shape[0]
            done = row.get(done_key).reshape(steps, -1).any(-1)
            ends = [0, *(torch.nonzero(done).squeeze(-1) + 1).tolist(), steps]
            found += [row[start:end] for start, end in zip(ends[:-1], ends[1:])]
    # (an empty TensorDict's numel() is 1)
    return [traj for traj in found if traj.shape[0]]


def episode_metrics(
    batch: TensorDictBase, reward_key: Any, done_key: Any, metrics_fn: Callable | None,
    seconds: float,
) -> dict[str, Any]:
    """TorchRL's metrics of ``batch``: mean and std of the episode returns, the number of episodes,
    the mean episode length, frames per second over ``seconds``, and ``metrics_fn(batch)``'s entries
    (under ``"custom/"``). Without episodes the means are NaN."""
    returns, lengths, frames = [], [], 0
    for traj in trajectories(batch, done_key):
        frames += traj.shape[0]
        episode_reward, reward = traj.get(EPISODE_REWARD, None), traj.get(reward_key, None)
        if episode_reward is not None:
            returns.append(float(episode_reward[-1].sum()))
        elif reward is not None:
            returns.append(float(reward.sum()))
        step_count = traj.get(STEP_COUNT, None)
        counted = step_count is not None
        lengths.append(int(step_count[-1].reshape(-1)[0]) if counted else traj.shape[0])
    values, nan = torch.tensor(returns, dtype=torch.float64), float("nan")
    # as TorchRL: the std of one episode is 0, of none NaN
    metrics: dict[str, Any] = {
        "reward": float(values.mean()) if returns else nan,
        "reward_std": (float(values.std()) if len(returns) > 1 else 0.0) if returns else nan,
        "num_episodes": len(returns),
        "episode_length": sum(lengths) / len(lengths) if returns else nan,
    }
    if seconds > 0:
        metrics["fps"] = frames / seconds
    if metrics_fn is not None:
        metrics.update({f"{CUSTOM}{name}": value for name, value in metrics_fn(batch).items()})
    return metrics


def named(metrics: dict[str, Any], prefix: str, step: int, version: int) -> dict[str, Any]:
    """A result: TorchRL's ``"<prefix>/<metric>"`` entries and ``"<prefix>/step"``, then the version
    of the weights evaluated, ``"<prefix>/policy_version"``, and the custom metrics."""
    result = {f"{prefix}/{name}": metrics[name] for name in EPISODE_METRICS if name in metrics}
    result[f"{prefix}/step"] = step
    result[f"{prefix}/policy_version"] = version
    custom = {name[len(CUSTOM):]: value for name, value in metrics.items()
              if name.startswith(CUSTOM)}
    result.update({f"{prefix}/{name}": value for name, value in custom.items()})
    return result


def as_tensordict(result: dict[str, Any]) -> TensorDictBase:
    """What ``on_result`` receives: the result's entries as CPU tensors, in a TensorDict of batch
    size ``[]``."""
    def tensor(value: Any) -> torch.Tensor:
        return value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)

    entries = {key: tensor(value) for key, value in result.items() if value is not None}
    return TensorDict(entries, batch_size=[])


def scalars(result: dict[str, Any]) -> dict[str, float]:
    """The numbers of ``result`` (numbers and one-element tensors) by name, as floats."""
    out = {}
    for name, value in result.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, numbers.Real):
            out[name] = float(value)
    return out
