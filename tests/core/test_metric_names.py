"""``Metrics.scalars()`` with evaluations: for any ``log_prefix`` an ``Evaluator`` given a collector as
``metrics=`` accepts (``shadows`` is False), the evaluation's numbers keep their names and values and
no number of the run's own changes."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from rpc_collectors.core.metrics import (
    TAKEN,
    DataPlaneMetrics,
    EvaluationMetrics,
    InferenceMetrics,
    LagMetrics,
    Metrics,
    PushMetrics,
    RosterMetrics,
    RoundMetrics,
    WorkerMetrics,
    shadows,
)

# parts of a prefix: the run's own group names, a worker id below them, others
PARTS = st.sampled_from(["workers", "lag", "inference", "frames", "3", "eval", ""])
PREFIXES = st.lists(PARTS, min_size=1, max_size=3).map("/".join)
# the metric names an evaluation may carry (metrics_fn's are any), some of them run fields' names
NAMES = st.sampled_from(["reward", "step", "policy_version", "frames", "pid", "max", "env_s",
                         "results", "3/frames", "passes"])


def run_metrics(evaluations: tuple[EvaluationMetrics, ...]) -> Metrics:
    worker = WorkerMetrics(3, 123, 40, 4, 10.0, 1.0, 0.1, 0.2, 0.3, 0.4, 41)
    return Metrics(4.0, 40, 10.0, RoundMetrics(4, 1.0, 2.0), LagMetrics(0, 0.5, 1, 1),
                   RosterMetrics(), PushMetrics(2, 80), DataPlaneMetrics(800, 200.0), (worker,),
                   InferenceMetrics(5, 40, 8.0), evaluations=evaluations)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(PREFIXES.filter(lambda p: not shadows(p)),
                          st.dictionaries(NAMES, st.floats(allow_nan=False), max_size=5),
                          st.integers(1, 100)), max_size=3,
                # evaluators whose prefixes begin alike ("a", "a/b") may share names
                unique_by=lambda each: each[0].split("/", 1)[0]))
def test_an_accepted_prefix_never_takes_a_name_of_the_runs_numbers(groups):
    evaluations = tuple(EvaluationMetrics(prefix, count, {f"{prefix}/{n}": v for n, v in values.items()})
                        for prefix, values, count in groups)
    own = run_metrics(()).scalars()
    scalars = run_metrics(evaluations).scalars()
    assert {name: scalars[name] for name in own} == own
    for evaluation in evaluations:
        assert scalars[f"{evaluation.prefix}/results"] == evaluation.results
        kept = {name: value for name, value in evaluation.last.items()
                if name != f"{evaluation.prefix}/results"}
        assert {name: scalars[name] for name in kept} == kept


def test_every_group_and_field_of_the_run_is_a_taken_prefix():
    fields = {field.name for field in dataclasses.fields(Metrics)} - {"evaluations"}
    assert fields == set(TAKEN)
