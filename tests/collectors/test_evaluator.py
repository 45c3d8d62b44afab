"""``Evaluator``: TorchRL 0.14.1's evaluator on this library's collectors, checked on envs whose
episodes are known.

``CountEnv`` (tests/conftest.py) runs episodes of 3, 5 and 2 steps in turn, rewarding step t with
t, and a reset starts its next episode: any 3 episodes in a row return 6, 15 and 3 in some order.
``FixedAction``'s weights alone decide its action, so the actions of an evaluation tell which
weights it ran with.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import warnings
from functools import partial

import pytest
import torch
from tensordict import TensorDictBase

import rpc_collectors
from conftest import CountEnv, FixedAction
from procs import descendants
from rpc_collectors import Collector, Evaluator
from rpc_collectors.single_process.metric_exports import Export, JsonLines, PrometheusTextfile

pytestmark = pytest.mark.timeout(120)
KEYS = ["eval/reward", "eval/reward_std", "eval/num_episodes", "eval/episode_length", "eval/fps",
        "eval/step", "eval/policy_version"]  # TorchRL's, in its order, then the weights' version
WAIT = 60  # seconds any wait of a test may take


def mean_action(batch: TensorDictBase) -> dict:
    """The mean action over the steps of the evaluation's episodes (``metrics_fn``)."""
    return {"action": float(batch["action"][batch["collector", "mask"]].float().mean())}


def counted(result: dict) -> tuple:
    """What the episodes of a result were: mean return, return std, episodes, mean length."""
    names = ("reward", "reward_std", "num_episodes", "episode_length")
    return tuple(result[f"eval/{name}"] for name in names)


# returns 6, 15 and 3; lengths 3, 5 and 2
THREE_EPISODES = (8.0, pytest.approx(39**0.5), 3, pytest.approx(10 / 3))


