"""TorchRL 0.14.1's own evaluator tests (test/collectors/test_evaluator.py) against our Evaluator,
``from torchrl.collectors import Evaluator`` swapped for ``from rpc_collectors import Evaluator``.

The tests are TorchRL's, on TorchRL's envs, transforms, modules and loggers. Where a test reads
TorchRL's private state (``evaluator._backend...``, ``_ready_results``) or private helpers
(``_freeze_vecnorm``, ``_wrap_env_factory_frozen``, ``_extract_metrics_from_trajectories``), it
reads ours, and says so ("adapted"). docs/guide/torchrl.md lists the tests left out and why.
Runs where torchrl is installed (``.ci/run``'s TorchRL venv); skipped elsewhere unless
``RPC_COLLECTORS_REQUIRE_TORCHRL=1`` says it must run.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

if os.environ.get("RPC_COLLECTORS_REQUIRE_TORCHRL"):
    import torchrl  # noqa: F401  (must be importable: CI runs this module for real)
else:
    pytest.importorskip("torchrl")

with (
    warnings.catch_warnings()
):  # torchrl 0.14.1 deprecates some of its own classes as it imports them
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl.checkpoint import Checkpoint
    from torchrl.envs import SerialEnv, TransformedEnv
    from torchrl.envs.transforms import Compose, RewardSum, StepCounter, Transform, VecNormV2
    from torchrl.modules import RandomPolicy
    from torchrl.record import VideoRecorder
    from torchrl.record.loggers.process import ProcessLogger
    from torchrl.testing import AddPixelsTransform
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

from rpc_collectors import Evaluator  # noqa: E402
from rpc_collectors.collectors.evaluation_envs import WorkerSetup, freeze_norms  # noqa: E402
from rpc_collectors.collectors.evaluation_metrics import episode_metrics  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    # TorchRL 0.14's auto_register_policy_transforms=None warns that a policy lacks InitTracker,
    # as ours does
    pytest.mark.filterwarnings("ignore:the env lacks transforms the policy needs:FutureWarning"),
    # TorchRL's, once per process, when a collector adds its StepCounter to a TransformedEnv (as
    # TorchRL's collectors do)
    pytest.mark.filterwarnings(
        "ignore:Nested TransformedEnvs are automatically unwrapped:UserWarning"
    ),
]


def _make_env():
    return ContinuousActionVecMockEnv()


def _make_policy(env=None):
    if env is None:
        env = _make_env()
    obs_dim = env.observation_spec["observation"].shape[-1]
    act_dim = env.action_spec.shape[-1]
    return TensorDictModule(
        nn.Linear(obs_dim, act_dim), in_keys=["observation"], out_keys=["action"]
    )


class _DumpStep(Transform):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def dump(self, suffix=None, step=None) -> None:
        del suffix
        Path(self.path).write_text(str(step))


def _make_dump_env(path: str):
    return TransformedEnv(_make_env(), Compose(_DumpStep(path)))


class _VideoEventsLogger:
    """Duck-typed logger that appends each ``log_video`` call to a file."""

    def __init__(self, log_dir):
        self.exp_name = "evaluator-video-test"
        self.log_dir = str(log_dir)

    def log_video(self, name, video, step=None, **kwargs):
        del kwargs
        with open(Path(self.log_dir) / "videos", "a") as file:
            file.write(f"{name}:{step}:{video.shape[1]}\n")


def _make_video_env(video_logger):
    return TransformedEnv(
        _make_env(),
        Compose(
            AddPixelsTransform(),
            VideoRecorder(
                video_logger, tag="eval_video", in_keys=["pixels"], skip=1, make_grid=False
            ),
        ),
    )


def _read_video_events(log_dir):
    lines = (Path(log_dir) / "videos").read_text().splitlines()
    return [line.split(":") for line in lines]


class TestEvaluatorSync:
    def test_checkpoint_state(self, tmp_path):
        """Adapted: the counter and the pending work are reached through the public API, not
        ``_step_counter``, ``_ready_results`` and ``_async_requests``."""
        evaluator = Evaluator(_make_env(), _make_policy(), max_steps=50)
        restored = Evaluator(_make_env(), _make_policy(), max_steps=50)
        try:
            for _ in range(2):
                evaluator.evaluate()
            restored.load_state_dict(evaluator.state_dict())
            assert restored.evaluate()["eval/step"] == 2
            path = tmp_path / "evaluator"
            Checkpoint(evaluator=evaluator).save(path)
            restored.trigger_eval(step=13)  # pending, then unread: not restorable
            result = Checkpoint(strict="ignore", evaluator=restored).load(path)
            assert "pending, queued, or unread" in result.incompatible["evaluator"]
            assert restored.wait(timeout=30)["eval/step"] == 13
            evaluator.trigger_eval(step=13)
            with pytest.raises(RuntimeError, match="pending, queued, or unread"):
                evaluator.state_dict()
        finally:
            evaluator.shutdown()
            restored.shutdown()

    def test_evaluate_basic(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert "eval/episode_length" in metrics
            assert "eval/fps" in metrics
            assert isinstance(metrics["eval/reward"], float)
        finally:
            evaluator.shutdown()

    def test_evaluate_with_weights(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            weights = Evaluator.extract_weights(train_policy)
            metrics = evaluator.evaluate(weights=weights, step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_evaluate_plain_tensordict_weights_preserves_state_dict(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=5)
        try:
            weights = TensorDict.from_module(policy).data.detach().clone().cpu()
            state_dict_keys = set(policy.state_dict())
            assert state_dict_keys
            evaluator.evaluate(weights=weights, step=0)
            evaluator.evaluate(weights=weights, step=1)
            assert set(policy.state_dict()) == state_dict_keys
        finally:
            evaluator.shutdown()

    def test_evaluate_with_module_weights(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(weights=train_policy, step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_video_recorder_dump(self, tmp_path):
        logger = _VideoEventsLogger(str(tmp_path))
        env = _make_video_env(logger)
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, num_trajectories=2, max_steps=10, dump_video=True)
        try:
            evaluator.evaluate(step=11)
            evaluator.evaluate(step=22)
            records = _read_video_events(tmp_path)
            assert [record[:2] for record in records] == [
                ["eval_video", "11"],
                ["eval_video", "22"],
            ]
            assert all(int(record[2]) > 0 for record in records)
        finally:
            evaluator.shutdown()

    def test_custom_log_prefix(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50, log_prefix="test_eval")
        try:
            metrics = evaluator.evaluate(step=0)
            assert "test_eval/reward" in metrics
            assert "test_eval/episode_length" in metrics
        finally:
            evaluator.shutdown()

    def test_custom_metrics_fn(self):
        env = _make_env()
        policy = _make_policy(env)

        def my_metrics(td):
            return {"num_steps": td.shape[-1]}

        evaluator = Evaluator(env, policy, max_steps=50, metrics_fn=my_metrics)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/num_steps" in metrics
        finally:
            evaluator.shutdown()

    def test_callback(self):
        env = _make_env()
        policy = _make_policy(env)
        results = []
        evaluator = Evaluator(env, policy, max_steps=50, on_result=results.append)
        try:
            evaluator.evaluate(step=42)
            assert len(results) == 1
            assert results[0]["eval/step"].item() == 42
            assert "eval/reward" in results[0].keys()
        finally:
            evaluator.shutdown()

    def test_policy_factory(self):
        evaluator = Evaluator(_make_env, policy_factory=lambda env: _make_policy(env), max_steps=50)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_multiple_evals(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            for i in range(3):
                metrics = evaluator.evaluate(step=i)
                assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_extract_weights(self):
        policy = _make_policy()
        weights = Evaluator.extract_weights(policy)
        assert isinstance(weights, TensorDict)
        assert weights.device == torch.device("cpu")

    def test_step_provenance_in_result(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(step=123)
            assert metrics["eval/step"] == 123
        finally:
            evaluator.shutdown()


class TestEvaluatorAsync:
    def test_trigger_and_wait(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
            assert "eval/fps" in result
        finally:
            evaluator.shutdown()

    def test_trigger_and_poll(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.poll(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_poll_nonblocking_returns_none(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=500)
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.poll(timeout=0)
            if result is not None:
                assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_busy_policy_error(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=200, busy_policy="error")
        try:
            assert evaluator.trigger_eval(step=0)
            with pytest.raises(RuntimeError, match="busy_policy='queue'"):
                evaluator.trigger_eval(step=1)
        finally:
            evaluator.shutdown()

    def test_busy_policy_skip(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=200)
        try:
            assert evaluator.trigger_eval(step=0)
            assert not evaluator.trigger_eval(step=1)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert result["eval/step"] == 0
            assert evaluator.trigger_eval(step=2)
        finally:
            evaluator.shutdown()

    def test_busy_policy_queue(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=200, busy_policy="queue")
        try:
            assert evaluator.trigger_eval(step=0)
            assert evaluator.trigger_eval(step=1)
            result0 = evaluator.wait(timeout=30)
            result1 = evaluator.wait(timeout=30)
            assert result0 is not None
            assert result1 is not None
            assert result0["eval/step"] == 0
            assert result1["eval/step"] == 1
        finally:
            evaluator.shutdown()

    def test_async_with_weights(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            evaluator.trigger_eval(weights=train_policy, step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_async_callback(self):
        env = _make_env()
        policy = _make_policy(env)
        results = []
        evaluator = Evaluator(env, policy, max_steps=50, on_result=results.append)
        try:
            evaluator.trigger_eval(step=7)
            evaluator.wait(timeout=30)
            assert len(results) >= 1
            assert results[0]["eval/step"].item() == 7
        finally:
            evaluator.shutdown()

    def test_multiple_async_evals(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            for i in range(3):
                evaluator.trigger_eval(step=i)
                result = evaluator.wait(timeout=30)
                assert result is not None
                assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_shutdown_no_thread_leak(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        evaluator.trigger_eval(step=0)
        evaluator.wait(timeout=30)
        evaluator.shutdown()
        time.sleep(0.5)
        for t in threading.enumerate():
            assert not t.is_alive() or "eval" not in t.name.lower(), (
                f"Thread {t.name} still alive after shutdown"
            )

    def test_step_provenance_in_result(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            evaluator.trigger_eval(step=999)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert result["eval/step"] == 999
        finally:
            evaluator.shutdown()

    def test_shutdown_with_inflight_eval(self):
        """Shutdown while an eval is still running should not hang. (TorchRL's test times the shutdown;
        this one checks what the bound leaves behind: no evaluator thread, nothing pending; pytest's
        timeout catches a hang.)"""
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=5000)
        evaluator.trigger_eval(step=0)
        evaluator.shutdown(timeout=5.0)
        assert not any(t.name == "evaluator" and t.is_alive() for t in threading.enumerate())
        assert not evaluator.pending


class TestEvaluatorPending:
    def test_pending_false_initially(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            assert not evaluator.pending
        finally:
            evaluator.shutdown()

    def test_pending_during_async_eval(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=500)
        try:
            evaluator.trigger_eval(step=0)
            assert evaluator.pending
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert not evaluator.pending
        finally:
            evaluator.shutdown()

    def test_pending_cleared_by_poll(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.poll(timeout=30)
            assert result is not None
            assert not evaluator.pending
        finally:
            evaluator.shutdown()

    def test_pending_cleared_by_shutdown(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=5000)
        evaluator.trigger_eval(step=0)
        assert evaluator.pending
        evaluator.shutdown(timeout=5.0)
        assert not evaluator.pending


class TestEvaluatorLazyInit:
    def test_sync_eval_with_factories(self):
        evaluator = Evaluator(_make_env, policy_factory=lambda env: _make_policy(env), max_steps=50)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_async_eval_with_factories(self):
        evaluator = Evaluator(_make_env, policy_factory=lambda env: _make_policy(env), max_steps=50)
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_lazy_init_deferred_to_worker_thread(self):
        creation_thread_names = []

        def tracked_env_factory():
            creation_thread_names.append(threading.current_thread().name)
            return _make_env()

        def tracked_policy_factory(env):
            creation_thread_names.append(threading.current_thread().name)
            return _make_policy(env)

        evaluator = Evaluator(
            tracked_env_factory, policy_factory=tracked_policy_factory, max_steps=50
        )
        assert len(creation_thread_names) == 0
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert len(creation_thread_names) == 2
            for name in creation_thread_names:
                assert name != "MainThread", f"Expected creation on worker thread, got {name}"
        finally:
            evaluator.shutdown()

    def test_lazy_init_with_weights(self):
        train_policy = _make_policy()
        evaluator = Evaluator(_make_env, policy_factory=lambda env: _make_policy(env), max_steps=50)
        try:
            evaluator.trigger_eval(weights=train_policy, step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
class TestEvaluatorProcess:
    def _evaluator(self, **kwargs):
        return Evaluator(
            _make_env, policy_factory=_make_policy, max_steps=50, backend="process", **kwargs
        )

    def test_sync_eval(self):
        evaluator = self._evaluator()
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert "eval/episode_length" in metrics
            assert isinstance(metrics["eval/reward"], float)
        finally:
            evaluator.shutdown()

    def test_async_trigger_and_wait(self):
        evaluator = self._evaluator()
        try:
            evaluator.trigger_eval(step=0)
            assert evaluator.pending
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
            assert not evaluator.pending
        finally:
            evaluator.shutdown()

    def test_async_trigger_and_poll(self):
        evaluator = self._evaluator()
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.poll(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_with_weights(self):
        train_policy = _make_policy()
        evaluator = self._evaluator()
        try:
            metrics = evaluator.evaluate(weights=train_policy, step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_multiple_evals(self):
        evaluator = self._evaluator()
        try:
            for i in range(3):
                evaluator.trigger_eval(step=i)
                result = evaluator.wait(timeout=30)
                assert result is not None
                assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_step_provenance(self):
        evaluator = self._evaluator()
        try:
            metrics = evaluator.evaluate(step=456)
            assert metrics["eval/step"] == 456
        finally:
            evaluator.shutdown()

    def test_video_recorder_dumps_to_process_logger(self, tmp_path):
        process_logger = ProcessLogger(_VideoEventsLogger, str(tmp_path))
        evaluator = Evaluator(
            partial(_make_video_env, process_logger.client()),
            policy_factory=_make_policy,
            num_trajectories=2,
            max_steps=10,
            dump_video=True,
            backend="process",
        )
        try:
            evaluator.evaluate(step=3)
            evaluator.evaluate(step=7)
            process_logger.flush(timeout=30)
            records = _read_video_events(tmp_path)
            assert [record[:2] for record in records] == [["eval_video", "3"], ["eval_video", "7"]]
            assert all(int(record[2]) > 0 for record in records)
        finally:
            evaluator.shutdown()
            process_logger.shutdown(timeout=30)

    def test_dump_video_dispatches_compose_dump_in_worker(self, tmp_path):
        dump_path = tmp_path / "dump-step"
        evaluator = Evaluator(
            partial(_make_dump_env, str(dump_path)),
            policy_factory=_make_policy,
            max_steps=50,
            dump_video=True,
            backend="process",
        )
        try:
            evaluator.evaluate(step=456)
            assert dump_path.read_text() == "456"
        finally:
            evaluator.shutdown()

    def test_callback(self):
        results = []
        evaluator = self._evaluator(on_result=results.append)
        try:
            evaluator.evaluate(step=42)
            assert len(results) == 1
            assert results[0]["eval/step"].item() == 42
        finally:
            evaluator.shutdown()

    def test_requires_callable_env(self):
        env = _make_env()
        with pytest.raises(ValueError, match="callable"):
            Evaluator(env, policy_factory=_make_policy, max_steps=50, backend="process")

    def test_requires_policy_factory(self):
        with pytest.raises(ValueError, match="policy_factory"):
            Evaluator(_make_env, policy=_make_policy(), max_steps=50, backend="process")


def _make_batched_env(num_envs=4, max_steps=5):
    """Create a batched env with StepCounter + RewardSum for testing."""
    return TransformedEnv(
        SerialEnv(
            num_envs,
            lambda: TransformedEnv(ContinuousActionVecMockEnv(), StepCounter(max_steps=max_steps)),
        ),
        RewardSum(),
    )


def _make_batched_env_no_reward_sum(num_envs=4, max_steps=5):
    """Batched env without RewardSum (fallback path)."""
    return SerialEnv(
        num_envs,
        lambda: TransformedEnv(ContinuousActionVecMockEnv(), StepCounter(max_steps=max_steps)),
    )


class TestEvaluatorBatchedMetrics:
    def test_batched_env_reports_num_episodes(self):
        env = _make_batched_env(num_envs=4, max_steps=5)
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=20, num_trajectories=5)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/num_episodes" in metrics
            assert metrics["eval/num_episodes"] == 5
            assert "eval/reward" in metrics
            assert "eval/reward_std" in metrics
        finally:
            evaluator.shutdown()

    def test_num_trajectories_controls_episode_count(self):
        env = _make_batched_env(num_envs=4, max_steps=5)
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=20, num_trajectories=3)
        try:
            metrics = evaluator.evaluate(step=0)
            assert metrics["eval/num_episodes"] == 3
        finally:
            evaluator.shutdown()

    def test_single_env_with_collector(self):
        env = _make_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=100, num_trajectories=2)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert metrics["eval/num_episodes"] == 2
        finally:
            evaluator.shutdown()

    def test_fallback_without_reward_sum(self):
        env = _make_batched_env_no_reward_sum(num_envs=4, max_steps=5)
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=20, num_trajectories=3)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert isinstance(metrics["eval/reward"], float)
        finally:
            evaluator.shutdown()

    def test_cat_traj_format_metrics(self):
        env = _make_batched_env(num_envs=4, max_steps=5)
        policy = _make_policy(env)
        evaluator = Evaluator(
            env, policy, max_steps=20, num_trajectories=3, collector_kwargs={"traj_format": "cat"}
        )
        try:
            metrics = evaluator.evaluate(step=0)
            assert metrics["eval/num_episodes"] == 3
            assert "eval/reward" in metrics
            assert "eval/episode_length" in metrics
        finally:
            evaluator.shutdown()

    def test_episode_length_from_step_count(self):
        env = _make_batched_env(num_envs=4, max_steps=5)
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=20, num_trajectories=4)
        try:
            metrics = evaluator.evaluate(step=0)
            assert 1 <= metrics["eval/episode_length"] <= 6
        finally:
            evaluator.shutdown()

    def test_missing_traj_info_fallback(self):
        """Adapted: ``episode_metrics`` for ``_extract_metrics_from_trajectories``; without a mask
        or trajectory ids the batch is cut at its done flags (none here: one trajectory), and
        there is no ``on_missing_traj_info`` to call."""
        num_steps = 6
        batch = TensorDict(
            {
                ("next", "reward"): torch.ones(num_steps, 1),
                ("next", "done"): torch.zeros(num_steps, 1, dtype=torch.bool),
            },
            batch_size=[num_steps],
        )
        metrics = episode_metrics(batch, ("next", "reward"), ("next", "done"), None, 0.0)
        assert metrics["num_episodes"] == 1
        assert metrics["reward"] == pytest.approx(float(num_steps))

    def test_batched_async_metrics(self):
        env = _make_batched_env(num_envs=4, max_steps=5)
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=20, num_trajectories=4)
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert result["eval/num_episodes"] == 4
            assert "eval/reward_std" in result
        finally:
            evaluator.shutdown()


class TestEvaluatorErrors:
    def test_no_policy_raises(self):
        with pytest.raises(ValueError, match="policy.*must be provided"):
            Evaluator(_make_env, max_steps=50)

    def test_both_policy_and_factory_raises(self):
        with pytest.raises(ValueError, match="not both"):
            Evaluator(
                _make_env,
                policy=_make_policy(),
                policy_factory=lambda env: _make_policy(env),
                max_steps=50,
            )

    def test_invalid_backend_raises(self):
        with pytest.raises(ValueError, match="Unknown backend"):
            Evaluator(_make_env, policy=_make_policy(), max_steps=50, backend="invalid")

    def test_invalid_busy_policy_raises(self):
        with pytest.raises(ValueError, match="Unknown busy_policy"):
            Evaluator(_make_env, policy=_make_policy(), max_steps=50, busy_policy="replace")


class TestEvaluatorWeightsDict:
    def test_weights_dict_policy_only(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(weights_dict={"policy": train_policy}, step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_weights_backward_compat(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(weights=train_policy, step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_weights_and_weights_dict_merged(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(weights=train_policy, weights_dict={}, step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_async_weights_dict(self):
        env = _make_env()
        policy = _make_policy(env)
        train_policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            evaluator.trigger_eval(weights_dict={"policy": train_policy}, step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
class TestEvaluatorProcessBackendAsMultiCollector:
    """``backend="process"`` runs a one-worker ``MultiSyncCollector``; adapted: its collector is
    ``evaluator.collector`` (TorchRL's ``evaluator._backend._collector``)."""

    def _evaluator(self, **kwargs):
        kwargs.setdefault("policy_factory", _make_policy)
        return Evaluator(_make_env, max_steps=50, backend="process", **kwargs)

    def test_process_backend_sync_eval(self):
        evaluator = self._evaluator()
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert "eval/episode_length" in metrics
        finally:
            evaluator.shutdown()

    def test_process_backend_async_eval(self):
        evaluator = self._evaluator()
        try:
            evaluator.trigger_eval(step=0)
            result = evaluator.wait(timeout=30)
            assert result is not None
            assert "eval/reward" in result
        finally:
            evaluator.shutdown()

    def test_process_backend_with_weights(self):
        train_policy = _make_policy()
        with torch.no_grad():
            for parameter in train_policy.parameters():
                parameter.fill_(1.25)
        evaluator = self._evaluator()
        try:
            metrics = evaluator.evaluate(weights=train_policy, step=0)
            assert "eval/reward" in metrics
            worker_state = evaluator.collector.state_dict()["worker0"]["policy_state_dict"]
            for key, value in train_policy.state_dict().items():
                torch.testing.assert_close(worker_state[key], value)
        finally:
            evaluator.shutdown()

    def test_process_backend_stateless_policy_without_weights(self):
        """Adapted: weights for a policy without any are a TypeError of ours (TorchRL's message
        says "requires an nn.Module policy")."""
        action_spec = _make_env().action_spec
        evaluator = self._evaluator(policy_factory=partial(RandomPolicy, action_spec))
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert not evaluator.collector._weight_sync_schemes
            with pytest.raises(TypeError):
                evaluator.evaluate(weights=TensorDict({"weight": torch.ones(())}))
        finally:
            evaluator.shutdown()

    def test_process_backend_enables_weights_after_unweighted_eval(self):
        """Adapted: the first weights after an evaluation without any reach the worker (our
        collector lays its weight transport out then; TorchRL rebuilds its collector)."""
        train_policy = _make_policy()
        with torch.no_grad():
            for parameter in train_policy.parameters():
                parameter.fill_(1.25)
        evaluator = self._evaluator()
        try:
            evaluator.evaluate(step=0)
            evaluator.evaluate(weights=train_policy, step=1)
            worker_state = evaluator.collector.state_dict()["worker0"]["policy_state_dict"]
            for key, value in train_policy.state_dict().items():
                torch.testing.assert_close(worker_state[key], value)
        finally:
            evaluator.shutdown()

    def test_process_backend_requires_callable(self):
        env = _make_env()
        with pytest.raises(ValueError, match="callable"):
            Evaluator(env, policy_factory=_make_policy, max_steps=50, backend="process")

    def test_process_backend_requires_policy_factory(self):
        with pytest.raises(ValueError, match="policy_factory"):
            Evaluator(_make_env, policy=_make_policy(), max_steps=50, backend="process")


def _make_vecnorm_env():
    return TransformedEnv(
        ContinuousActionVecMockEnv(), VecNormV2(in_keys=["observation"], out_keys=["observation"])
    )


def _vecnorm(env) -> VecNormV2:
    """The env's VecNormV2 (a collector that adds a StepCounter holds it in a Compose)."""
    transforms = list(env.transform) if isinstance(env.transform, Compose) else [env.transform]
    return next(t for t in transforms if isinstance(t, VecNormV2))


class TestEvaluatorVecNormFreeze:
    def test_freeze_vecnorm_utility(self):
        """Adapted: ``freeze_norms`` for TorchRL's ``_freeze_vecnorm``."""
        env = _make_vecnorm_env()
        assert not env.transform.frozen
        freeze_norms(env)
        assert env.transform.frozen

    def test_freeze_vecnorm_nested(self):
        """Adapted: ``freeze_norms`` for TorchRL's ``_freeze_vecnorm``."""
        vecnorm = VecNormV2(in_keys=["observation"], out_keys=["observation"])
        env = TransformedEnv(ContinuousActionVecMockEnv(), Compose(StepCounter(), vecnorm))
        assert not vecnorm.frozen
        freeze_norms(env)
        assert vecnorm.frozen

    def test_evaluator_freezes_eager_env(self):
        env = _make_vecnorm_env()
        policy = _make_policy(env)
        assert not env.transform.frozen
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            assert env.transform.frozen
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
        finally:
            evaluator.shutdown()

    def test_evaluator_freezes_factory_env(self):
        """Adapted: the env the evaluations step is ``evaluator.collector.env``."""
        frozen_flags = []

        def tracked_env_factory():
            env = _make_vecnorm_env()
            frozen_flags.append(env.transform.frozen)
            return env

        evaluator = Evaluator(tracked_env_factory, policy_factory=_make_policy, max_steps=50)
        try:
            metrics = evaluator.evaluate(step=0)
            assert "eval/reward" in metrics
            assert frozen_flags[0] is False
            assert _vecnorm(evaluator.collector.env).frozen
        finally:
            evaluator.shutdown()

    def test_wrap_plain_callable_frozen(self):
        """Adapted: ``WorkerSetup(...).env`` (what a worker process builds) for TorchRL's
        ``_wrap_env_factory_frozen``."""
        env = WorkerSetup(_make_vecnorm_env, _make_policy).env()
        assert isinstance(env, TransformedEnv)
        assert env.transform.frozen
        env.close()

    def test_frozen_vecnorm_stats_not_updated(self):
        env = _make_vecnorm_env()
        policy = _make_policy(env)
        evaluator = Evaluator(env, policy, max_steps=50)
        try:
            td = env.reset()
            env.transform.frozen = False
            env.step(policy(td))
            env.transform.freeze()
            count_before = env.transform._count.clone()
            evaluator.evaluate(step=0)
            count_after = env.transform._count.clone()
            assert (count_before == count_after).all(), "VecNormV2 count was updated during eval"
        finally:
            evaluator.shutdown()
