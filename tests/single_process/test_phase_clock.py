"""The phase clock: each mark gives the time since the previous one to the phase it names."""
from __future__ import annotations

from collections import deque

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector
from rpc_collectors.single_process import phase_clock, run_meter
from rpc_collectors.single_process.phase_clock import PHASES, SAMPLED, PhaseClock, StoppedClock


class StepTime:
    """A monotonic clock that moves only when an env steps (by ``ENV_NS``) or a policy is called (by
    ``POLICY_NS``); it counts its reads."""

    ENV_NS, POLICY_NS = 3, 1

    def __init__(self) -> None:
        self.ns = self.reads = 0

    def monotonic_ns(self) -> int:
        self.reads += 1
        return self.ns

    def monotonic(self) -> float:
        return self.ns / 1e9


class TimedEnv(CountEnv):
    """``CountEnv`` whose steps take ``StepTime.ENV_NS`` on ``clock``."""

    def __init__(self, clock: StepTime) -> None:
        super().__init__()
        self.clock = clock

    def step(self, action):
        self.clock.ns += StepTime.ENV_NS
        return super().step(action)


class TimedPolicy(nn.Module):
    """Action 0, in ``StepTime.POLICY_NS`` on ``clock``."""

    def __init__(self, clock: StepTime) -> None:
        super().__init__()
        self.clock = clock

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        self.clock.ns += StepTime.POLICY_NS
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


def test_marks_split_the_time_between_them_and_spans_are_kept_only_while_a_window_is_open():
    clock = PhaseClock()
    start = clock.last_ns
    clock.mark("policy")
    clock.mark("env")
    assert clock.spans is None
    clock.spans = deque(maxlen=2)
    clock.mark("env")
    clock.mark("write")
    clock.mark("idle")
    assert [phase for phase, _, _ in clock.spans] == ["write", "idle"]  # bounded: the oldest went
    assert all(begin <= end for _, begin, end in clock.spans)
    assert clock.spans[0][2] == clock.spans[1][1]  # back to back, one clock
    clock.count("idle", clock.last_ns + 5)  # the same phase goes on: its span grows
    assert [phase for phase, _, _ in clock.spans] == ["write", "idle"] and clock.spans[1][2] == clock.last_ns
    assert sum(clock.totals_ns.values()) == clock.last_ns - start
    assert set(clock.totals_ns) == set(PHASES)


@pytest.mark.parametrize("env", [CountEnv, "CartPole-v1"], ids=["tensordict env", "gymnasium env"])
def test_a_window_open_all_along_holds_every_nanosecond_a_collector_counts_in_spans_back_to_back(env):
    """One policy call and one env step per step, the batch's write after its last step and the wait
    before its first: each span begins at the clock read that ended the one before, and each phase's
    spans add up to its seconds in ``metrics()``."""
    collector = Collector(env, policy=None, frames_per_batch=5, total_frames=10)
    clock = collector.rollout.clock
    clock.spans = deque()
    for _ in collector:
        pass
    (worker,) = collector.metrics().workers
    collector.shutdown()
    spans = list(clock.spans)
    assert [phase for phase, _, _ in spans] == (["idle"] + ["policy", "env"] * 5 + ["write"]) * 2
    assert all(begin <= end for _, begin, end in spans)
    assert all(before[2] == after[1] for before, after in zip(spans, spans[1:]))  # one read ends a span, begins the next
    for phase in PHASES:
        assert getattr(worker, f"{phase}_s") == sum(end - begin for name, begin, end in spans if name == phase) / 1e9


@pytest.mark.parametrize("frames_per_batch", [1, 50, 1000])
def test_a_rollout_times_a_sample_of_its_steps_and_splits_its_time_exactly_when_steps_cost_the_same(
        monkeypatch, frames_per_batch):
    """Outside a trace window a rollout reads the clock around about one env step in ``SAMPLED``,
    and once at its end: every step here costs the same, so its env steps' and policy calls' totals
    are exact, batches of one step (none of them timed, most of the time) included."""
    clock = StepTime()
    monkeypatch.setattr(phase_clock, "time", clock)
    monkeypatch.setattr(run_meter, "time", clock)  # the collector's reads between its rollouts
    frames = 4000
    collector = Collector(lambda: TimedEnv(clock), TimedPolicy(clock), frames_per_batch=frames_per_batch,
                          total_frames=frames)
    for _ in collector:
        pass
    totals = collector.rollout.clock.totals_ns
    collector.shutdown()
    assert totals["env"] == StepTime.ENV_NS * frames
    assert totals["policy"] == StepTime.POLICY_NS * frames
    assert sum(totals.values()) == clock.ns  # all of it, the policy's probe before the first batch in "idle"
    batches = frames // frames_per_batch
    per_batch = 4  # the rollout's end, and the collector's run meter: a batch's start, arrival, hand-out
    assert clock.reads - per_batch * batches <= 2 * 2 * frames / SAMPLED  # two reads per timed step


def test_a_stopped_clock_counts_nothing():
    collector = Collector(CountEnv, policy=None, frames_per_batch=5, total_frames=10, metrics=False)
    assert isinstance(collector.rollout.clock, StoppedClock)
    for _ in collector:
        pass
    collector.shutdown()
    assert set(collector.rollout.clock.totals_ns.values()) == {0}
