"""``Evaluator(backend="worker")``: evaluations run in a worker of a running collector (a local process, a rank, a
node collector), beside its collection, never in the trainer's process.

The evaluation's env writes a file named for its process at each reset, so a test knows where every evaluation ran;
``FixedAction``'s weights alone decide its action, so an evaluation's actions tell which weights it ran with
(``run_weights_and_versions`` of tests/collectors/test_evaluator.py).
"""
from __future__ import annotations

import os
import signal
import time
import warnings
from functools import partial

import pytest

from conftest import CountEnv, FixedAction
from rpc_collectors import Collector, Evaluator, RPCCollector, WorkerRestartWarning
from test_evaluator import WAIT, local_ray, mean_action, run_weights_and_versions  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)
LAUNCHES = {
    "local": dict(launcher="local"),
    "ranks": dict(launcher="mp"),
    "node": dict(launcher="local", collector_class="sync", num_workers_per_collector=2),
}


class WhereEnv(CountEnv):
    """``CountEnv`` that marks ``folder/<pid>`` at each reset; with ``dies`` a file, the process that claims it (removes
    it) kills itself at its first step."""

    def __init__(self, folder: str, dies: str | None = None, lengths=(3, 5, 2)) -> None:
        super().__init__(lengths)
        self.folder, self.dies = folder, dies

    def reset(self, **kwargs):
        open(os.path.join(self.folder, str(os.getpid())), "w").close()
        return super().reset(**kwargs)

    def step(self, action):
        if self.dies is not None:
            try:
                os.remove(self.dies)
            except FileNotFoundError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def where(folder) -> set[int]:
    return {int(entry.name) for entry in folder.iterdir() if entry.name.isdigit()}


def evaluator_on(collector, env, **kwargs) -> Evaluator:
    return Evaluator(env, policy_factory=partial(FixedAction, 0, 3), num_trajectories=3, frames_per_batch=4,
                     metrics_fn=mean_action, backend="worker", worker_of=collector, **kwargs)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("launch", LAUNCHES)
def test_a_collectors_worker_evaluates_with_the_weights_given_while_the_collector_collects(launch, tmp_path):
    collector = RPCCollector(CountEnv, FixedAction(0, 3), num_collectors=2, frames_per_batch=8, total_frames=-1,
                             **LAUNCHES[launch])
    try:
        batches = iter(collector)
        next(batches)
        evaluator = evaluator_on(collector, partial(WhereEnv, str(tmp_path)), metrics=collector)
        run_weights_and_versions(evaluator)
        # in the last worker's process (a node's own), never in this one
        assert where(tmp_path) == {collector.infos[1]["pid"]}
        assert evaluator.trigger_eval(FixedAction(1, 3), step=5)
        for _ in range(3):  # the trainer collects while its worker evaluates
            assert next(batches).numel() == 8
        result = evaluator.wait(WAIT)
        assert result["eval/action"] == 1.0 and result["eval/step"] == 5 and result["eval/policy_version"] == 3
        # the collector's metrics() holds the last of the 5 results
        scalars = collector.metrics().scalars()
        assert scalars["eval/results"] == 5 and scalars["eval/action"] == 1.0 and scalars["eval/step"] == 5
        evaluator.shutdown()
        assert next(batches).numel() == 8  # the collector goes on without it
    finally:
        collector.shutdown()


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_the_worker_chosen_evaluates_and_a_worker_that_dies_fails_only_the_evaluation_in_progress(tmp_path):
    dies = tmp_path / "dies"
    folder = tmp_path / "pids"
    folder.mkdir()
    collector = RPCCollector(CountEnv, FixedAction(0, 3), num_collectors=3, launcher="local", frames_per_batch=12,
                             total_frames=-1, max_worker_restarts=1)
    try:
        batches = iter(collector)
        next(batches)
        evaluator = evaluator_on(collector, partial(WhereEnv, str(folder), str(dies)), worker_id=0)
        first = collector.infos[0]["pid"]
        loaded = evaluator.evaluate(FixedAction(1, 3), version=4)
        assert loaded["eval/action"] == 1.0 and loaded["eval/policy_version"] == 4
        dies.touch()  # the worker's env kills its process at its next step
        with pytest.raises(RuntimeError, match="the evaluation in worker 0 of the RPCCollector failed"):
            evaluator.evaluate()
        assert not dies.exists() and where(folder) == {first}
        with pytest.warns(WorkerRestartWarning, match="collector worker 0 died"):
            for _ in range(2):  # the collector replaces its worker and goes on
                assert next(batches).numel() == 12
        assert collector.infos[0]["pid"] != first
        again = evaluator.evaluate()  # the replacement evaluates the weights loaded last
        assert again["eval/action"] == 1.0 and again["eval/policy_version"] == 4
        assert where(folder) == {first, collector.infos[0]["pid"]}
        evaluator.shutdown()
    finally:
        collector.shutdown()


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_an_endless_evaluation_ends_with_its_evaluator_or_its_collector_and_leaves_nothing_running(tmp_path):
    def started(evaluator: Evaluator, folder) -> None:
        folder.mkdir()
        assert evaluator.trigger_eval()
        deadline = time.monotonic() + WAIT
        while not where(folder):  # its env's first reset, in the worker
            assert time.monotonic() < deadline, "the evaluation never started in the worker"
            time.sleep(0.02)

    endless = partial(WhereEnv, lengths=(10**6,))
    collector = RPCCollector(CountEnv, FixedAction(0, 3), num_collectors=2, launcher="local", frames_per_batch=8,
                             total_frames=-1)
    try:
        next(iter(collector))
        first = evaluator_on(collector, partial(endless, str(tmp_path / "first")))
        started(first, tmp_path / "first")
        first.shutdown(timeout=WAIT)  # stops waiting, and has the worker end it
        assert not first.pending and first.results == []
        finite = evaluator_on(collector, partial(WhereEnv, str(tmp_path)))
        assert finite.trigger_eval() and finite.wait(WAIT)["eval/num_episodes"] == 3  # the worker is free again
        finite.shutdown()
        last = evaluator_on(collector, partial(endless, str(tmp_path / "last")))
        started(last, tmp_path / "last")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            collector.shutdown()  # ends the evaluation in its worker, without killing it
        assert not [w for w in caught if "killed" in str(w.message)]
        with pytest.raises(RuntimeError, match="the evaluation in worker 1 of the RPCCollector failed"):
            last.wait(WAIT)
        last.shutdown()
    finally:
        collector.shutdown()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)  # Ray's start, as tests/collectors/test_ray.py allows it
