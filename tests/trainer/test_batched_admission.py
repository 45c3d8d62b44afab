"""``max_policy_lag`` of a batched-inference collector (:mod:`rpc_collectors.trainer.batched_admission`),
as a property of a model of its inference loop.

The model keeps what the loop's :class:`~rpc_collectors.trainer.transitions.Transitions` keeps
that the rule reads: each env's held transition and its action in flight (as the versions that
chose them), the transitions due (an answered env's previous one, placed with the loop's next
pass), the batch being filled, the full batches waiting (the loop waits while ``prefetch`` of them
do). Envs answer in any order hypothesis picks; the trainer takes a batch, trains, and then
updates the weights or not, as its loop does. The loop runs the collector's rule
(:func:`admitted`, else :func:`unstalled`). Whatever the order: every batch handed out is within
the bound, no act is forced, and the run never stalls while ``num_envs <= max_policy_lag *
frames_per_batch`` (what the collector accepts); one env more can stall the rule.
"""
from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from rpc_collectors.trainer.batched_admission import Pacing, Snapshot, admitted, by_urgency, unstalled


class Loop:
    """The loop's transitions and the trainer, as versions."""

    def __init__(self, envs: int, frames_per_batch: int, bound: int, prefetch: int,
                 updates: int = 1) -> None:
        self.version, self.frames_per_batch, self.prefetch = 0, frames_per_batch, prefetch
        # acts unstalled() chose
        self.updates, self.forced = updates, 0
        self.pacing = Pacing(bound, lambda: self.version)
        self.held: list[int | None] = [None] * envs
        self.flight: list[int | None] = [None] * envs
        self.ready = list(range(envs))
        self.batch: list[int] = []
        self.batches_filled, self.due_versions = 0, []
        self.full: deque = deque()
        self.lags: list[int] = []
        self.training = False

    # what batched_admission reads of Transitions
    @property
    def room(self) -> int:
        return self.frames_per_batch - len(self.batch)

    @property
    def due(self) -> int:
        return len(self.due_versions)

    def held_version(self, env: int) -> int | None:
        return self.held[env]

    def staged_version(self, env: int) -> int:
        return self.flight[env]

    # the loop
    @property
    def blocked(self) -> bool:
        """The loop waits to queue a full batch."""
        return len(self.full) > self.prefetch

    def answer(self, env: int) -> None:
        if self.held[env] is not None:
            self.due_versions.append(self.held[env])
        self.held[env], self.flight[env] = self.flight[env], None
        self.ready.append(env)

    def act(self, fallback: bool) -> None:
        """A pass of the loop: the envs :func:`admitted` (else, with ``fallback``, those
        :func:`unstalled` forces), then the due transitions into the batch (as ``stage`` or
        ``release`` places them), then the acts."""
        acting = [version is not None for version in self.flight]
        args = (self, acting, self.ready, self.pacing)
        chosen = admitted(*args)
        if not chosen and fallback:
            chosen = unstalled(*args)
            self.forced += len(chosen)
        for version in self.due_versions:
            self.batch.append(version)
            if len(self.batch) == self.frames_per_batch:
                self.full.append(self.batch)
                self.batch, self.batches_filled = [], self.batches_filled + 1
        self.due_versions = []
        for env in chosen:
            self.flight[env] = self.version
        self.ready = [env for env in self.ready if env not in chosen]

    # the trainer
    def take(self) -> None:
        batch = self.full.popleft()
        self.lags.append(self.version - min(batch))
        self.pacing.taken()
        self.training = True

    def trained(self, update: bool) -> None:
        for _ in range(self.updates if update else 0):
            self.version += 1
            self.pacing.updated()
        self.pacing.asked()
        self.training = False

    def events(self) -> list[tuple[str, int]]:
        """What may happen next."""
        events = [] if self.blocked else [("answer", env) for env, v in enumerate(self.flight)
                                          if v is not None]
        if self.training:
            events += [("trained", 0), ("trained", 1)]
        elif self.full:
            events.append(("take", 0))
        return events

    def play(self, pick, batches: int, fallback: bool = True) -> bool:
        """Play until ``batches`` were taken (True) or nothing can happen (False: a stall); the
        loop acts as the collector's does, or without its fallback."""
        self.pacing.asked()
        self.act(fallback)
        while len(self.lags) < batches:
            events = self.events()
            if not events:
                return False
            kind, arg = pick(events)
            if kind == "answer":
                self.answer(arg)
            elif kind == "take":
                self.take()
            else:
                self.trained(bool(arg))
            if not self.blocked:
                self.act(fallback)
        return True


