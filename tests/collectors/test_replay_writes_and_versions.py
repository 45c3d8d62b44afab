"""What TorchRL's next release adds on its collectors, under the same names here:
``replay_write_mode``, the progress counters of ``stats()``, ``worker_policy_versions()`` and the
acknowledged ``policy_version`` (advances only when every worker acknowledged; None after a push
to some of them), against a single-process ``Collector`` on the deterministic count envs."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from conftest import CountEnv, TDCountEnv
from rpc_collectors import (
    AsyncBatchedCollector,
    Collector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RPCCollector,
)
from test_rpc_collector import BiasPolicy

pytestmark = pytest.mark.timeout(180)
TRAJ_IDS, DONE, VERSION = ("collector", "traj_ids"), ("next", "done"), ("collector", "policy_version")
KEYS = ["observation", "action", TRAJ_IDS, DONE, ("next", "observation")]


class ListBuffer:
    """A replay buffer that keeps what each ``extend()`` got."""

    def __init__(self) -> None:
        self.writes: list[TensorDict] = []

    def extend(self, td: TensorDict) -> None:
        self.writes.append(td.clone())


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def by_trajectory(frames: TensorDict) -> dict[int, TensorDict]:
    """``[T]`` frames split by trajectory id, each trajectory's frames in order."""
    ids = frames.get(TRAJ_IDS)
    return {int(i): frames[ids == i].select(*KEYS) for i in torch.unique(ids)}


def reference(make_env, frames_per_batch: int, total_frames: int) -> TensorDict:
    """The frames a single-process Collector hands out, flat ``[T]`` per env row, rows one after the other."""
    batches = list(Collector(make_env, BiasPolicy(1, 3), frames_per_batch=frames_per_batch, total_frames=total_frames))
    rows = [b.reshape(-1, b.shape[-1]) if b.batch_dims > 1 else b.unsqueeze(0) for b in batches]
    return torch.cat([r for batch in rows for r in batch.unbind(0)], 0)


@pytest.mark.parametrize("make_env", [count_env, lambda: TDCountEnv(num_envs=2)], ids=["single", "vector"])
def test_trajectory_mode_writes_exactly_the_completed_trajectories(make_env):
    rb = ListBuffer()
    c = Collector(make_env, BiasPolicy(1, 3), frames_per_batch=4, total_frames=40, replay_buffer=rb,
                  replay_write_mode="trajectory")
    assert list(c) == [None] * 10 and c.replay_write_mode == "trajectory"
    written = torch.cat(rb.writes, 0)
    assert written.batch_dims == 1, "trajectories are written flat"
    expected = {i: t for i, t in by_trajectory(reference(make_env, 4, 40)).items() if t.get(DONE)[-1].all()}
    got = by_trajectory(written)
    assert sorted(got) == sorted(expected), "exactly the trajectories that ended were written, each once"
    for i, traj in got.items():
        assert (traj == expected[i]).all(), f"trajectory {i} differs from the single-process collector's"
        assert not traj.get(DONE)[:-1].any() and traj.get(DONE)[-1].all()
    stats = c.stats()
    assert stats["replay_written_frames"] == written.numel() == stats["trajectory_completed_frames"]
    assert stats["completed_trajectories"] == len(expected)
    assert stats["trajectory_completed_frames"] + stats["trajectory_pending_frames"] == stats["frames"] == 40
    assert stats["stepped_frames"] == 40


def test_rollout_mode_writes_every_batch_and_the_counters_add_up():
    rb = ListBuffer()
    c = Collector(count_env, BiasPolicy(1, 3), frames_per_batch=4, total_frames=36, replay_buffer=rb)
    list(c)
    assert c.replay_write_mode == "rollout" and [len(w) for w in rb.writes] == [4] * 9
    frames = reference(count_env, 4, 36)
    ended = {i: t for i, t in by_trajectory(frames).items() if t.get(DONE)[-1].all()}
    stats = c.stats()
    assert stats["replay_written_frames"] == 36 and stats["completed_trajectories"] == len(ended)
    assert stats["trajectory_completed_frames"] == sum(t.numel() for t in ended.values())
    assert stats["trajectory_pending_frames"] == 36 - stats["trajectory_completed_frames"] > 0
    without = Collector(count_env, BiasPolicy(1, 3), frames_per_batch=4, total_frames=36)
    list(without)
    assert without.stats()["replay_written_frames"] == 0
    assert {k: v for k, v in without.stats().items() if k != "replay_written_frames"} == \
        {k: v for k, v in stats.items() if k != "replay_written_frames"}