class GatedCountEnv(CountEnv):
    """``CountEnv`` whose steps wait for ``gate``: a background evaluation stays pending until
    the test opens it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def step(self, action):
        assert self.gate.wait(WAIT), "the test never opened the gate"
        return super().step(action)


class Boom(torch.nn.Module):
    def forward(self, observation):
        raise RuntimeError("boom in the policy")


# ------------------------------------------------------------------ results
def test_evaluate_reports_torchrls_metric_names_with_the_envs_episodes():
    with_ids = Evaluator(CountEnv, FixedAction(1, 3), num_trajectories=3, frames_per_batch=4)
    cat = Evaluator(
        CountEnv,
        FixedAction(1, 3),
        num_trajectories=3,
        frames_per_batch=4,
        collector_kwargs={"traj_format": "cat"},
    )
    try:
        result = with_ids.evaluate(step=5)
        assert list(result) == KEYS
        assert counted(result) == THREE_EPISODES
        assert (
            result["eval/step"] == 5
            and result["eval/policy_version"] == 0
            and result["eval/fps"] > 0
        )
        assert counted(cat.evaluate()) == THREE_EPISODES
    finally:
        with_ids.shutdown()
        cat.shutdown()


def test_max_steps_truncates_the_episodes_it_reports():
    """Episodes of 3, 5 and 2 steps cut at 4: returns 6, 10 and 3, mean length 3."""
    evaluator = Evaluator(
        CountEnv, FixedAction(1, 3), num_trajectories=3, max_steps=4, log_prefix="test"
    )
    try:
        result = evaluator.evaluate()
    finally:
        evaluator.shutdown()
    assert result["test/reward"] == pytest.approx(19 / 3) and result["test/episode_length"] == 3
    assert result["test/step"] == 0


def test_results_history_callback_and_step_counter_see_every_evaluation():
    seen = []
    evaluator = Evaluator(
        CountEnv, FixedAction(1, 3), num_trajectories=3, frames_per_batch=4, on_result=seen.append
    )
    try:
        first, second = evaluator.evaluate(), evaluator.evaluate()
        evaluator.trigger_eval(step=40)
        third = evaluator.wait(WAIT)
        assert evaluator.results == [first, second, third]
        assert [r["eval/step"] for r in evaluator.results] == [0, 1, 40]
        assert all(
            isinstance(td, TensorDictBase) and td.batch_size == torch.Size([]) for td in seen
        )
        assert [{key: td[key].item() for key in td.keys()} for td in seen] == [
            {key: pytest.approx(value) for key, value in result.items()}
            for result in evaluator.results
        ]
        state = evaluator.state_dict()
    finally:
        evaluator.shutdown()
    restored = Evaluator(CountEnv, FixedAction(1, 3), num_trajectories=3, frames_per_batch=4)
    try:
        restored.load_state_dict(state)
        assert restored.results == [first, second, third]
        assert restored.evaluate()["eval/step"] == 2  # the counter goes on
    finally:
        restored.shutdown()


def test_a_batch_without_mask_or_trajectory_ids_is_cut_at_its_done_flags():
    """Each env's row is cut after its done steps: episodes of 3, 2 and 1 steps, and a last one
    of 4 steps in progress, which counts as TorchRL counts a batch it cannot cut."""
    from tensordict import TensorDict

    from rpc_collectors.collectors.evaluation_metrics import episode_metrics

    done = torch.tensor([[0, 0, 1, 0, 1], [1, 0, 0, 0, 0]], dtype=torch.bool).unsqueeze(-1)
    batch = TensorDict({("next", "reward"): torch.ones(2, 5, 1), ("next", "done"): done}, [2, 5])
    found = episode_metrics(batch, ("next", "reward"), ("next", "done"), None, 0.0)
    assert found["num_episodes"] == 4 and found["reward"] == 2.5 and found["episode_length"] == 2.5
    assert "fps" not in found  # no time measured


def test_the_package_exports_it_as_torchrl_collectors_does():
    assert rpc_collectors.collectors.Evaluator is Evaluator
    assert "Evaluator" in rpc_collectors.__all__


# ------------------------------------------------------------------ weights and versions
def run_weights_and_versions(evaluator: Evaluator) -> None:
    """The policy's own weights (action 0), pushed ones (action 1) named by the trainer's version,
    the same weights again without a push, then weights named by the evaluator's count of loads."""
    own = evaluator.evaluate()
    assert own["eval/action"] == 0.0 and own["eval/policy_version"] == 0
    pushed = evaluator.evaluate(FixedAction(1, 3), version=7)
    assert pushed["eval/action"] == 1.0 and pushed["eval/policy_version"] == 7
    again = evaluator.evaluate()
    assert again["eval/action"] == 1.0 and again["eval/policy_version"] == 7
    evaluator.trigger_eval(weights_dict={"policy": Evaluator.extract_weights(FixedAction(0, 3))})
    counted_load = evaluator.wait(WAIT)
    assert counted_load["eval/action"] == 0.0 and counted_load["eval/policy_version"] == 2
    assert counted(counted_load) == THREE_EPISODES


def test_weights_from_the_trainer_decide_the_actions_and_stamp_the_result():
    evaluator = Evaluator(
        CountEnv, FixedAction(0, 3), num_trajectories=3, frames_per_batch=4, metrics_fn=mean_action
    )
    try:
        run_weights_and_versions(evaluator)
    finally:
        evaluator.shutdown()


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_worker_process_evaluates_with_the_weights_pushed_to_it():
    """``backend="process"``: the policy is built in the worker; each evaluation's episodes all
    come from the weights of that evaluation (a push before a reset)."""
    evaluator = Evaluator(
        CountEnv,
        policy_factory=partial(FixedAction, 0, 3),
        num_trajectories=3,
        frames_per_batch=4,
        metrics_fn=mean_action,
        backend="process",
    )
    try:
        assert evaluator.collector is None  # nothing starts before the first evaluation
        run_weights_and_versions(evaluator)
        assert evaluator.collector.num_workers == 1
    finally:
        evaluator.shutdown()