@settings(max_examples=300, deadline=None)
@given(frames=st.integers(1, 6), bound=st.integers(1, 3), prefetch=st.integers(1, 2),
       spare=st.integers(0, 5), data=st.data())
def test_batches_stay_within_the_bound_and_the_run_never_stalls(frames, bound, prefetch, spare,
                                                                 data):
    envs = max(1, bound * frames - spare)
    loop = Loop(envs, frames, bound, prefetch)
    assert loop.play(lambda events: data.draw(st.sampled_from(events)), batches=12), \
        f"{envs} envs, frames_per_batch={frames}, max_policy_lag={bound}: the loop stalled"
    assert max(loop.lags) <= bound, loop.lags
    assert loop.forced == 0, "the loop forced an act though every update followed a batch"


def test_one_env_beyond_the_accepted_count_can_stall_the_rule():
    """The limit the collector refuses beyond is the rule's own: with one env more, some order of
    answers leaves every env holding a transition that no admitted act may release."""
    for frames, bound in [(1, 1), (2, 1), (3, 2), (4, 2)]:
        stalled = 0
        for seed in range(200):
            rng = random.Random(seed)
            loop = Loop(bound * frames + 1, frames, bound, prefetch=1)
            stalled += not loop.play(rng.choice, batches=12, fallback=False)
        assert stalled, f"frames_per_batch={frames}, max_policy_lag={bound}: never stalled"


@settings(max_examples=100, deadline=None)
@given(frames=st.integers(1, 6), bound=st.integers(1, 3), updates=st.integers(2, 4), data=st.data())
def test_updates_faster_than_batches_break_the_bound_but_never_stall_the_loop(frames, bound,
                                                                             updates, data):
    """The premise fails (several updates per batch): the loop acts for the most urgent env
    where it would wait with nothing in flight for a trainer waiting for a batch."""
    loop = Loop(bound * frames, frames, bound, prefetch=1, updates=updates)
    assert loop.play(lambda events: data.draw(st.sampled_from(events)), batches=12)


def one_by_one(snapshot: Snapshot, candidates: list, new_slack: int) -> list[int]:
    """The rule's acts as its definition takes them: each candidate, most urgent first, if the
    invariant holds with it and the acts before it."""
    chosen = []
    for env, slack in by_urgency(candidates):
        releases = sorted(snapshot.releases + ([] if slack is None else [slack]))
        controlled = list(snapshot.controlled)
        if slack is not None:
            controlled.remove(slack)
        trial = Snapshot(snapshot.room, snapshot.frames_per_batch, snapshot.due, releases,
                         sorted(controlled + [new_slack]))
        if trial.holds():
            snapshot, chosen = trial, chosen + [env]
    return chosen


@settings(max_examples=500, deadline=None)
@given(frames=st.integers(1, 8), data=st.data())
def test_admit_takes_the_acts_its_definition_takes(frames, data):
    """``Snapshot.admit``'s shortcuts (all at once, a stop at the top) choose what taking each
    candidate in turn chooses."""
    new_slack = data.draw(st.integers(0, 4))
    slacks = st.integers(-1, new_slack)
    held = data.draw(st.lists(slacks, max_size=12))
    acted = data.draw(st.lists(slacks, max_size=6))
    releases = data.draw(st.lists(slacks, max_size=6))
    spare = data.draw(st.lists(st.booleans(), min_size=4, max_size=4))  # ready envs holding nothing
    snapshot = Snapshot(data.draw(st.integers(1, frames)), frames, data.draw(st.integers(0, 3)),
                        sorted(releases), sorted(held + acted))
    candidates = [(env, slack) for env, slack in enumerate(held)]
    candidates += [(len(held) + i, None) for i, ready in enumerate(spare) if ready]
    want = one_by_one(snapshot, candidates, new_slack)
    assert snapshot.admit(candidates, new_slack) == want
