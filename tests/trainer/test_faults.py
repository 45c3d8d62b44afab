"""Failures with real worker processes: killed workers, raising envs, interrupted trainers, bad input."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

from multihost_trainer import ArgmaxPolicy
from procs import ctrl_c_raises, descendants, wait_gone
from rpc_collectors import RPCCollector, WorkerError
from rpc_collectors.worker.spawner import shared_pid

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(60)]


class FailingEnv(gym.Env):
    """CartPole-like spaces; ``step`` raises after ``fail_after`` steps."""

    observation_space = gym.spaces.Box(-1, 1, (4,))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_after: int) -> None:
        self.fail_after, self.steps = fail_after, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        self.steps += 1
        if self.steps > self.fail_after:
            raise ValueError("the simulator lost its licence")
        return self.observation_space.sample(), 1.0, False, False, {}


@pytest.mark.timeout(15)  # the bound from kill to error, start-up included
def test_killed_worker_raises_one_error_naming_it_and_stops_the_rest():
    c = RPCCollector("CartPole-v1", None, num_collectors=2, frames_per_batch=200, total_frames=-1,
                     launcher="local", rpc_timeout=30)
    it = iter(c)
    kept = next(it)
    snapshot = kept.clone()
    victim = c.infos[1]["pid"]
    survivor = c.infos[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerError) as info:
        for _ in range(50):
            next(it)
    err = info.value
    assert err.worker_id == 1 and err.rank == 2 and err.pid == victim
    assert "SIGKILL" in str(err) and "rank 2" in str(err) and err.host in str(err)
    assert not wait_gone({survivor}, 10), "the surviving worker kept running"
    assert (kept == snapshot).all(), "a batch yielded before the failure changed"
    c.shutdown()  # bounded and idempotent after the failure
    c.shutdown()


def test_env_raising_in_a_worker_reports_its_traceback():
    make = [lambda: FailingEnv(10_000), lambda: FailingEnv(150)]
    with pytest.raises(WorkerError) as info:
        with RPCCollector(make, None, frames_per_batch=200, total_frames=-1, launcher="local", rpc_timeout=30) as c:
            for _ in c:
                pass
    err = info.value
    assert err.worker_id == 1
    assert "the simulator lost its licence" in err.remote_traceback
    assert "in step" in err.remote_traceback and "ValueError" in err.remote_traceback


def test_shutdown_is_bounded_with_dead_workers():
    c = RPCCollector("CartPole-v1", None, num_collectors=3, frames_per_batch=300, total_frames=-1,
                     launcher="local", rpc_timeout=30)
    next(iter(c))
    for info in c.infos:
        os.kill(info["pid"], signal.SIGKILL)
    c.shutdown()  # returns (pytest-timeout bounds it) and leaves nothing behind (fixture)
    c.shutdown()


TRAINER_SCRIPT = textwrap.dedent("""
    import sys
    from rpc_collectors import RPCCollector
    c = RPCCollector("CartPole-v1", None, num_collectors=2, frames_per_batch=100, total_frames=-1,
                     launcher="local", rpc_timeout=30)
    print(" ".join(str(i["pid"]) for i in c.infos), flush=True)
    for batch in c:
        pass
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_or_killed_trainer_leaves_no_worker(sig, tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_raises)
    try:
        pids = {int(p) for p in proc.stdout.readline().split()}
        assert len(pids) == 2
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
        if sig == signal.SIGINT:
            assert "KeyboardInterrupt" in stderr
        assert not wait_gone(pids, 15), "workers outlived their trainer"
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ bad input, before any process
@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(num_threads=0), ValueError, ["num_threads", "0"]),
        (dict(exploration_type="greedy"), ValueError, ["exploration_type", "'greedy'", "RANDOM"]),
        (dict(collector_kwargs={"exploration_type": "greedy"}), ValueError, ["exploration_type", "'greedy'"]),
        (dict(launcher="mpi"), ValueError, ["launcher", "'mpi'", "'local'"]),
        (dict(backend="mpi"), ValueError, ["backend", "'mpi'", "'gloo'"]),
        (dict(backend="nccl"), ValueError, ["nccl", "CUDA"]),
        (dict(cat_results=1), ValueError, ["cat_results", "1", "'stack'"]),
        (dict(rpc_timeout=0), ValueError, ["rpc_timeout", "0"]),
        (dict(num_collectors=0), ValueError, ["num_collectors", "0"]),
        (dict(max_weight_update_interval=-2), ValueError, ["max_weight_update_interval", "-2"]),
        (dict(weight_transport="nfs"), ValueError, ["weight_transport", "'nfs'", "'shm'"]),
        (dict(collector_kwargs={"bogus": 1}), ValueError, ["collector_kwargs", "bogus"]),
        (dict(sync="yes"), TypeError, ["sync", "'yes'"]),
        (dict(total_frames=0), ValueError, ["total_frames", "0"]),
        (dict(policy=42), TypeError, ["policy", "42"]),
        (dict(replay_buffer=object()), TypeError, ["replay_buffer", "extend"]),
        (dict(device="tpu9"), ValueError, ["device", "tpu9"]),
    ],
)
def test_bad_arguments_fail_before_any_process_starts(kwargs, error, words):
    args = dict(num_collectors=2, frames_per_batch=100, launcher="local")
    args.update(kwargs)
    policy = args.pop("policy", None)
    before = descendants() - {shared_pid()}
    with pytest.raises(error) as info:
        RPCCollector("CartPole-v1", policy, **args)
    for word in words:
        assert word in str(info.value)
    assert descendants() - {shared_pid()} == before


def test_wrong_list_length_and_world_size(monkeypatch):
    with pytest.raises(ValueError, match="num_collectors=3 does not match the 2 entries"):
        RPCCollector(["CartPole-v1"] * 2, None, num_collectors=3, frames_per_batch=100, launcher="local")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    with pytest.raises(ValueError, match="WORLD_SIZE=4"):
        RPCCollector("CartPole-v1", None, num_collectors=2, frames_per_batch=100, launcher="torchrun")


def test_port_in_use_is_a_clear_error(monkeypatch):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for key, value in dict(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                               TP_SOCKET_IFNAME="lo").items():
            monkeypatch.setenv(key, value)
        with pytest.raises(ValueError, match=f"MASTER_PORT={port} is already in use"):
            RPCCollector("CartPole-v1", None, frames_per_batch=100, launcher="torchrun")


def test_update_weights_without_module_policy_is_a_type_error():
    with RPCCollector("CartPole-v1", None, num_collectors=1, frames_per_batch=50, launcher="debug") as c:
        with pytest.raises(TypeError, match="no weights"):
            c.update_policy_weights_()
    with RPCCollector("CartPole-v1", ArgmaxPolicy(), num_collectors=1, frames_per_batch=50, launcher="debug") as c:
        with pytest.raises(ValueError, match="worker_ids=\\[5\\]"):
            c.update_policy_weights_(worker_ids=[5])