def test_counters_survive_a_saved_state():
    c = Collector(count_env, BiasPolicy(1, 3), frames_per_batch=4, total_frames=40)
    for _ in range(3):
        c.next()
    resumed = Collector(count_env, BiasPolicy(1, 3), frames_per_batch=4, total_frames=40)
    resumed.load_state_dict(c.state_dict())
    keys = ("trajectory_completed_frames", "trajectory_pending_frames", "completed_trajectories", "stepped_frames")
    assert [resumed.stats()[k] for k in keys] == [c.stats()[k] for k in keys]


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_trajectory_mode_across_workers(cls):
    """Each worker steps the same deterministic env: every trajectory written is one the
    single-process collector collects (told by its episode number), whole and once."""
    episodes = {int(t["observation"][0, 1]): t for t in by_trajectory(reference(count_env, 4, 80)).values()}
    rb = ListBuffer()
    with cls([count_env] * 2, BiasPolicy(1, 3), frames_per_batch=8, total_frames=48, replay_buffer=rb,
             replay_write_mode="trajectory") as c:
        list(c)
        stats = c.stats()
    written = by_trajectory(torch.cat(rb.writes, 0))
    assert written and stats["replay_written_frames"] == sum(t.numel() for t in written.values())
    for traj in written.values():
        expected = episodes[int(traj["observation"][0, 1])]
        assert (traj.exclude(TRAJ_IDS) == expected.exclude(TRAJ_IDS)).all()
    assert stats["completed_trajectories"] == len(written)
    assert stats["trajectory_completed_frames"] + stats["trajectory_pending_frames"] == stats["frames"] == 48


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_acknowledged_policy_version(cls):
    """``policy_version`` is the version every worker acknowledged, None after a push to some;
    each frame still carries the version that chose its action, per worker."""
    policy = BiasPolicy(0, 3)
    with cls([count_env] * 2, policy, frames_per_batch=8, track_policy_version=True) as c:
        assert c.policy_version == 0 and c.worker_policy_versions() == [0, 0]
        c.update_policy_weights_(TensorDict.from_module(BiasPolicy(1, 3)), worker_ids=[0])
        assert c.policy_version is None and c.worker_policy_versions() == [1, 0]
        assert "policy_version" not in c.stats(), "no version every worker acknowledged"
        seen: dict[int, set] = {0: set(), 1: set()}
        while not all(seen.values()):
            batch = c.next()
            for worker, version, action in zip(batch["collector", "worker_id"].reshape(-1).tolist(),
                                               batch.get(VERSION).reshape(-1).tolist(), batch["action"].reshape(-1).tolist()):
                seen[worker].add((version, action))
        assert seen[1] == {(0, 0)} and (1, 1) in seen[0], "each frame names the weights that chose it"
        c.update_policy_weights_({1: TensorDict.from_module(BiasPolicy(1, 3))})  # TorchRL's per-worker form
        assert c.policy_version is None and c.worker_policy_versions() == [1, 2]
        c.update_policy_weights_()
        assert c.policy_version == 3 and c.worker_policy_versions() == [3, 3] and c.stats()["policy_version"] == 3


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_resumed_collector_reports_the_versions_its_workers_saved():
    with MultiSyncCollector([count_env] * 2, BiasPolicy(0, 3), frames_per_batch=8, track_policy_version=True) as c:
        c.next()
        c.update_policy_weights_()
        c.update_policy_weights_(TensorDict.from_module(BiasPolicy(1, 3)), worker_ids=[1])
        c.next()
        state = c.state_dict()
    with MultiSyncCollector([count_env] * 2, BiasPolicy(0, 3), frames_per_batch=8, track_policy_version=True) as resumed:
        resumed.load_state_dict(state)
        assert resumed.worker_policy_versions() == [1, 2] and resumed.policy_version is None
        assert [row.unique().tolist() for row in resumed.next().get(VERSION)] == [[1], [2]]
        resumed.update_policy_weights_()
        assert resumed.policy_version == 3 and resumed.worker_policy_versions() == [3, 3]