@pytest.mark.xdist_group("ray")  # one Ray at a time
@pytest.mark.usefixtures("local_ray")
def test_a_ray_actor_of_a_running_collector_evaluates_beside_its_collection(tmp_path):
    from rpc_collectors import RayCollector

    collector = RayCollector([CountEnv, CountEnv], FixedAction(0, 3), frames_per_batch=8, total_frames=-1,
                             remote_configs={"num_cpus": 0.5})
    try:
        batches = iter(collector)
        next(batches)
        evaluator = evaluator_on(collector, partial(WhereEnv, str(tmp_path)), worker_id=0)
        run_weights_and_versions(evaluator)
        assert where(tmp_path) == {collector.infos[0]["pid"]}
        assert next(batches).numel() == 8
        evaluator.shutdown()
    finally:
        collector.shutdown()


def test_worker_arguments_are_refused_before_anything_runs_naming_what_is_accepted():
    collector = RPCCollector(CountEnv, FixedAction(0, 3), num_collectors=2, launcher="debug", frames_per_batch=8)
    single = Collector(CountEnv, FixedAction(0, 3), frames_per_batch=4)
    factory = partial(FixedAction, 0, 3)
    try:
        cases = [
            (dict(backend="worker", worker_of=None), "worker_of=None is not one; accepted: a multi-worker collector"),
            (dict(backend="worker", worker_of=single), "is not one; accepted: a multi-worker collector"),
            (dict(backend="thread", worker_of=collector), "is for backend='worker'; accepted with backend='thread'"),
            (dict(backend="process", worker_id=1), "worker_id=1 is for backend='worker'"),
            (dict(backend="worker", worker_of=collector, worker_id=2),
             "worker_id=2 is invalid; accepted: None .* from 0 to 1"),
            (dict(backend="worker", worker_of=collector, weight_sync_schemes={"policy": object()}),
             "is not taken by backend='worker'"),
        ]
        for kwargs, words in cases:
            with pytest.raises(ValueError, match=words):
                Evaluator(CountEnv, policy_factory=factory, **kwargs)
        with pytest.raises(ValueError, match="cannot be used with backend='worker'"):
            Evaluator(CountEnv, FixedAction(0, 3), backend="worker", worker_of=collector)
        collector.shutdown()
        with pytest.raises(RuntimeError, match="RPCCollector was shut down"):
            Evaluator(CountEnv, policy_factory=factory, backend="worker", worker_of=collector)
    finally:
        collector.shutdown()
        single.shutdown()
