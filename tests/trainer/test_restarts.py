"""Replacing failed workers (``max_worker_restarts``) with real processes: SIGKILLs mid-batch,
envs that raise, a worker that hangs; the budget; what the yielded data looks like meanwhile.

``StampEnv`` writes into every observation the pid of the process that stepped it, the
worker id and a per-process step counter, so a test can tell from the batches alone whether
a batch mixes processes, misses frames or comes from the wrong worker.
"""
from __future__ import annotations

import os
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from procs import descendants
from rpc_collectors import GymEnv, MultiCollector, RPCCollector, WorkerError, WorkerRestartWarning

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

WORKERS, RESTARTS = 4, 3


class StampEnv(gym.Env):
    """Observation ``[pid, step counter, worker, 0...]`` (``size`` floats); episodes of 9 steps;
    ``Discrete(actions)``.

    ``raise_at``: raise at that step of every process (with ``marker``: of the first process to
    reach it only); ``hang_at``: the first process to reach that step (``marker`` file) sleeps
    forever; ``step_s``: seconds per step.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, worker: int, size: int = 3, step_s: float = 0.0, raise_at: int = 0,
                 hang_at: int = 0, marker: str = "", actions: int = 2) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), np.float64)
        self.action_space = gym.spaces.Discrete(actions)
        self.worker, self.size, self.step_s = worker, size, step_s
        self.raise_at, self.hang_at, self.marker = raise_at, hang_at, marker
        self.counter = self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size)
        obs[:3] = os.getpid(), self.counter, self.worker
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.counter += 1
        self.t += 1
        if self.step_s:
            time.sleep(self.step_s)
        if self.counter == self.raise_at and (not self.marker or self._first()):
            raise RuntimeError(f"simulator crashed at step {self.counter}")
        if self.counter == self.hang_at and self.marker and self._first():
            time.sleep(3600)
        return self._obs(), 1.0, False, self.t == 9, {}

    def _first(self) -> bool:
        """Whether this process is the first of the test to get here (it creates ``marker``)."""
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return False
        return True


class Policy(nn.Module):
    """Action = argmax of the bias (the observation is multiplied by 0)."""

    def __init__(self, actions: int = 2) -> None:
        super().__init__()
        self.linear = nn.Linear(3, actions)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation[..., :3].float() * 0).argmax(-1)


def env_fns(**kwargs) -> list:
    return [lambda i=i: GymEnv(StampEnv(i, **kwargs)) for i in range(WORKERS)]


def rows(batch) -> list:
    """Each worker's frames of a batch: ``[N, T]`` sync batches give N, an async batch 1."""
    return list(batch.unbind(0)) if batch.batch_dims == 2 else [batch]


def check_whole(batch, frames: int) -> set[int]:
    """Every row is one process's consecutive steps for the worker it claims; returns the pids."""
    pids = set()
    for row in rows(batch):
        assert row.shape == (frames,)
        obs = row["observation"]
        worker = int(row["collector", "worker_id"][0])
        assert (row["collector", "worker_id"] == worker).all()
        assert (obs[:, 2] == worker).all(), "a row holds another worker's frames"
        assert (obs[:, 0] == obs[0, 0]).all(), "a row mixes the frames of two processes"
        assert (obs[:, 1].diff() == 1).all(), "a row misses or repeats steps"
        assert (row["next", "observation"][:, 1] == obs[:, 1] + 1).all()
        pids.add(int(obs[0, 0]))
    return pids


class TrajectoryOwners:
    """Checks that no trajectory id is ever used by two workers or two processes."""

    def __init__(self) -> None:
        self.owner: dict[int, tuple[int, int]] = {}

    def add(self, batch) -> None:
        for row in rows(batch):
            key = (int(row["collector", "worker_id"][0]), int(row["observation"][0, 0]))
            for traj in row["collector", "traj_ids"].unique().tolist():
                assert self.owner.setdefault(traj, key) == key, f"trajectory id {traj} reused"