def test_single_process_collector_is_its_own_one_worker():
    c = Collector(count_env, BiasPolicy(0, 3), frames_per_batch=4)
    c.update_policy_weights_(TensorDict.from_module(BiasPolicy(1, 3)))
    assert c.policy_version == 1 and c.worker_policy_versions() == [1]


@pytest.mark.multiprocess
def test_async_batched_counts_by_env():
    with AsyncBatchedCollector([CountEnv] * 2, policy=BiasPolicy(1, 3), frames_per_batch=10, total_frames=60) as c:
        batches = list(c)
        stats = c.stats()
    ends = sum(int(b.get(DONE).sum()) for b in batches)
    assert stats["completed_trajectories"] == ends > 0
    assert stats["trajectory_completed_frames"] + stats["trajectory_pending_frames"] == stats["frames"] == 60
    assert c.worker_policy_versions() == [c.policy_version]


def test_bad_replay_write_mode_is_refused_before_anything_starts():
    started = []

    def env():
        started.append(1)
        return count_env()

    for cls in (Collector, MultiSyncCollector, MultiAsyncCollector, RPCCollector):
        fn = [env] * 2 if cls in (MultiSyncCollector, MultiAsyncCollector) else env
        with pytest.raises(ValueError, match=r"replay_write_mode='x' is invalid; accepted: None, 'rollout' or 'trajectory'"):
            cls(fn, None, frames_per_batch=4, replay_buffer=ListBuffer(), replay_write_mode="x")
        with pytest.raises(ValueError, match="replay_write_mode='trajectory' .*needs a replay_buffer"):
            cls(fn, None, frames_per_batch=4, replay_write_mode="trajectory")
        with pytest.raises(ValueError, match="replay_write_mode='rollout' with trajs_per_batch"):
            cls(fn, None, frames_per_batch=4, trajs_per_batch=2, replay_buffer=ListBuffer(), replay_write_mode="rollout")
    from rpc_collectors.distributed import RayCollector  # the ray extra: refused before Ray is started

    with pytest.raises(ValueError, match="replay_write_mode='x' is invalid"):
        RayCollector([env] * 2, None, frames_per_batch=4, replay_buffer=ListBuffer(), replay_write_mode="x")
    with pytest.raises(ValueError, match="preemptive_threshold=0.5 pads .*replay_write_mode='trajectory'"):
        MultiSyncCollector([env] * 2, None, frames_per_batch=4, replay_buffer=ListBuffer(), replay_write_mode="trajectory",
                           preemptive_threshold=0.5)
    with pytest.raises(ValueError, match="replay_write_mode='x' is invalid"):
        AsyncBatchedCollector([env] * 2, policy=BiasPolicy(1, 3), frames_per_batch=4, replay_write_mode="x")
    with pytest.raises(ValueError, match="AsyncBatchedCollector: replay_write_mode='trajectory' is not supported"):
        AsyncBatchedCollector([env] * 2, policy=BiasPolicy(1, 3), frames_per_batch=4, replay_buffer=ListBuffer(),
                              replay_write_mode="trajectory")
    assert not started, "an env was built before the argument was refused"


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_node_collectors_counters_are_the_trainers_count_of_its_batches(kind):
    """The counters are counted once, by the collector the user iterates (its nodes and their
    local workers keep none): they match the trajectories of the frames it handed out."""
    with RPCCollector(count_env, BiasPolicy(1, 3), num_collectors=2, launcher="local", collector_class=kind,
                      num_workers_per_collector=2, sync=kind == "sync", frames_per_batch=16, total_frames=96) as c:
        frames = torch.cat([b.reshape(-1) for b in c], 0)
        stats = c.stats()
    trajectories = by_trajectory(frames)
    ended = [t for t in trajectories.values() if t.get(DONE).any()]
    assert ended and len(ended) < len(trajectories)
    assert stats["completed_trajectories"] == int(frames.get(DONE).sum()) == len(ended)
    assert stats["trajectory_completed_frames"] == sum(t.numel() for t in ended)
    assert stats["trajectory_pending_frames"] == frames.numel() - stats["trajectory_completed_frames"]
