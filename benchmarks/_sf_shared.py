"""What both sides of ``vs_sample_factory.py`` share: the env classes, the networks, the clock.

Imports only numpy, gymnasium and torch, so that Sample Factory's own venv (gymnasium 0.29,
numpy 1.26) and its spawned worker processes import it as the benchmark's other processes do.
Not a benchmark itself.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import torch
from torch import nn

PIXELS = (4, 84, 84)
FEATURES = {"pixels": 512, "cartpole": 64}  # the trunk's output width


class PixelEnv(gym.Env):
    """A deterministic env that costs next to nothing: 4x84x84 uint8 frames, Discrete(2).

    Every step returns the same preallocated frame, so the collector and the policy are what
    is measured. Episodes last ``episode_len`` steps.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, episode_len: int = 1000) -> None:
        self.observation_space = gym.spaces.Box(0, 255, PIXELS, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self._frame = np.zeros(PIXELS, np.uint8)
        self.episode_len, self._t = episode_len, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._frame, {}

    def step(self, action):
        self._t += 1
        return self._frame, 0.0, False, self._t >= self.episode_len, {}


def make_env(name: str) -> gym.Env:
    """``"pixels"``: a ``PixelEnv``; ``"cartpole"``: gymnasium's CartPole-v1."""
    return PixelEnv() if name == "pixels" else gym.make("CartPole-v1")


def trunk(env: str) -> nn.Module:
    """The policy's body, ``FEATURES[env]`` out. Pixels: DQN's Nature CNN on uint8 frames (scaled
    here, so both sides run the same code from the raw frame on); CartPole: a 2-layer tanh MLP."""
    if env == "pixels":
        return nn.Sequential(
            Scale(), nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
        )
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())


class Scale(nn.Module):
    """uint8 frames to floats in [0, 1]."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.float() / 255.0


class GreedyPolicy(nn.Module):
    """``trunk(env)``, a linear head, argmax: the policy of our and TorchRL's collectors (Sample
    Factory's actor-critic puts its own heads, an action and a value layer, on the same trunk)."""

    def __init__(self, env: str, actions: int = 2, one_hot: bool = False) -> None:
        super().__init__()
        self.trunk, self.head = trunk(env), nn.Linear(FEATURES[env], actions)
        self.obs_dims, self.actions, self.one_hot = 3 if env == "pixels" else 1, actions, one_hot

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[: obs.dim() - self.obs_dims]
        flat = obs.reshape(-1, *obs.shape[len(lead):])
        action = self.head(self.trunk(flat)).argmax(-1)
        if self.one_hot:
            action = nn.functional.one_hot(action, self.actions)
        return action.reshape(tuple(lead) + tuple(action.shape[1:]))


def frames_per_second(batches: Iterator[int], warmup: float, seconds: float) -> float:
    """Frames/s of ``batches`` (each item: the frames of one batch) over ``seconds`` of wall time,
    counted from ``warmup`` seconds after the first batch arrived."""
    next(batches)
    _run_for(batches, warmup)
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        frames += next(batches)
    return frames / (time.perf_counter() - start)


def _run_for(batches: Iterator[int], seconds: float) -> None:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(batches)