# ------------------------------------------------------------------ in the background
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize(
    "backend", ["thread", pytest.param("process", marks=pytest.mark.multiprocess)]
)
def test_background_evaluations_report_through_poll_wait_pending_and_on_result(backend):
    seen = []
    kwargs = {
        "backend": backend,
        "num_trajectories": 3,
        "frames_per_batch": 4,
        "on_result": seen.append,
    }
    evaluator = Evaluator(
        CountEnv, policy_factory=partial(FixedAction, 1, 3), busy_policy="queue", **kwargs
    )
    try:
        assert not evaluator.pending and evaluator.poll() is None and evaluator.wait(WAIT) is None
        assert evaluator.trigger_eval(step=1) and evaluator.trigger_eval(step=2)
        first = evaluator.poll(timeout=WAIT)
        second = evaluator.wait(WAIT)
        assert [first["eval/step"], second["eval/step"]] == [1, 2]
        assert counted(first) == counted(second) == THREE_EPISODES
        assert not evaluator.pending and evaluator.poll() is None
        assert [td["eval/step"].item() for td in seen] == [1, 2]
    finally:
        evaluator.shutdown()


@pytest.fixture
def gated():
    """A thread-backend evaluator whose episodes step only once the gate is open."""
    env = GatedCountEnv()
    evaluators = []

    def make(busy_policy: str) -> Evaluator:
        evaluators.append(
            Evaluator(
                env,
                FixedAction(1, 3),
                num_trajectories=3,
                frames_per_batch=4,
                busy_policy=busy_policy,
            )
        )
        return evaluators[-1]

    yield make, env.gate
    env.gate.set()
    for evaluator in evaluators:
        evaluator.shutdown()


def test_busy_policy_skip_returns_false_while_one_is_pending(gated):
    make, gate = gated
    evaluator = make("skip")
    assert evaluator.trigger_eval(step=0)
    assert evaluator.pending and evaluator.poll() is None
    assert not evaluator.trigger_eval(step=1)
    gate.set()
    assert evaluator.wait(WAIT)["eval/step"] == 0
    assert evaluator.wait(WAIT) is None  # the skipped one never ran
    assert evaluator.trigger_eval(step=2) and evaluator.wait(WAIT)["eval/step"] == 2


def test_busy_policy_error_raises_while_one_is_pending(gated):
    make, gate = gated
    evaluator = make("error")
    assert evaluator.trigger_eval(step=0)
    with pytest.raises(
        RuntimeError, match="Evaluation already pending.*busy_policy='skip' or busy_policy='queue'"
    ):
        evaluator.trigger_eval(step=1)
    gate.set()
    assert evaluator.wait(WAIT)["eval/step"] == 0
    assert evaluator.trigger_eval(step=2)


def test_busy_policy_queue_runs_them_in_order(gated):
    make, gate = gated
    evaluator = make("queue")
    assert all(evaluator.trigger_eval(step=s) for s in (0, 1, 2))
    assert evaluator.pending
    gate.set()
    assert [evaluator.wait(WAIT)["eval/step"] for _ in range(3)] == [0, 1, 2]
    assert not evaluator.pending


