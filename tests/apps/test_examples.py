"""The PPO code, the ``rpc-collectors demo`` command and the examples, in short runs.

The in-process tests check the PPO pieces (episode returns, GAE, one training iteration) on
the single-process ``Collector``. The ``multiprocess`` tests run the demo and each example as
a user would, in a subprocess with a timeout, and check exit codes, output and the run record.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensordict import TensorDict

from procs import ctrl_c_raises
from rpc_collectors import Collector, GymEnv
from rpc_collectors.apps import demo, ppo
from rpc_collectors.apps.cli import build_parser, main
from rpc_collectors.cluster import requeue

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIMEOUT = 100  # seconds for one subprocess; the pytest timeout is 120


def run(args: list[str], cwd: Path = ROOT, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run a command to completion, or fail the test after ``timeout`` seconds.

    The command runs in a session of its own, killed whole afterwards: no process it started
    (torchrun's ranks, say) outlives the test.
    """
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args} did not finish within {timeout} s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rpc_collectors.apps.cli", "demo", *args]


# --------------------------------------------------------------------- in-process: PPO pieces
def test_episode_returns_span_batches():
    """Rewards of one trajectory add up across batches; only ended episodes are reported."""
    returns = ppo.EpisodeReturns()
    traj = torch.tensor([0, 0, 0, 1, 1])
    done = torch.tensor([False, False, True, False, False])
    batch = TensorDict({("collector", "traj_ids"): traj, ("next", "reward"): torch.ones(5, 1),
                        ("next", "done"): done.unsqueeze(-1)}, batch_size=[5])
    assert returns.update(batch) == [3.0]
    batch2 = TensorDict({("collector", "traj_ids"): torch.tensor([1, 2]), ("next", "reward"): torch.full((2, 1), 2.0),
                         ("next", "done"): torch.tensor([[True], [False]])}, batch_size=[2])
    assert returns.update(batch2) == [4.0]  # 1 + 1 + 2
    assert returns.partial == {2: 2.0}


def test_episode_returns_of_collector_batches_match_episode_lengths():
    """CountEnv's reward at step t is t, so an episode of length n returns n(n+1)/2."""
    lengths = (3, 5, 2)
    collector = Collector(GymEnv("CountEnv-v0", num_envs=2, lengths=lengths), None, frames_per_batch=14, total_frames=70)
    returns = ppo.EpisodeReturns()
    seen = [r for batch in collector for r in returns.update(batch)]
    assert seen and set(seen) <= {n * (n + 1) / 2 for n in lengths}


def test_gae_matches_a_plain_loop():
    torch.manual_seed(0)
    T, gamma, lam = 7, 0.9, 0.8
    reward, value, next_value = torch.randn(2, T), torch.randn(2, T), torch.randn(2, T)
    terminated = torch.zeros(2, T, dtype=torch.bool)
    truncated = torch.zeros(2, T, dtype=torch.bool)
    terminated[0, 2], truncated[1, 4] = True, True
    done = terminated | truncated
    adv, target = ppo.gae(reward, value, next_value, terminated, done, gamma, lam)
    for row in range(2):
        running = 0.0
        for t in reversed(range(T)):
            if done[row, t]:
                running = 0.0
            bootstrap = 0.0 if terminated[row, t] else gamma * next_value[row, t]
            running = reward[row, t] + bootstrap - value[row, t] + gamma * lam * running
            assert adv[row, t] == pytest.approx(float(running), abs=1e-5)
    torch.testing.assert_close(target, adv + value)


def test_train_pushes_weights_after_every_batch():
    torch.manual_seed(0)
    cfg = ppo.PPOConfig(epochs=1)
    actor, critic = ppo.make_agent("CartPole-v1", cfg.hidden)
    policy = ppo.make_policy(actor)
    collector = Collector(GymEnv("CartPole-v1", num_envs=2), policy, frames_per_batch=256, total_frames=768)
    its = list(ppo.train(collector, policy, critic, cfg))
    assert [it.frames for it in its] == [256, 512, 768]
    assert [it.policy_lag for it in its] == [0, 0, 0]
    assert collector.policy_version == 3
    assert all(set(it.losses) == {"policy_loss", "value_loss", "entropy", "clip_fraction"} for it in its)


def test_make_agent_rejects_continuous_actions():
    with pytest.raises(ValueError, match="Discrete action space"):
        ppo.make_agent("Pendulum-v1")


