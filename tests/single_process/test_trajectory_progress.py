"""stats()'s progress counters: frames of ended and of running trajectories, counted over batches."""
from __future__ import annotations

import pytest
import torch

from conftest import TDCountEnv
from rpc_collectors import Collector
from rpc_collectors.single_process.trajectory_progress import TrajectoryProgress

KEY = ("collector", "traj_ids")


def batches(n: int) -> list:
    """``n`` batches of 2 envs, [2, 7] each, whose episodes of 3, 5 and 2 steps end across batches."""
    with Collector(lambda: TDCountEnv(2), None, frames_per_batch=14, total_frames=-1) as c:
        it = iter(c)
        return [next(it).clone() for _ in range(n)]


def by_hand(batches: list) -> dict:
    """The counters, step by step: a trajectory's frames are completed at its done, pending until then."""
    running, completed, trajectories = {}, 0, 0
    for batch in batches:
        for row in batch.reshape(-1, batch.shape[-1]):
            for stream, done in zip(row[KEY].tolist(), row["next", "done"].reshape(-1).tolist()):
                running[stream] = running.get(stream, 0) + 1
                if done:
                    completed, trajectories = completed + running.pop(stream), trajectories + 1
    return {"trajectory_completed_frames": completed, "trajectory_pending_frames": sum(running.values()),
            "replay_written_frames": 0, "completed_trajectories": trajectories}


@pytest.mark.parametrize("queued", [1, 3, 64], ids=["each", "three", "all"])
def test_batches_counted_together_give_the_counts_of_each_step(queued, monkeypatch):
    """Batches are counted in runs (``queued`` at a time, or when a counter is read): the same counts
    as a count step by step, read after every batch or once at the end."""
    monkeypatch.setattr(TrajectoryProgress, "QUEUED", queued)
    given = batches(9)
    read_each, read_at_end = TrajectoryProgress(KEY), TrajectoryProgress(KEY)
    for i, batch in enumerate(given):
        read_each.add(batch)
        read_at_end.add(batch)
        assert read_each.counters() == by_hand(given[:i + 1])
    assert read_at_end.counters() == by_hand(given)
    assert by_hand(given)["completed_trajectories"] > 3  # episodes ended, in and across batches


def test_a_batch_changed_after_it_was_added_is_counted_as_it_was():
    """A batch's ids are kept by copy: what the user does to the batch afterwards changes no count."""
    given = batches(4)
    progress = TrajectoryProgress(KEY)
    for batch in given:
        progress.add(batch)
    expected = by_hand(given)
    for i, batch in enumerate(given):  # every step a trajectory of its own, none ended
        batch[KEY].copy_(torch.arange(batch.numel()).reshape(batch.shape) + 1000 * (i + 1))
        batch["next", "done"].fill_(False)
    assert progress.counters() == expected
    assert progress.state()["pending"] and sum(progress.state()["pending"].values()) == expected["trajectory_pending_frames"]