def test_an_error_in_a_background_evaluation_is_raised_by_wait():
    evaluator = Evaluator(CountEnv, policy_factory=lambda env: Boom())
    try:
        assert evaluator.trigger_eval()
        with pytest.raises(RuntimeError, match="boom in the policy"):
            evaluator.wait(WAIT)
        assert not evaluator.pending and evaluator.wait(WAIT) is None
    finally:
        evaluator.shutdown()


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"backend": "slurm"}, ValueError, ["backend 'slurm'", "'thread', 'process', 'ray' or 'worker'"]),
        ({"busy_policy": "drop"}, ValueError, ["busy_policy 'drop'", "'skip', 'error' or 'queue'"]),
        ({"num_trajectories": 0}, ValueError, ["num_trajectories=0", "an int > 0"]),
        ({"max_steps": -1}, ValueError, ["max_steps=-1", "an int > 0"]),
        ({"frames_per_batch": 2.5}, ValueError, ["frames_per_batch=2.5", "an int > 0"]),
        (
            {"collector_kwargs": {"traj_format": "flat"}},
            ValueError,
            ["traj_format='flat'", "'padded' or 'cat'"],
        ),
        ({"collector_kwargs": [1]}, TypeError, ["collector_kwargs=[1]", "None or a dict"]),
    (
        {"collector_kwargs": {"trajs_per_batch": 4}},
        ValueError,
        ["collector_kwargs keys ['trajs_per_batch']", "num_trajectories", "the collector's other"],
    ),
        (
            {"collector_cls": "MultiSyncCollector"},
            ValueError,
            ["collector_cls='MultiSyncCollector'", "'Collector'"],
        ),
        ({"reward_keys": 3}, TypeError, ["reward_keys=3", "a str or a tuple of str"]),
        ({"on_result": "print"}, TypeError, ["on_result='print'", "None or a callable"]),
        ({"dump_video": "yes"}, TypeError, ["dump_video='yes'", "True or False"]),
        (
            {"exploration_type": "greedy"},
            ValueError,
            ["exploration_type='greedy'", "ExplorationType"],
        ),
        (
            {"backend": "process", "env": CountEnv()},
            ValueError,
            ["env=<conftest.CountEnv", "a callable returning an env"],
        ),
        (
            {"backend": "process", "policy": FixedAction(1, 3)},
            ValueError,
            ["policy=FixedAction", "policy_factory"],
        ),
        (
            {"backend": "process", "collector_cls": "Collector"},
            ValueError,
            ["collector_cls='Collector'", "None"],
        ),
        (
            {"backend": "process", "env": partial(CountEnv, threading.Lock())},
            TypeError,
            ["env=", "cloudpickle"],
        ),
        ({"backend": "ray", "num_gpus": -1}, ValueError, ["num_gpus=-1", "a number >= 0"]),
        (
            {"policy_factory": partial(FixedAction, 1, 3)},
            ValueError,
            ["policy and policy_factory", "not both"],
        ),
        ({"metrics": "nope:1"}, ValueError, ["metrics='nope:1'", "or a list of targets"]),
        ({"metrics": True}, ValueError, ["metrics=True", "JsonLines"]),
        ({"metrics": []}, ValueError, ["metrics=[]", "a target"]),
        ({"metrics": Export("jsonl:x.jsonl")}, ValueError, ["metrics=Export(", "a target"]),
        ({"backend": "process", "metrics": ["jsonl:"]}, ValueError, ["metrics='jsonl:'"]),
    ],
)
def test_bad_arguments_are_refused_before_any_process_starts(kwargs, error, words):
    kwargs = {
        "env": CountEnv,
        "policy": None if kwargs.get("backend") in ("process", "ray") else FixedAction(1, 3),
        **kwargs,
    }
    if kwargs["policy"] is None and "policy_factory" not in kwargs:
        kwargs["policy_factory"] = partial(FixedAction, 1, 3)
    before = descendants()
    with pytest.raises(error) as raised:
        Evaluator(kwargs.pop("env"), **kwargs)
    assert all(word in str(raised.value) for word in words), str(raised.value)
    assert descendants() == before


def test_unsupported_weights_are_refused_naming_what_is_accepted():
    evaluator = Evaluator(CountEnv, FixedAction(1, 3), num_trajectories=3)
    try:
        with pytest.raises(
            ValueError, match=r"weights_dict keys \['env.transform\[0\]'\].*accepted: 'policy'"
        ):
            evaluator.evaluate(weights_dict={"env.transform[0]": FixedAction(0, 3)})
        with pytest.raises(TypeError, match="weights=3 is invalid; accepted: an nn.Module"):
            evaluator.trigger_eval(3)
        with pytest.raises(TypeError, match="version='7' is invalid; accepted: None or an int"):
            evaluator.evaluate(version="7")
        assert evaluator.results == [] and not evaluator.pending
    finally:
        evaluator.shutdown()


# ------------------------------------------------------------------ shutdown
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize(
    "backend", ["thread", pytest.param("process", marks=pytest.mark.multiprocess)]
)
def test_shutdown_stops_an_evaluation_in_progress_and_leaves_no_thread_or_process(backend):
    """An episode of a million steps never ends: shutdown interrupts it, drops the queued one, and
    its thread and worker are gone after it."""
    env = partial(CountEnv, lengths=(10**6,))
    evaluator = Evaluator(
        env,
        policy_factory=partial(FixedAction, 1, 3),
        frames_per_batch=50,
        backend=backend,
        busy_policy="queue",
    )
    assert evaluator.trigger_eval() and evaluator.trigger_eval()
    evaluator.shutdown(timeout=WAIT)
    assert not evaluator.pending and evaluator.poll() is None and evaluator.results == []
    assert not [t for t in threading.enumerate() if t.name == "evaluator"]
    with pytest.raises(RuntimeError, match="the Evaluator was shut down"):
        evaluator.trigger_eval()
    with pytest.raises(RuntimeError, match="the Evaluator was shut down"):
        evaluator.evaluate()
    evaluator.shutdown()  # again: nothing left to do


