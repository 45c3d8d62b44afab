"""Resuming a collector from ``state_dict()`` (with real worker processes for the multi-worker
ones): what a training run that checkpoints and restarts relies on.

Trajectory ids stay unique across the save and the resume, also when workers were replaced
before the save (``max_worker_restarts``); the trainer's policy gets the saved weights, as
TorchRL's collectors load them.
"""
from __future__ import annotations

import json
import os
import signal
import warnings

import gymnasium as gym
import pytest
import torch
from torch import nn

from conftest import CountEnv, FixedAction
from procs import wait_gone
from rpc_collectors import Collector, GymEnv, MultiCollector, RPCCollector, RunCheckpoint, WorkerRestartWarning

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

TRAJ = ("collector", "traj_ids")


def count_env() -> GymEnv:
    return GymEnv(CountEnv())  # episodes of 3, 5 and 2 steps: many trajectories per batch


def collector(kind: str) -> MultiCollector:
    """Two workers (``"workers"``) or two nodes of two local workers each (``"nodes"``)."""
    args = dict(frames_per_batch=40, max_worker_restarts=1, rpc_timeout=30, cat_results="stack")
    if kind == "workers":
        return MultiCollector([count_env] * 2, None, **args)
    return RPCCollector(count_env, None, num_collectors=2, launcher="local", collector_class="sync",
                        num_workers_per_collector=2, **args)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    assert not wait_gone({pid}, 10)


def ids(batches: list) -> set[int]:
    return set(torch.cat([b[TRAJ].flatten() for b in batches]).tolist())


@pytest.mark.parametrize("kind", ["workers", "nodes"])
def test_resume_after_a_replacement_never_reuses_a_trajectory_id(kind):
    """A replaced worker hands out ids above its predecessor's; the saved state must keep that
    start, or the resumed worker hands out the predecessor's ids again. Nodes replace their
    own local workers (the warning shows on the node's stderr)."""
    first = collector(kind)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerRestartWarning)
            batches = [first.next().clone() for _ in range(6)]  # the first process of worker 1 goes far
            kill(first.infos[1]["pid"] if kind == "workers" else first.infos[1]["local_pids"][1])
            batches += [first.next().clone() for _ in range(2)]  # its replacement only starts
        assert kind == "nodes" or first.worker_restarts == [0, 1]
        state = first.state_dict()
    finally:
        first.shutdown()
    before = ids(batches)
    second = collector(kind)
    try:
        second.load_state_dict(state)
        after = ids([second.next().clone() for _ in range(6)])
    finally:
        second.shutdown()
    reused = sorted(before & after)
    assert not reused, f"{len(reused)} trajectory ids of the saved run came back after the resume: {reused[:10]}"


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


@pytest.mark.parametrize("kind", ["MultiCollector", "RPCCollector-debug"])
def test_load_state_dict_gives_the_trainers_policy_the_saved_weights(kind):
    """As TorchRL's collectors: after ``load_state_dict`` the trainer's module holds the saved
    weights, so the training loop goes on from them and its next push keeps the workers on them."""
    def make(policy: nn.Module) -> MultiCollector:
        if kind == "MultiCollector":
            return MultiCollector([cartpole] * 2, policy, frames_per_batch=40, rpc_timeout=30)
        return RPCCollector([cartpole] * 2, policy, frames_per_batch=40, launcher="debug")

    trained = FixedAction(0)
    with make(trained) as first:
        first.next()
        trained.load_state_dict(FixedAction(1).state_dict())  # a training step
        first.update_policy_weights_()
        assert (first.next()["action"] == 1).all()
        state = first.state_dict()
    fresh = FixedAction(0)
    with make(fresh) as second:
        second.load_state_dict(state)
        for name, value in trained.state_dict().items():
            assert torch.equal(fresh.state_dict()[name], value), f"the trainer's policy kept its own {name}"
        assert (second.next()["action"] == 1).all()
        second.update_policy_weights_()  # the training loop's next push
        assert (second.next()["action"] == 1).all()


def test_restarts_spent_and_seed_sequences_carry_over_a_resume():
    """A resumed run has the restart budget the saved one had left, and its seeded workers do not
    replay the saved run's first episodes: they draw new seeds from their seed sequences."""
    def make() -> MultiCollector:
        return MultiCollector([count_env] * 2, None, frames_per_batch=40, max_worker_restarts=2, rpc_timeout=30,
                              cat_results="stack")

    first = make()
    try:
        first.set_seed(5)
        opening = first.next()["action"].clone()  # random actions, from the seeded action spaces
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerRestartWarning)
            kill(first.infos[1]["pid"])
            first.next()
        state = first.state_dict()
    finally:
        first.shutdown()
    assert state["restarts"]["counts"] == [0, 1]
    second = make()
    try:
        second.set_seed(5)
        second.load_state_dict(state)
        assert second.worker_restarts == [0, 1] and second.roster.left == 1
        assert not torch.equal(second.next()["action"], opening), "the resumed workers replayed the run's first actions"
    finally:
        second.shutdown()


