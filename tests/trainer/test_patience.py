"""How long the inference loop waits for envs in flight before a forward pass (``Patience``), on given times."""
from __future__ import annotations

import pytest

from rpc_collectors.trainer.patience import SHARE, Patience


def test_nothing_is_waited_for_before_a_pass_ran_or_an_env_answered():
    patience = Patience(2)
    assert patience.deadline(5.0) == 5.0  # no pass yet: no wait
    patience.passed(0.004)
    patience.went([0, 1], 5.0)
    assert not patience.due([True, True], patience.deadline(5.0))  # neither env answered yet: not due


def test_an_env_in_flight_that_answers_fast_is_waited_for_a_slow_one_is_not():
    patience = Patience(3)
    patience.passed(0.004)  # a forward pass of 4 ms: wait at most 1 ms
    patience.went([0, 1, 2], 10.0)
    patience.answered([0], 10.0002)  # env 0 answers 0.2 ms after its action
    patience.answered([1], 10.010)  # env 1 takes 10 ms
    patience.went([0, 1], 10.020)
    deadline = patience.deadline(10.0201)
    assert deadline == pytest.approx(10.0201 + SHARE * 0.004)
    assert patience.due([True, False, False], deadline)  # env 0: due 0.1 ms from now
    assert not patience.due([False, True, False], deadline)  # env 1: 10 ms away
    assert not patience.due([False, False, False], deadline)  # nothing in flight
    assert patience.due([False, True, False], patience.deadline(10.0295))  # env 1 about to answer


def test_the_times_are_moving_averages():
    patience = Patience(1)
    patience.passed(0.002)
    patience.passed(0.012)
    assert patience.forward == pytest.approx(0.003)  # one tenth of the newest time
    patience.went([0], 0.0)
    patience.answered([0], 0.001)
    patience.went([0], 1.0)
    patience.answered([0], 1.011)
    assert patience.answer[0] == pytest.approx(0.002)