# ------------------------------------------------------------------ Ray
@pytest.fixture
def local_ray(monkeypatch):
    """Ray on 127.0.0.1 for this test only (never ``ray stop``: that would end every Ray of the
    machine)."""
    ray = pytest.importorskip("ray")
    from folders import PYTHONPATH

    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)  # the actor imports the test envs
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live there
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        _temp_dir=temp,
    )
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # Ray's start, as tests/collectors/test_ray.py allows it
@pytest.mark.xdist_group("ray")  # one Ray at a time, as tests/collectors/test_ray.py
@pytest.mark.usefixtures("local_ray")
def test_a_ray_actor_evaluates_with_the_weights_pushed_to_it():
    evaluator = Evaluator(
        CountEnv,
        policy_factory=partial(FixedAction, 0, 3),
        num_trajectories=3,
        frames_per_batch=4,
        metrics_fn=mean_action,
        backend="ray",
        num_gpus=0,
    )
    try:
        run_weights_and_versions(evaluator)
    finally:
        evaluator.shutdown()


# ------------------------------------------------------------------ metrics=
class ScalarLogger:
    """TorchRL's logger interface, as ``metrics=`` uses it: ``{step: {name: value}}``."""

    def __init__(self, fails: bool = False) -> None:
        self.fails, self.logged = fails, {}

    def log_scalar(self, name, value, step=None):
        if self.fails:
            raise OSError("the logger's disk is full")
        self.logged.setdefault(step, {})[name] = value


def numbers(result: dict) -> dict:
    return {name: float(value) for name, value in result.items() if name != "eval/step"}


def jsonl(path) -> dict:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {line["step"]: line["scalars"] for line in lines}


def reporting_to(targets: list) -> Evaluator:
    """Three episodes of ``CountEnv`` with action 1 (``mean_action``), each result given to
    ``targets``."""
    return Evaluator(CountEnv, FixedAction(1, 3), num_trajectories=3, frames_per_batch=4,
                     metrics_fn=mean_action, metrics=targets)


def test_metrics_targets_get_every_results_numbers_at_its_step_background_ones_too(tmp_path):
    path, logger = tmp_path / "eval" / "results.jsonl", ScalarLogger()
    evaluator = reporting_to([f"jsonl:{path}", logger])
    try:
        evaluator.evaluate(step=5)
        # the step counter's 0
        evaluator.evaluate()
        assert evaluator.trigger_eval(step=7)
        assert evaluator.wait(WAIT)["eval/step"] == 7
        results = {result["eval/step"]: numbers(result) for result in evaluator.results}
        assert list(results) == [5, 0, 7] and results[7]["eval/action"] == 1.0
        assert jsonl(path) == logger.logged == results
        assert results[5]["eval/reward"] == 8.0 and results[5]["eval/policy_version"] == 0.0
    finally:
        evaluator.shutdown()