def kill_soon(pid: int, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, os.kill, (pid, 9))
    timer.start()
    return timer


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("size", [3, 400], ids=["rpc-batches", "shm-batches"])
def test_killed_workers_are_replaced_until_the_budget_is_spent(sync, size):
    frames = 40  # per worker and batch; 400 floats x 2 x 40 frames go through shared memory
    collector = MultiCollector(
        env_fns(size=size, step_s=0.004), Policy(), frames_per_batch=frames * (WORKERS if sync else 1),
        sync=sync, max_worker_restarts=RESTARTS, rpc_timeout=30, track_policy_version=True,
    )
    owners, versions, kills = TrajectoryOwners(), [], 0
    try:
        with pytest.warns(WorkerRestartWarning) as record:
            batches = iter(collector)
            for k in range(40):
                if k % 3 == 2:  # kill worker 1 while the trainer waits for a batch
                    if kills == RESTARTS:
                        break
                    kills += 1
                    kill_soon(collector.infos[1]["pid"], 0.05).join()
                batch = next(batches)
                check_whole(batch, frames)
                owners.add(batch)
                version = batch["collector", "policy_version"]
                if sync:
                    assert (version == collector.policy_version).all(), "a batch was collected with old weights"
                assert (version == version.reshape(-1)[0]).all() and int(version.reshape(-1)[0]) <= collector.policy_version
                versions.append(collector.policy_version)
                collector.update_policy_weights_()
        assert collector.worker_restarts == [0, RESTARTS, 0, 0]
        assert len(record) == RESTARTS
        for i, warning in enumerate(record):
            assert f"collector worker 1 died with exit code -9 (SIGKILL); replacing it ({RESTARTS - 1 - i} of " \
                   f"max_worker_restarts={RESTARTS} restarts left)" in str(warning.message)
        pid = collector.infos[1]["pid"]
        # the budget is spent: the next death is the usual WorkerError, and everything is shut down
        kill_soon(pid, 0.05).join()
        with pytest.raises(WorkerError, match=r"collector worker 1 \(rank \d+ on host .*died with exit code -9"):
            for _ in range(5):
                check_whole(next(batches), frames)
    finally:
        collector.shutdown()
    assert len(versions) >= 2 * RESTARTS


def test_an_env_that_raises_is_replaced_with_its_traceback_in_the_warning():
    collector = MultiCollector(
        env_fns(raise_at=130), Policy(), frames_per_batch=WORKERS * 50, max_worker_restarts=RESTARTS, rpc_timeout=30,
        track_policy_version=True,  # check_whole reads each frame's worker id
    )
    owners, yielded = TrajectoryOwners(), 0
    try:
        with pytest.warns(WorkerRestartWarning) as record, \
                pytest.raises(WorkerError, match="raised an error") as failure:
            for batch in collector:
                check_whole(batch, 50)
                owners.add(batch)
                yielded += 1
        assert "simulator crashed at step 130" in failure.value.remote_traceback
    finally:
        collector.shutdown()
    # every worker's env raises in its third batch: the first three failures are replaced
    assert len(record) == RESTARTS
    messages = [str(w.message) for w in record]
    assert all("raised an error: RuntimeError: simulator crashed at step 130" in m for m in messages), messages
    assert sum(collector.worker_restarts) == RESTARTS
    assert yielded == 2  # rounds 0-1 whole; round 2 fails on all four workers, one more than the budget


def test_a_hung_worker_is_killed_and_replaced(tmp_path):
    marker = str(tmp_path / "hung")
    collector = MultiCollector(
        env_fns(hang_at=30, marker=marker), Policy(), frames_per_batch=WORKERS * 20, max_worker_restarts=1,
        rpc_timeout=3, track_policy_version=True,
    )
    try:
        with pytest.warns(WorkerRestartWarning, match=r"did not answer within rpc_timeout=3.0 s; replacing it"):
            batches = iter(collector)
            pids = [check_whole(next(batches), 20) for _ in range(4)]
        assert os.path.exists(marker) and sum(collector.worker_restarts) == 1
        hung = [i for i, n in enumerate(collector.worker_restarts) if n]
        assert len(pids) == 4 and len(hung) == 1 and collector.infos[hung[0]]["pid"] in pids[-1]
    finally:
        collector.shutdown()


ACTIONS = 4