def test_the_weight_update_cadence_carries_over_a_resume():
    def make() -> MultiCollector:
        return RPCCollector([cartpole] * 2, FixedAction(0), frames_per_batch=40, launcher="debug",
                            max_weight_update_interval=5)

    with make() as first:
        for _ in range(3):
            first.next()
        state = first.state_dict()
    assert state["since_update"] == [3, 3]
    with make() as second:
        second.load_state_dict(state)
        assert [record.batches_since_push for record in second.roster] == [3, 3]


def make_resumable(kind: str, total_frames: int = -1):
    """A collector of CountEnv: one process (a vector env of 2), two worker processes, two debug workers, or
    two nodes of two local workers each."""
    if kind == "Collector":
        return Collector(lambda: GymEnv(gym.vector.SyncVectorEnv([CountEnv] * 2)), None, frames_per_batch=40,
                         total_frames=total_frames)
    if kind == "MultiCollector":
        return MultiCollector([count_env] * 2, None, frames_per_batch=40, total_frames=total_frames, rpc_timeout=30,
                              cat_results="stack")
    if kind == "nodes":
        return RPCCollector(count_env, None, num_collectors=2, launcher="local", collector_class="sync",
                            num_workers_per_collector=2, frames_per_batch=40, total_frames=total_frames,
                            rpc_timeout=30, cat_results="stack")
    return RPCCollector([count_env] * 2, None, frames_per_batch=40, total_frames=total_frames, launcher="debug",
                        cat_results="stack")


@pytest.mark.parametrize("kind", ["Collector", "MultiCollector", "RPCCollector-debug", "nodes"])
def test_after_a_resume_every_env_starts_a_new_trajectory_and_no_frame_is_collected_twice(kind):
    """What the guide promises a PPO loop: the trajectory in progress at the save ends at the last
    step delivered before it (not done: a value estimator bootstraps there, as at every batch end);
    the first batch after the resume starts every env from a reset, with ids the saved run never
    used; frames and the frame budget continue from the save."""
    with make_resumable(kind, total_frames=200) as first:
        batches = [first.next().clone() for _ in range(3)]
        state = first.state_dict()
    assert not batches[-1]["next", "done"][..., -1].all(), "no trajectory was in progress at the save"
    with make_resumable(kind, total_frames=200) as second:
        second.load_state_dict(state)
        after = [batch.clone() for batch in second]
    assert sum(b.numel() for b in batches + after) == 200
    first_steps = after[0]["observation"][..., 0, :]  # every env's first step: [t, episode, last action]
    assert (first_steps[..., 0] == 0).all() and (first_steps[..., 2] == -1).all(), "an env did not start from a reset"
    reused = sorted(ids(batches) & ids(after))
    assert not reused, f"trajectory ids of the saved run continued after the resume: {reused}"


def test_a_resumed_single_process_collector_does_not_replay_its_seeded_episodes():
    def make() -> Collector:
        return Collector(count_env, None, frames_per_batch=40)

    with make() as first:
        first.set_seed(5)
        opening = first.next()["action"].clone()  # random actions, from the seeded action space
        state = first.state_dict()
    with make() as again:
        again.set_seed(5)
        assert torch.equal(again.next()["action"], opening), "the seed does not make the run repeat"
    with make() as resumed:
        resumed.set_seed(5)
        resumed.load_state_dict(state)
        assert not torch.equal(resumed.next()["action"], opening), "the resumed run replayed its first actions"
        assert resumed.state_dict()["resumes"] == 1


@pytest.mark.parametrize("kind", ["workers", "nodes"])
def test_run_json_counts_no_undelivered_frames_of_a_sync_run_after_a_replacement_and_a_resume(kind, tmp_path):
    """A sync run asks for no batch beyond the round it hands out: ``undelivered_frames`` is 0 in
    ``run.json``, also for nodes, after a worker was replaced (its lost batch was never counted)
    and after a resume."""
    def undelivered(ckpt: RunCheckpoint) -> int:
        ckpt.save()
        return json.loads(ckpt.record_path.read_text())["allocations"][-1]["undelivered_frames"]

    first = collector(kind)
    try:
        ckpt = RunCheckpoint(tmp_path, collector=first)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WorkerRestartWarning)
            [first.next() for _ in range(3)]
            assert undelivered(ckpt) == 0
            kill(first.infos[1]["pid"] if kind == "workers" else first.infos[1]["local_pids"][1])
            [first.next() for _ in range(2)]
        assert undelivered(ckpt) == 0
    finally:
        first.shutdown()
    second = collector(kind)
    try:
        resumed = RunCheckpoint(tmp_path, collector=second)
        resumed.resume()
        [second.next() for _ in range(2)]
        assert undelivered(resumed) == 0
    finally:
        second.shutdown()