def test_a_collector_given_as_metrics_holds_the_last_result_and_its_exports_write_it(tmp_path):
    path, logger = tmp_path / "collector.jsonl", ScalarLogger()
    collector = Collector(CountEnv, FixedAction(0, 3), frames_per_batch=4, total_frames=-1,
                          metrics=Export(JsonLines(path), batches=1))
    evaluator = reporting_to([collector, logger])
    try:
        batches = iter(collector)
        next(batches)
        assert collector.metrics().evaluations == ()
        assert not any(name.startswith("eval/") for name in collector.metrics().scalars())
        evaluator.evaluate(step=5)
        assert evaluator.trigger_eval(FixedAction(0, 3), step=9, version=4)
        last = evaluator.wait(WAIT)
        # its export, at this batch's end, writes the evaluations
        next(batches)
        (group,) = collector.metrics().evaluations
        assert group.prefix == "eval" and group.results == 2
        assert group.last == {name: float(value) for name, value in last.items()}
        scalars = collector.metrics().scalars()
        assert scalars["eval/reward"] == 8.0 and scalars["eval/action"] == 0.0
        assert scalars["eval/step"] == 9 and scalars["eval/policy_version"] == 4
        assert scalars["eval/results"] == 2
        # the evaluator's own targets still get each result at its step
        assert sorted(logger.logged) == [5, 9] and logger.logged[9]["eval/action"] == 0.0
    finally:
        evaluator.shutdown()
        collector.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["step"] == 4 and lines[0]["metrics"]["evaluations"] == []
    assert lines[-1]["step"] == 8
    assert lines[-1]["metrics"]["evaluations"] == [{"prefix": "eval", "results": 2,
                                                    "last": group.last}]


def test_a_collector_without_metrics_or_a_prefix_its_metrics_name_is_refused():
    built = []

    def env():
        built.append("env")
        return CountEnv()

    quiet = Collector(CountEnv, FixedAction(0, 3), frames_per_batch=4, total_frames=-1,
                      metrics=False)
    kept = Collector(CountEnv, FixedAction(0, 3), frames_per_batch=4, total_frames=-1)
    try:
        with pytest.raises(ValueError, match=r"keeps no metrics \(it was built with metrics=False"):
            Evaluator(env, policy_factory=partial(FixedAction, 1, 3), metrics=quiet)
        with pytest.raises(ValueError, match=r"log_prefix=.workers/3. names a group .* accepted: a prefix"):
            Evaluator(env, policy_factory=partial(FixedAction, 1, 3), log_prefix="workers/3",
                      metrics=["jsonl:unused.jsonl", kept])
    finally:
        quiet.shutdown()
        kept.shutdown()
    assert built == []


def test_a_target_that_cannot_be_written_is_refused_before_anything_is_built(tmp_path):
    (tmp_path / "file").write_text("")
    built = []

    def env():
        built.append("env")
        return CountEnv()

    with pytest.raises(ValueError, match=r"metrics=JsonLines\(.*cannot be written"):
        Evaluator(
            env,
            policy_factory=partial(FixedAction, 1, 3),
            metrics=JsonLines(tmp_path / "file" / "results.jsonl"),
        )
    assert built == []


def test_a_failing_target_is_warned_about_once_and_evaluation_goes_on(tmp_path):
    path = tmp_path / "results.jsonl"
    evaluator = Evaluator(
        CountEnv,
        FixedAction(1, 3),
        num_trajectories=3,
        frames_per_batch=4,
        metrics=[ScalarLogger(fails=True), JsonLines(path)],
    )
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(3):
                assert evaluator.evaluate(step=step)["eval/num_episodes"] == 3
            assert evaluator.trigger_eval(step=3) and evaluator.wait(WAIT) is not None
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and "ScalarLogger() failed (OSError" in said[0], said
        assert "evaluation goes on" in said[0]
        assert len(evaluator.results) == 4 and list(jsonl(path)) == [0, 1, 2, 3]
    finally:
        evaluator.shutdown()


def test_shutdown_closes_the_targets_and_gauges_are_named_as_prometheus_allows(tmp_path):
    textfile, lines = PrometheusTextfile(tmp_path / "textfile", "eval"), JsonLines(tmp_path / "r")
    evaluator = Evaluator(
        CountEnv,
        FixedAction(1, 3),
        num_trajectories=3,
        frames_per_batch=4,
        metrics_fn=lambda batch: {"mean-action": 1.0},
        metrics=[textfile, lines],
    )
    evaluator.evaluate(step=2)
    text = (tmp_path / "textfile" / "rpc_collectors_eval.prom").read_text()
    assert 'rpc_collectors_eval_reward{trainer="eval"} 8.0' in text
    assert 'rpc_collectors_eval_mean_action{trainer="eval"} 1.0' in text
    assert lines._file is not None
    evaluator.shutdown()
    assert os.listdir(tmp_path / "textfile") == [] and lines._file is None
    # again: nothing more to close
    evaluator.shutdown()