def test_cli_parses_the_demo_options():
    args = build_parser().parse_args(["demo", "--workers", "3", "--total-frames", "10", "--seed", "4",
                                      "--env", "Acrobot-v1", "--async", "--output-dir", "out"])
    assert (args.workers, args.total_frames, args.seed, args.env, args.sync, args.output_dir) == (
        3, 10, 4, "Acrobot-v1", False, Path("out"))
    assert build_parser().parse_args(["demo"]).sync is True


def test_cli_rejects_zero_workers():
    with pytest.raises(SystemExit, match="--workers=0"):
        main(["demo", "--workers", "0"])



def test_cli_rejects_a_bad_checkpoint_folder_before_any_process_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=f"--checkpoint-dir='{blocker}/ckpt' is not a writable folder"):
        main(["demo", "--checkpoint-dir", str(blocker / "ckpt")])
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.pt").write_bytes(b"garbage")
    with pytest.raises(SystemExit, match=f"{tmp_path / 'ckpt' / 'checkpoint.pt'} is not a readable checkpoint"):
        main(["demo", "--checkpoint-dir", str(tmp_path / "ckpt")])
    with pytest.raises(SystemExit, match="--checkpoint-every=0"):
        main(["demo", "--checkpoint-dir", str(tmp_path / "other"), "--checkpoint-every", "0"])


def test_cli_rejects_a_bad_trace_before_any_process_starts(tmp_path):
    with pytest.raises(SystemExit, match=f"--trace='{tmp_path}/no/t.json' cannot be written in '{tmp_path}/no'"):
        main(["demo", "--trace", str(tmp_path / "no" / "t.json")])
    with pytest.raises(SystemExit, match="--trace-rounds=0 is invalid; accepted: an int > 0"):
        main(["demo", "--trace", str(tmp_path / "t.json"), "--trace-rounds", "0"])
def test_cli_rejects_bad_metrics_before_any_process_starts(tmp_path):
    with pytest.raises(SystemExit, match="--metrics: metrics='grafana:3000' is invalid; accepted"):
        main(["demo", "--metrics", "grafana:3000"])
    with pytest.raises(SystemExit, match=r"--metrics: Export\(batches\)=0 is invalid; accepted: an int > 0"):
        main(["demo", "--metrics", f"jsonl:{tmp_path / 'm.jsonl'}", "--metrics-batches", "0"])
    with pytest.raises(SystemExit, match=r"--metrics: metrics=JsonLines\(.*\): path=.* is a folder; accepted: a file path"):
        main(["demo", "--metrics", f"jsonl:{tmp_path}"])


def test_plot_is_skipped_with_a_notice_without_matplotlib(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    record = {"episodes": [], "curve": [], "settings": {"env": "CartPole-v1", "workers": 2, "sync": True}}
    assert demo.plot_curve(record, tmp_path / "curve.png") is None
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "curve.png").exists()


# ------------------------------------------------------------------ subprocesses: as a user runs them
@pytest.mark.multiprocess
def test_demo_short_run_writes_record_and_summary(tmp_path):
    out = tmp_path / "run"
    result = run(demo_command("--total-frames", "2048", "--seed", "1", "--output-dir", str(out)))
    assert result.returncode == 0, result.stderr
    for row in ("frames", "wall time", "frames/s", "worker 0 frames/s", "worker 1 frames/s", "final return"):
        assert row in result.stdout
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "frame budget spent"
    assert record["frames"] >= 2048
    assert record["settings"]["workers"] == 2 and record["settings"]["sync"] is True
    assert set(record["worker_frames_per_s"]) == {"0", "1"}
    assert [p["policy_lag"] for p in record["curve"]] == [0] * len(record["curve"])
    assert record["episodes"], "no episode ended in 2048 CartPole frames"
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "learning_curve.png").stat().st_size > 0
    else:
        assert "learning curve skipped" in result.stdout


@pytest.mark.multiprocess
def test_the_demos_first_screen_has_no_warning_the_user_did_not_cause(tmp_path):
    """README's command 1 with the default frame budget (a low target ends it soon)."""
    result = run(demo_command("--target-return", "30", "--output-dir", str(tmp_path / "run")))
    assert result.returncode == 0, result.stderr
    assert "reached a mean return of 30" in result.stdout
    assert "warning" not in result.stderr.lower(), result.stderr
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["settings"]["total_frames"] % 1024 == 0 and record["settings"]["total_frames"] >= demo.TOTAL_FRAMES


