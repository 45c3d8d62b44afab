"""DQN on CartPole-v1 fed by an asynchronous RPCCollector through a replay buffer.

``collector.start()`` collects in the background: each worker's batch goes into the replay
buffer as soon as it is ready, while the trainer samples from the buffer and takes gradient
steps. Every ``--push-every`` gradient steps the trainer pushes its Q-network (and the current
exploration rate, a buffer of the policy) to the workers whose data arrived since the last push.

With torchrl installed the buffer is TorchRL's ``ReplayBuffer`` with a ``SliceSampler`` over
``("collector", "traj_ids")``; otherwise a small uniform buffer defined here.

    python examples/offpolicy_async.py                        # 2 workers, 100k frames
    python examples/offpolicy_async.py --total-frames 2000    # a short run
"""
from __future__ import annotations

import argparse
import copy
import threading
import time
from functools import partial
from typing import Any, Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from rpc_collectors import GymEnv, RPCCollector
from rpc_collectors.apps.ppo import POLICY_VERSION, WORKER_ID, EpisodeReturns, mlp

KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated")]


class EpsilonGreedy(nn.Module):
    """Greedy actions of a Q-network, random with probability ``epsilon`` (a buffer, so it travels with the weights)."""

    def __init__(self, qnet: nn.Module, n_actions: int) -> None:
        super().__init__()
        self.qnet, self.n_actions = qnet, n_actions
        self.register_buffer("epsilon", torch.tensor(1.0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        greedy = self.qnet(obs).argmax(-1)
        explore = torch.rand(greedy.shape) < self.epsilon
        return torch.where(explore, torch.randint_like(greedy, self.n_actions), greedy)


class UniformBuffer:
    """A fixed-size ring buffer of transitions: ``extend(td)`` and ``sample(n)``."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.storage, self.cursor, self.size = capacity, None, 0, 0

    def extend(self, td: TensorDictBase) -> None:
        td = td.reshape(-1)
        if self.storage is None:
            self.storage = td[0].expand(self.capacity).clone().zero_()
        idx = (self.cursor + torch.arange(td.numel())) % self.capacity
        self.storage[idx] = td
        self.cursor = (self.cursor + td.numel()) % self.capacity
        self.size = min(self.size + td.numel(), self.capacity)

    def sample(self, n: int) -> TensorDictBase:
        return self.storage[torch.randint(self.size, (n,))]

    def __len__(self) -> int:
        return self.size


def make_storage(capacity: int, batch_size: int) -> Any:
    """TorchRL's ReplayBuffer + SliceSampler on the collector's trajectory ids if available, else UniformBuffer."""
    try:
        from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
    except ImportError:
        return UniformBuffer(capacity)
    sampler = SliceSampler(slice_len=8, traj_key=("collector", "traj_ids"), end_key=("next", "done"), strict_length=False)
    return ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=batch_size)


class Feed:
    """What the collector writes into (``.extend(td)``): stores transitions and keeps the trainer's books.

    Counts frames, sums episode returns, notes which workers delivered data since the last
    weight push and the oldest policy version among the frames, all under one lock shared
    with ``sample``.
    """

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.lock = threading.Condition()
        self.frames = 0
        self.returns = EpisodeReturns()
        self.recent: list[float] = []
        self.delivered: set[int] = set()
        self.oldest_version: int | None = None

    def extend(self, batch: TensorDictBase) -> None:
        finished = self.returns.update(batch)
        flat = batch.reshape(-1).select(*KEYS, ("collector", "traj_ids"), ("next", "done"))
        with self.lock:
            self.storage.extend(flat)
            self.frames += batch.numel()
            self.recent = (self.recent + finished)[-20:]
            if WORKER_ID in batch.keys(include_nested=True):
                self.delivered.update(batch.get(WORKER_ID).unique().tolist())
            version = int(batch.get(POLICY_VERSION).min())
            self.oldest_version = version if self.oldest_version is None else min(self.oldest_version, version)
            self.lock.notify_all()

    def wait_frames(self, frames: int, timeout: float) -> bool:
        """Block until at least ``frames`` frames arrived; False on timeout."""
        with self.lock:
            return self.lock.wait_for(lambda: self.frames >= frames, timeout)

    def sample(self, n: int) -> TensorDictBase:
        with self.lock:
            return self.storage.sample(n) if isinstance(self.storage, UniformBuffer) else self.storage.sample()

    def take_delivered(self) -> tuple[list[int], int | None]:
        """Workers that delivered since the last call, and the oldest policy version they used."""
        with self.lock:
            workers, version = sorted(self.delivered), self.oldest_version
            self.delivered, self.oldest_version = set(), None
            return workers, version


def wait_for_data(feed: Feed, collector: Any, frames: int) -> bool:
    """Wait until ``frames`` frames are in the feed; False if collection stopped before that."""
    while not feed.wait_frames(frames, timeout=0.5):
        if not collector.running:
            return feed.frames >= frames
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--total-frames", type=int, default=100_000)
    parser.add_argument("--frames-per-batch", type=int, default=256, help="frames of each worker's batch")
    parser.add_argument("--learning-starts", type=int, default=1000, help="frames collected before training")
    parser.add_argument("--push-every", type=int, default=20, help="gradient steps between weight pushes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the collector to stop")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    gamma, batch_size, lr, tau = 0.99, 128, 1e-3, 0.01
    qnet = mlp(4, 2, 128, out_std=1.0)
    target = copy.deepcopy(qnet)
    explorer = EpsilonGreedy(qnet, 2)
    policy = TensorDictModule(explorer, in_keys=["observation"], out_keys=["action"])
    optimizer = torch.optim.Adam(qnet.parameters(), lr=lr)
    feed = Feed(make_storage(50_000, batch_size))

    collector = RPCCollector(
        partial(GymEnv, "CartPole-v1"), policy,
        frames_per_batch=args.frames_per_batch, total_frames=args.total_frames,
        num_collectors=args.workers, sync=False, replay_buffer=feed,
        track_policy_version=True,  # every frame carries ("collector", "policy_version")
    )
    version, steps, start = 0, 0, time.perf_counter()
    try:
        collector.set_seed(args.seed)
        collector.start()
        # one gradient step per 2 collected frames at most, once learning has started;
        # training ends when the collector has delivered all frames (or stopped early)
        while wait_for_data(feed, collector, min(max(args.learning_starts, 2 * steps), args.total_frames)):
            if feed.frames >= args.total_frames:
                break
            data = feed.sample(batch_size)
            with torch.no_grad():
                best = qnet(data["next", "observation"]).argmax(-1, keepdim=True)  # double DQN
                next_q = target(data["next", "observation"]).gather(-1, best).squeeze(-1)
                y = data["next", "reward"].squeeze(-1) + gamma * next_q * (~data["next", "terminated"].squeeze(-1))
            q = qnet(data["observation"]).gather(-1, data["action"].unsqueeze(-1)).squeeze(-1)
            loss = nn.functional.smooth_l1_loss(q, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            with torch.no_grad():
                for p, p_target in zip(qnet.parameters(), target.parameters()):
                    p_target.lerp_(p, tau)

            if steps % args.push_every == 0:
                explorer.epsilon.fill_(max(0.05, 1.0 - feed.frames / (0.5 * args.total_frames)))
                workers, oldest = feed.take_delivered()
                lag = "-" if oldest is None else version - oldest  # trainer's version minus the data's
                collector.update_policy_weights_(policy, worker_ids=workers or None)
                version += 1
                recent = feed.recent
                mean = f"{sum(recent) / len(recent):6.1f}" if recent else "     -"
                print(f"frames {feed.frames:>8,}  grad steps {steps:>6}  mean return (last 20) {mean}"
                      f"  epsilon {explorer.epsilon.item():.2f}  lag {lag}  pushed to {workers or 'all'}", flush=True)
    finally:
        collector.async_shutdown(timeout=args.timeout)
    elapsed = time.perf_counter() - start
    recent = feed.recent
    print(f"done: {feed.frames:,} frames, {steps} gradient steps in {elapsed:.1f} s; "
          f"mean return (last 20) {sum(recent) / max(len(recent), 1):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
