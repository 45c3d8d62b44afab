"""Checks of the continuity invariant on batches of ``CountEnv`` (observation ``[t, episode, last action]``).

One env's frames in order (a batched collector's, told apart by ``"env_index"``): each starts where
the one before it ended, or at step 0 of the next episode (:func:`assert_env_steps_continue`).
Within one trajectory id, steps are consecutive: in the order the batches were handed out (and
along time within a batch), each step of an id continues the one before it (the same episode,
``t`` one higher), no step follows a done step, and no two rows of a batch share an id.
"""
from __future__ import annotations

import torch

TRAJ = ("collector", "traj_ids")


def rows(batch) -> list:
    """The ``[T]`` rows of a ``[T]``, ``[B, T]`` or ``[N, B, T]`` batch (time last)."""
    return list(batch.reshape(-1, batch.shape[-1]).unbind(0))


def gaps(batches: list) -> list[str]:
    """Where an id spans a gap in ``batches`` (in the order handed out); empty if none does."""
    last: dict[int, tuple[float, float, bool]] = {}  # id -> (t, episode, done) of its latest step
    found = []
    for n, batch in enumerate(batches):
        seen_in_batch: dict[int, int] = {}
        for r, row in enumerate(rows(batch)):
            ids, obs = row.get(TRAJ).tolist(), row.get("observation")
            done = row.get(("next", "done")).reshape(-1).tolist()
            for step, traj in enumerate(ids):
                if seen_in_batch.setdefault(traj, r) != r:
                    found.append(f"batch {n}: id {traj} in rows {seen_in_batch[traj]} and {r}")
                t, episode = float(obs[step, 0]), float(obs[step, 1])
                before = last.get(traj)
                if before is not None and (before[2] or (t, episode) != (before[0] + 1, before[1])):
                    found.append(f"batch {n} row {r} step {step}: id {traj} goes from (t, episode, done)="
                                 f"{before} to ({t}, {episode})")
                last[traj] = (t, episode, bool(done[step]))
    return found


def assert_no_gaps(batches: list) -> None:
    found = gaps(batches)
    assert not found, f"{len(found)} trajectory ids span a gap; the first: {found[:5]}"


def steps(batch) -> torch.Tensor:
    """Each row's ``[t, episode, last action]`` steps, ``[rows, T, 3]``."""
    return batch.get("observation").reshape(-1, batch.shape[-1], 3)


def assert_env_steps_continue(frames) -> None:
    """One env's frames, in order, with none missing: each frame starts where the one before it
    ended, or, after a done, at step 0 of the next episode."""
    going_on = ~frames["next", "done"][:-1, 0]
    assert torch.equal(frames["next", "observation"][:-1][going_on], frames["observation"][1:][going_on])
    restarted = frames["observation"][1:][~going_on]
    assert (restarted[:, 0] == 0).all()
    assert torch.equal(restarted[:, 1], frames["observation"][:-1][~going_on][:, 1] + 1)
