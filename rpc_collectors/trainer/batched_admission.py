"""``max_policy_lag`` for a batched-inference collector (``AsyncBatchedCollector``): the inference
loop acts for an env only if every transition not yet in a batch can still join one that is
handed out within the bound, so no batch falls behind and none is dropped.

The premise is :mod:`rpc_collectors.trainer.admission`'s: the trainer updates the weights at most
once per batch it takes (its loop: take a batch, train, ``update_policy_weights_``). So with ``V``
the version now, ``H`` the batches taken, and ``owed`` 1 between a take and the update or the
next request that follows it (0 otherwise), batch ``n`` (counted from 0, ``n >= H``) is handed out
at version ``V + (n - H) + owed`` at most. A transition acted for with version ``w`` is within
the bound in batch ``n`` while ``n <= w - floor + C``, ``C`` the batch being filled, where

    floor = V + owed - H + C - max_policy_lag

is the same for every transition; ``slack = w - floor`` counts the batches after ``C`` it may still
join. A take and the update after it leave ``floor`` as it is; a request with no update since the
take lowers it; only a batch filled raises it, by one.

A transition does not join a batch when its step completes: it is held until its env's next step
completes (so a cut can mark it truncated, :mod:`~rpc_collectors.trainer.transitions`), then it is
due and joins the batch being filled. So the loop decides who joins when by whom it acts for.
With ``room`` the places left in batch ``C`` and ``F`` the frames per batch, the ``p``-th place
from now is in batch ``C + ceil((p - room) / F)``, and the places go, at worst, first to the
transitions ``due`` (each within the bound when its act was admitted), then to the ``releases``
(the held transitions of envs in flight: each joins at its env's answer, in any order), then to
the ``controlled`` ones (held transitions of envs not in flight, and the transitions of the
actions in flight, held once their envs answer), which join only after acts the loop chooses, so
the most urgent first. :class:`Snapshot` keeps

    due + releases <= room + min(slack of a release) * F
    due + releases + controlled(slack <= j) <= room + j * F    for every controlled slack j

An act moves its env's held transition into ``releases`` and adds one ``controlled`` of slack
``V - floor``; :meth:`Snapshot.admit` takes the acts that keep the invariant, the most urgent
first, and the loop holds the others until a step, a take or an update changes the figures.
Invariant, owned here: every transition joins a batch within the bound, if the premise holds.
``max_policy_lag`` 0 is refused: a batch's last transitions would wait for acts that could not be
admitted. Where the premise fails (updates faster than batches) and the loop would wait with
nothing in flight for a trainer that waits for a batch the due transitions do not complete,
:func:`unstalled` acts for the most urgent env: the batch is beyond the bound, and
:meth:`Pacing.check` warns of it.

Liveness: an env not in flight still holds a transition, which only an act for it releases, and
that act adds one. With all ``N`` envs answered, holding ``N`` transitions, and the trainer waiting
(``floor = V - K``, a new act's slack ``K``), an act is admitted while ``N + 1 <= room + K * F``,
so the loop can always act if ``N <= K * F`` (``room >= 1``); with ``N = K * F + 1`` it stalls once
the batch's room is down to 1 with every env answered. So ``num_envs > max_policy_lag *
frames_per_batch`` is refused (:func:`~rpc_collectors.core.batched_args.policy_lag`).
"""
from __future__ import annotations

import bisect
import collections
import threading
from dataclasses import dataclass, field
from typing import Callable

from rpc_collectors.core import user_warnings
from rpc_collectors.single_process.batch_record import BatchRecord
from rpc_collectors.trainer.transitions import Transitions


class Pacing:
    """The trainer's side of the bound: ``H`` (:meth:`taken`), ``owed`` (:meth:`taken`,
    :meth:`asked`, :meth:`updated`) and the version, read by ``version``."""

    def __init__(self, bound: int, version: Callable[[], int]) -> None:
        self.bound, self.version = bound, version
        self._lock = threading.Lock()
        self._taken, self._owed = 0, 0

    def asked(self) -> None:
        """The trainer asks for its next batch: no update comes before it is taken."""
        with self._lock:
            self._owed = 0

    def taken(self) -> None:
        with self._lock:
            self._taken, self._owed = self._taken + 1, 1

    def updated(self) -> None:
        """The weights were updated (``version`` already counts it)."""
        with self._lock:
            self._owed = 0

    def check(self, record: BatchRecord) -> None:
        """Warn if the batch of ``record``, just handed out, is beyond the bound: the weights were
        updated more than once since the batch before it."""
        if record.lag > self.bound:
            user_warnings.warn(
                f"AsyncBatchedCollector: batch {record.iteration} is {record.lag} weight versions "
                f"behind, beyond max_policy_lag={self.bound}: the weights were updated more than "
                "once since the batch before it, and the bound holds for at most one update per "
                "batch", RuntimeWarning)

    def awaiting(self, filling: int) -> bool:
        """Whether no update is owed and every batch filled before ``filling`` was taken: only a
        batch filled changes the figures then."""
        with self._lock:
            return self._owed == 0 and self._taken == filling

    def figures(self, filling: int) -> tuple[int, int]:
        """``floor`` with batch ``filling`` being filled (see the module docstring), and the
        version now."""
        with self._lock:
            version = self.version()
            return version + self._owed - self._taken + filling - self.bound, version


