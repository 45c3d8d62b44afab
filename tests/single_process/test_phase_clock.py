"""The phase clock: each mark gives the time since the previous one to the phase it names."""
from __future__ import annotations

from collections import deque

import pytest

from conftest import CountEnv
from rpc_collectors import Collector
from rpc_collectors.single_process.phase_clock import PHASES, PhaseClock, StoppedClock


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
    assert sum(clock.totals_ns.values()) == clock.last_ns - start
    assert set(clock.totals_ns) == set(PHASES)


@pytest.mark.parametrize("env", [CountEnv, "CartPole-v1"], ids=["tensordict env", "gymnasium env"])
def test_a_collectors_rollout_times_one_policy_call_and_one_env_step_per_step(env):
    """The rollout's own sums and the spans of a window open all along agree, step for step."""
    collector = Collector(env, policy=None, frames_per_batch=5, total_frames=10)
    clock = collector.rollout.clock
    clock.spans = deque()
    for _ in collector:
        pass
    collector.shutdown()
    phases = [phase for phase, _, _ in clock.spans]
    assert phases == ["policy", "env"] * 10
    steps = list(clock.spans)
    assert all(begin <= end for _, begin, end in steps)
    assert all(steps[i][2] == steps[i + 1][1] for i in range(0, 20, 2))  # a step's env step follows its policy call
    for phase in ("policy", "env"):
        assert clock.totals_ns[phase] == sum(end - begin for name, begin, end in steps if name == phase) > 0


def test_a_stopped_clock_counts_nothing():
    collector = Collector(CountEnv, policy=None, frames_per_batch=5, total_frames=10, metrics=False)
    assert isinstance(collector.rollout.clock, StoppedClock)
    for _ in collector:
        pass
    collector.shutdown()
    assert set(collector.rollout.clock.totals_ns.values()) == {0}