def acting(action: int) -> dict:
    """Weights of ``Policy(ACTIONS)`` that take ``action`` whatever the observation."""
    return {"linear.weight": torch.zeros(ACTIONS, 3), "linear.bias": nn.functional.one_hot(torch.tensor(action), ACTIONS).float()}


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_replacement_collects_with_the_weights_its_slot_was_given(sync, tmp_path):
    """Each worker gets weights of its own (TorchRL's ``{worker_id: weights}``), worker 2 twice; then
    worker 1's env crashes once. Every frame of every worker, its replacement's too, was chosen by
    the weights its slot was given under the version it carries: the replacement's are worker 1's
    at version 1, neither worker 2's nor the trainer's, nor stamped with a later version."""
    workers, frames = 3, 10
    marker = str(tmp_path / "crashed")
    fns = [lambda i=i: GymEnv(StampEnv(i, actions=ACTIONS, raise_at=45 if i == 1 else 0, marker=marker))
           for i in range(workers)]
    policy = Policy(ACTIONS)
    policy.load_state_dict(acting(0))
    collector = MultiCollector(fns, policy, frames_per_batch=frames * (workers if sync else 1), sync=sync,
                               max_worker_restarts=1, rpc_timeout=30, track_policy_version=True)
    given = {w: {0: 0} for w in range(workers)}  # worker -> {version: the action of the weights it was given}
    pushes = [{0: 1, 1: 2, 2: 3}, {2: 1}]  # after the first two batches: worker -> action
    first_pid, replaced = collector.infos[1]["pid"], 0
    try:
        with pytest.warns(WorkerRestartWarning, match="collector worker 1 raised an error"):
            batches = iter(collector)
            for k in range(200):
                batch = next(batches)
                check_whole(batch, frames)
                for row in rows(batch):
                    worker = int(row["collector", "worker_id"][0])
                    versions, actions = row["collector", "policy_version"].tolist(), row["action"].tolist()
                    for version, action in zip(versions, actions):
                        assert given[worker].get(version) == action, \
                            f"batch {k}: worker {worker} took action {action} at version {version}; given {given[worker]}"
                    if sync:  # a round is collected with the weights given last
                        assert versions == [max(given[worker])] * frames
                    replaced += frames if worker == 1 and int(row["observation"][0, 0]) != first_pid else 0
                if k < len(pushes):
                    collector.update_policy_weights_({w: acting(a) for w, a in pushes[k].items()})
                    for w, a in pushes[k].items():  # the version each worker acknowledged
                        given[w][collector.worker_policy_versions()[w]] = a
                if replaced >= 3 * frames:
                    break
        assert collector.worker_restarts == [0, 1, 0]
        assert replaced >= 3 * frames, "the replacement handed out too few frames: the test shows nothing"
    finally:
        collector.shutdown()


def test_debug_launcher_replaces_a_raising_collector():
    collector = RPCCollector(
        env_fns(raise_at=70), Policy(), frames_per_batch=WORKERS * 30, launcher="debug", max_worker_restarts=WORKERS,
        cat_results="stack",
    )
    try:
        with pytest.warns(WorkerRestartWarning):
            batches = iter(collector)
            for _ in range(4):  # the third batch of every env raises
                batch = next(batches)
                assert batch.shape == (WORKERS, 30)
                assert (batch["observation"][..., 2] == torch.arange(WORKERS)[:, None]).all()
        assert collector.worker_restarts == [1] * WORKERS
    finally:
        collector.shutdown()


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_worker_restarts=-1), "max_worker_restarts=-1 is invalid; accepted: an int >= 0"),
    (dict(max_worker_restarts=1.5), "max_worker_restarts=1.5 is invalid"),
    (dict(max_worker_restarts=2, launcher="torchrun"), "max_worker_restarts=2 needs a launcher that starts the workers"),
    (dict(max_worker_restarts=2, weight_transport="broadcast"), "needs the shared-memory weight transport"),
    (dict(max_worker_restarts=2, launcher="submitit", slurm_kwargs={"folder": "/tmp"}),
     "max_worker_restarts=2 with launcher='submitit' needs weight_transport='rpc'"),
])
def test_bad_restart_arguments_are_refused_before_any_process_starts(kwargs, message, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    before = descendants()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RPCCollector("CartPole-v1", None, num_collectors=2, frames_per_batch=20, launcher=kwargs.pop("launcher", "local"),
                     **kwargs)
    assert descendants() <= before