@pytest.mark.multiprocess
def test_demo_writes_a_timeline_of_its_first_batches(tmp_path):
    out, trace = tmp_path / "run", tmp_path / "timeline.json"
    result = run(demo_command("--total-frames", "2048", "--output-dir", str(out), "--trace", str(trace),
                              "--trace-rounds", "2"))
    assert result.returncode == 0, result.stderr
    assert f"timeline: {trace}" in result.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    names = sorted(e["args"]["name"].split(" (")[0] for e in events if e["name"] == "process_name")
    assert names == ["trainer", "worker 0", "worker 1"]
    assert sum(e["name"] == "hand-out" for e in events) == 2
    # 128 steps of 4 envs per worker and batch
    assert sum(e["name"] == "env" for e in events) == 2 * 2 * 128
def test_demo_writes_its_metrics_to_tensorboard_and_json_lines(tmp_path):
    out = tmp_path / "run"
    result = run(demo_command("--total-frames", "2048", "--output-dir", str(out), "--metrics-batches", "1",
                              "--metrics", f"tensorboard:{out / 'tb'}", "--metrics", f"jsonl:{out / 'metrics.jsonl'}"))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1024, 2048]  # a batch of 2 workers x 4 envs x 128 steps each
    assert [[w["frames"] for w in line["metrics"]["workers"]] for line in lines] == [[512, 512], [1024, 1024]]
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("collector/frames")] == [(1024, 1024), (2048, 2048)]
    assert "warning" not in result.stderr.lower()


@pytest.mark.multiprocess
def test_demo_that_reaches_its_target_early_closes_its_progress_bar_as_done_with_the_reason(tmp_path):
    out = tmp_path / "run"
    result = run(demo_command("--total-frames", "1000000", "--target-return", "10", "--output-dir", str(out)))
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "run.json").read_text())["status"] == "reached 10"
    final = result.stderr.replace("\r", "\n").strip().splitlines()[-1]  # the bar as the run left it
    assert final.startswith("reached 10: 100%|"), final


@pytest.mark.multiprocess
def test_demo_async_short_run(tmp_path):
    out = tmp_path / "run"
    result = run(demo_command("--async", "--total-frames", "2048", "--output-dir", str(out)))
    assert result.returncode == 0, result.stderr
    record = json.loads((out / "run.json").read_text())
    assert record["frames"] >= 2048 and record["settings"]["sync"] is False
    assert all(p["policy_lag"] >= 0 for p in record["curve"])


@pytest.mark.multiprocess
def test_demo_ctrl_c_stops_cleanly_and_keeps_the_record(tmp_path):
    """SIGINT to the whole process group, as Ctrl-C in a terminal: exit 130, no process left."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        demo_command("--total-frames", "10000000", "--target-return", "1e9", "--output-dir", str(out)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=ctrl_c_raises,
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TIMEOUT / 2
        while "ret=" not in "".join(stderr):  # the progress bar shows a finished batch
            assert proc.poll() is None, f"the demo exited early:\n{''.join(stderr)}"
            assert time.monotonic() < deadline, f"no batch within {TIMEOUT / 2} s:\n{''.join(stderr)}"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, _ = proc.communicate(timeout=TIMEOUT / 2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, "".join(stderr)
    assert "interrupted" in stdout
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "interrupted" and record["frames"] > 0
    deadline = time.monotonic() + 10
    while True:  # every process of the group (the workers too) is gone
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the demo are still alive after Ctrl-C"
        time.sleep(0.2)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_demo_stopped_for_a_requeue_resumes_and_its_record_lists_both_allocations(tmp_path, monkeypatch):
    """As in a requeueable SLURM job: SIGTERM (preemption) in the middle of a run checkpoints after
    the batch and ends the demo with Requeued; started again, the demo resumes there and its
    run.json shows each allocation's start, frames and how it ended."""
    ckpt = tmp_path / "ckpt"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR2), torch.get_num_threads()
    requeue.install(trainer=True, max_requeues=1)

    def stop_after_the_first_checkpoint() -> None:
        deadline = time.monotonic() + TIMEOUT
        while not (ckpt / "checkpoint.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_after_the_first_checkpoint, daemon=True)
    try:
        stopper.start()
        args = build_parser().parse_args(["demo", "--total-frames", "1024000", "--target-return", "1e9",
                                          "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"])
        with pytest.raises(requeue.Requeued):
            demo.run(args)
    finally:
        stopper.join(TIMEOUT)
        requeue.reset()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGUSR2, previous[1])
        torch.set_num_threads(previous[2])
        os.environ.pop(requeue.ENV_REQUEUE, None)
    stopped = json.loads((ckpt / "run.json").read_text())
    first = stopped["allocations"][0]
    assert len(stopped["allocations"]) == 1 and first["end"] == requeue.STOPPED and first["job_id"] == "7"
    assert stopped["status"].startswith(f"stopped ({requeue.STOPPED})") and first["frames"] == stopped["frames"] > 0
    total = first["frames"] + 2048
    monkeypatch.delenv("SLURM_JOB_ID")
    result = run(demo_command("--total-frames", str(total), "--target-return", "1e9", "--checkpoint-dir", str(ckpt)))
    assert result.returncode == 0, result.stderr
    assert f"resumed from {ckpt / 'checkpoint.pt'} at {first['frames']:,} frames" in result.stdout
    record = json.loads((ckpt / "run.json").read_text())
    assert record["status"] == "frame budget spent" and record["frames"] == total
    assert [(a["start_frames"], a["frames"], a["end"]) for a in record["allocations"]] == [
        (0, first["frames"], requeue.STOPPED), (first["frames"], total, "finished")]
    frames = [point["frames"] for point in record["curve"]]
    assert frames == list(range(1024, total + 1, 1024)), "the record lost or repeated batches across the resume"