@dataclass
class Snapshot:
    """The loop's transitions not in a batch yet, as slacks (see the module docstring)."""

    room: int
    frames_per_batch: int
    due: int
    # sorted slacks of the held transitions of envs in flight; of the held transitions of envs
    # not in flight and the actions in flight
    releases: list[int] = field(default_factory=list)
    controlled: list[int] = field(default_factory=list)

    def holds(self) -> bool:
        """Whether every release, and every controlled transition, finds a place in time."""
        first, room, frames = self.due + len(self.releases), self.room, self.frames_per_batch
        if self.releases and first > room + self.releases[0] * frames:
            return False
        return all(first + k + 1 <= room + j * frames for k, j in enumerate(self.controlled))

    def admit(self, candidates: list[tuple[int, int | None]], new_slack: int) -> list[int]:
        """Of ``candidates`` (env, the slack of its held transition or None), the envs acted for
        now, each with a transition of ``new_slack`` (no slack is larger): the most urgent first,
        each only if the invariant holds with it (the figures updated with the acts taken).

        All of them at once where that holds (then each of them in turn does); else one by one,
        up to the first act beyond the top: ``due + releases + controlled`` places within
        ``new_slack`` batches, which every later act would need one more of."""
        ordered = by_urgency(candidates)
        moved = [slack for _, slack in ordered if slack is not None]
        whole = Snapshot(self.room, self.frames_per_batch, self.due,
                         sorted(self.releases + moved),
                         _without(self.controlled, moved) + [new_slack] * len(ordered))
        if whole.holds():
            self.releases, self.controlled = whole.releases, whole.controlled
            return [env for env, _ in ordered]
        chosen, top = [], self.room + new_slack * self.frames_per_batch
        for env, slack in ordered:
            if self.due + len(self.releases) + len(self.controlled) + 1 > top:
                break
            if slack is not None:
                self.controlled.remove(slack)
                bisect.insort(self.releases, slack)
            bisect.insort(self.controlled, new_slack)
            if self.holds():
                chosen.append(env)
                continue
            self.controlled.remove(new_slack)
            if slack is not None:
                self.releases.remove(slack)
                bisect.insort(self.controlled, slack)
        return chosen


def _without(values: list[int], gone: list[int]) -> list[int]:
    """Sorted ``values`` less one occurrence of each of ``gone``."""
    left = collections.Counter(gone)
    kept = []
    for value in values:
        if left[value]:
            left[value] -= 1
        else:
            kept.append(value)
    return kept


def by_urgency(candidates: list[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
    """``candidates`` (env, the slack of its held transition or None), those that hold one first,
    the smallest slack first."""
    return sorted(candidates, key=lambda c: (c[1] is None, c[1] or 0, c[0]))


def snapshot(transitions: Transitions, acting: list[bool], floor: int) -> Snapshot:
    """The :class:`Snapshot` of ``transitions`` with the envs ``acting`` (an action in flight),
    as slacks over ``floor``."""
    releases, controlled = [], []
    for env, in_flight in enumerate(acting):
        version = transitions.held_version(env)
        if version is not None:
            (releases if in_flight else controlled).append(version - floor)
        if in_flight:
            controlled.append(transitions.staged_version(env) - floor)
    return Snapshot(transitions.room, transitions.frames_per_batch, transitions.due,
                    sorted(releases), sorted(controlled))


def admitted(transitions: Transitions, acting: list[bool], ready: list[int],
             pacing: Pacing) -> list[int]:
    """Of the ``ready`` envs (answered, no action in flight), those the loop acts for now."""
    floor, version = pacing.figures(transitions.batches_filled)
    return snapshot(transitions, acting, floor).admit(_candidates(transitions, ready, floor),
                                                       version - floor)


def unstalled(transitions: Transitions, acting: list[bool], ready: list[int],
              pacing: Pacing) -> list[int]:
    """Where :func:`admitted` chose none, nothing is in flight and the trainer waits for a batch
    that the due transitions do not complete (which only the premise's failure leads to): the
    most urgent ready env; else none."""
    frames = transitions.frames_per_batch
    filling = transitions.batches_filled + (frames - transitions.room + transitions.due) // frames
    if any(acting) or not ready or not pacing.awaiting(filling):
        return []
    floor, _ = pacing.figures(transitions.batches_filled)
    return [by_urgency(_candidates(transitions, ready, floor))[0][0]]


def _candidates(transitions: Transitions, ready: list[int], floor: int) -> list:
    return [(env, None if (held := transitions.held_version(env)) is None else held - floor)
            for env in ready]