@pytest.mark.multiprocess
def test_ppo_example_short_run():
    result = run([sys.executable, str(EXAMPLES / "ppo.py"), "--total-frames", "2048"])
    assert result.returncode == 0, result.stderr
    assert "frames    1,024" in result.stdout and "policy lag 0" in result.stdout
    assert "after 2,048 frames" in result.stdout


@pytest.mark.multiprocess
def test_ppo_example_resumes_from_its_checkpoint(tmp_path):
    first = run([sys.executable, str(EXAMPLES / "ppo.py"), "--total-frames", "2048", "--checkpoint-dir", str(tmp_path)])
    assert first.returncode == 0, first.stderr
    assert f"checkpoint saved to {tmp_path / 'checkpoint.pt'} at 2,048 frames" in first.stdout
    second = run([sys.executable, str(EXAMPLES / "ppo.py"), "--total-frames", "3072", "--checkpoint-dir", str(tmp_path)])
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "at 2,048 frames (allocation 2)" in second.stdout
    assert "frames    1,024" not in second.stdout and "frames    3,072" in second.stdout, second.stdout
    assert "policy lag 0" in second.stdout and "after 3,072 frames" in second.stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("eval_on", ["process", "worker"])
def test_ppo_with_evaluator_example_short_run(tmp_path, eval_on):
    """The evaluator's worker (its own, or the collector's) evaluates each batch's weights beside
    training; every result names the weights version it evaluated, and the last is the final
    weights' (2 batches: version 2)."""
    result = run([sys.executable, str(EXAMPLES / "ppo_with_evaluator.py"), "--total-frames", "2048",
                  "--eval-every", "1", "--eval-episodes", "2", "--eval-on", eval_on,
                  "--output-dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    evaluations = json.loads((tmp_path / "run.json").read_text())["evaluations"]
    assert evaluations[-1]["eval/step"] == 2048 and evaluations[-1]["eval/policy_version"] == 2
    assert all(e["eval/policy_version"] == e["eval/step"] // 1024 for e in evaluations)
    assert all(e["eval/num_episodes"] == 2 for e in evaluations)
    # the collector's metrics hold the last result and the count of them
    scalars = json.loads((tmp_path / "run.json").read_text())["metrics"]
    assert scalars["eval/results"] == len(evaluations) and scalars["eval/step"] == 2048
    assert "final eval at   2,048 frames (weights v2)" in result.stdout
    assert "run record:" in result.stdout


@pytest.mark.multiprocess
def test_torchrun_example_short_run():
    """Rank 0 trains, ranks 1 and 2 serve collectors and exit 0 with it."""
    result = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                  str(EXAMPLES / "torchrun_train.py"), "--total-frames", "2048"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "after 2,048 frames" in result.stdout


@pytest.mark.multiprocess
def test_offpolicy_async_example_short_run():
    result = run([sys.executable, str(EXAMPLES / "offpolicy_async.py"), "--total-frames", "2000",
                  "--learning-starts", "500", "--push-every", "10"])
    assert result.returncode == 0, result.stderr
    assert "grad steps" in result.stdout and "pushed to" in result.stdout
    assert "done: " in result.stdout
