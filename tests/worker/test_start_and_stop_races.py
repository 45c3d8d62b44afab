"""The failure promises under hostile timing: deaths and Ctrl-C during start-up and shutdown,
dropped collectors, inherited descriptors, leftover files, late or vague errors, noise.

Each test hits its window on purpose: it kills or stops the pid the spawner reports, or sends
SIGINT to the main thread from a helper thread once the collector reached the state under test.
"""
from __future__ import annotations

import dataclasses
import gc
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch import nn

from conftest import slow_cartpole
from folders import PYTHONPATH
from procs import descendants, wait_gone
from rpc_collectors import GymEnv, RPCCollector, WorkerError
from rpc_collectors.worker import spawner
from rpc_collectors.worker.channel import Channel
from rpc_collectors.worker.spawner import Spawner, shared_pid

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(60)]


def interrupt_when(condition, timeout: float = 30.0) -> threading.Thread:
    """Send SIGINT (Ctrl-C) to the main thread, from a helper thread, as soon as ``condition()`` holds
    (the test takes the ``ctrl_c_raises_here`` fixture: SIGINT raises KeyboardInterrupt there)."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "use the ctrl_c_raises_here fixture"
    main = threading.main_thread().ident

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                signal.pthread_kill(main, signal.SIGINT)
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def after_spawning(monkeypatch, action) -> list[int]:
    """Run ``action(rank, pid)`` on every worker the spawner starts, as soon as it reported the pid.

    The shared spawner is started first: one forked while ``Spawner.spawn`` is patched would keep
    the patch, and so would every worker it forks, node collectors' own spawners included."""
    spawner.shared_spawner()
    real = Spawner.spawn
    pids: list[int] = []

    def spawn(self, target, args, timeout, on_exit):
        pid = real(self, target, args, timeout, on_exit)
        pids.append(pid)
        action(args[0], pid)
        return pid

    monkeypatch.setattr(Spawner, "spawn", spawn)
    return pids


class ArgmaxLinear(nn.Linear):
    """A linear policy for CartPole: the argmax of its two outputs is the action."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return super().forward(observation).argmax(-1)


def collector(**kwargs) -> RPCCollector:
    args = dict(num_collectors=2, frames_per_batch=100, launcher="local", rpc_timeout=30)
    args.update(kwargs)
    return RPCCollector(args.pop("create_env_fn", "CartPole-v1"), args.pop("policy", None), **args)


def works_again() -> None:
    """A new collector can be made in this process, and its bookkeeping names its own workers."""
    with collector() as c:
        assert set(c.workers.pids) == {info["pid"] for info in c.infos}
        assert next(iter(c)).shape == torch.Size([100])  # two workers of 50 frames, concatenated


def run_script(tmp_path, body: str, **popen) -> subprocess.Popen:
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **popen)


# ------------------------------------------------------------------ 1. deaths during start-up
def signal_when_spawned(monkeypatch, rank: int, sig: int) -> list:
    """Send ``sig`` to the worker of ``rank`` as soon as the spawner reports its pid; returns [pid]."""
    signalled = []

    def send(spawned_rank, pid):
        if spawned_rank == rank:
            os.kill(pid, sig)
            signalled.append(pid)

    after_spawning(monkeypatch, send)
    return signalled


@pytest.mark.timeout(20)  # the store would time out after rpc_timeout=60 s
def test_worker_dying_during_start_up_is_a_worker_error_naming_it(monkeypatch):
    killed = signal_when_spawned(monkeypatch, 2, signal.SIGKILL)
    with pytest.raises(WorkerError) as info:
        collector(rpc_timeout=60)
    err = info.value
    assert err.worker_id == 1 and err.rank == 2 and err.pid == killed[0]
    assert "SIGKILL" in str(err) and "start-up" in str(err) and socket.gethostname() in err.host
    monkeypatch.undo()
    works_again()


TRAINER_PID = os.getpid()


def env_that_kills_its_worker():
    if os.getpid() != TRAINER_PID:
        os.kill(os.getpid(), signal.SIGKILL)
    return GymEnv("CartPole-v1")


@pytest.mark.timeout(20)
def test_worker_dying_while_it_builds_its_collector_is_a_worker_error_naming_it():
    """After its hello, before the collector is up: still a death during start-up, not a restart."""
    with pytest.raises(WorkerError) as info:
        collector(create_env_fn=["CartPole-v1", env_that_kills_its_worker], rpc_timeout=60, max_worker_restarts=2)
    err = info.value
    assert err.worker_id == 1 and err.rank == 2
    assert str(err).endswith("died with exit code -9 (SIGKILL) during start-up")
    works_again()


# a stopped or interrupted worker is killed at shutdown, which warns
KILLED_AT_SHUTDOWN = "ignore:worker processes .* did not exit within:RuntimeWarning"

@pytest.mark.timeout(20)
@pytest.mark.usefixtures("ctrl_c_raises_here")
@pytest.mark.filterwarnings(KILLED_AT_SHUTDOWN)
def test_ctrl_c_while_a_stopped_worker_holds_up_the_rendezvous(monkeypatch):
    stopped = signal_when_spawned(monkeypatch, 2, signal.SIGSTOP)
    interrupt_when(lambda: stopped and time.sleep(0.3) is None)
    with pytest.raises(KeyboardInterrupt):
        collector(rpc_timeout=60)
    assert not wait_gone(set(stopped), 10), "the stopped worker outlived the interrupted constructor"
    monkeypatch.undo()
    works_again()


# ------------------------------------------------------------------ 2. Ctrl-C during construction
@pytest.mark.usefixtures("ctrl_c_raises_here")
def test_ctrl_c_while_spawning_leaves_no_stale_reply():
    held = spawner.shared_spawner()
    os.kill(held.pid, signal.SIGSTOP)  # the reply to the first request comes only after the Ctrl-C
    try:
        started = time.monotonic()
        interrupt_when(lambda: time.monotonic() - started > 0.3)
        with pytest.raises(KeyboardInterrupt):
            collector()
    finally:
        os.kill(held.pid, signal.SIGCONT)
    works_again()


def test_tiny_rpc_timeout_leaves_no_stale_reply():
    with pytest.raises((TimeoutError, WorkerError, RuntimeError)):
        collector(rpc_timeout=0.001)
    works_again()


def test_a_worker_given_up_on_never_opens_the_next_channels_pipes():
    """A worker spawned for a collector that gave up on it (its spawn ran past rpc_timeout, or
    Ctrl-C) may come to open its ends after the trainer closed them, when their numbers name the
    next collector's pipes: it must refuse them, not say hello there (the trainer would take the
    hello as its new worker's, and close the ends that worker has yet to open)."""
    spawner.shared_spawner()  # its pipes are made first: the numbers below are the channels'
    given_up = Channel()
    ends = given_up.ends
    given_up.close()
    fresh = Channel()
    changed, codes = threading.Event(), []
    fresh.hello.add_done_callback(lambda _f: changed.set())
    pid = None
    try:
        assert fresh.ends.request == ends.request, "the test needs the closed number reused"
        pid = spawner.shared_spawner().spawn(
            "rpc_collectors.worker.local_worker:local_main", [1, None, *dataclasses.astuple(ends)], 30,
            lambda _pid, code: (codes.append(code), changed.set()),
        )
        assert changed.wait(30), "the late worker neither exited nor said hello"
        assert not fresh.hello.done(), f"the late worker (pid {pid}) said hello on the next collector's channel"
        assert codes == [1], "the late worker did not fail at start-up"
    finally:
        fresh.close()
        if pid is not None:
            spawner.shared_spawner().reap([pid], 10)


def slow_env():
    time.sleep(3)
    return GymEnv("CartPole-v1")


@pytest.mark.usefixtures("ctrl_c_raises_here")
@pytest.mark.filterwarnings(KILLED_AT_SHUTDOWN)
def test_ctrl_c_while_the_workers_build_their_collectors_leaves_no_worker(monkeypatch):
    pids = after_spawning(monkeypatch, lambda rank, pid: None)
    spawned = []
    interrupt_when(lambda: len(pids) == 2 and (spawned.append(time.monotonic()) or time.monotonic() - spawned[0] > 0.3))
    with pytest.raises(KeyboardInterrupt):
        collector(create_env_fn=slow_env)
    assert len(pids) == 2 and not wait_gone(set(pids), 10), "a worker outlived the interrupted constructor"
    monkeypatch.undo()
    works_again()


# ------------------------------------------------------------------ 3. Ctrl-C during shutdown
@pytest.mark.usefixtures("ctrl_c_raises_here")
@pytest.mark.filterwarnings(KILLED_AT_SHUTDOWN)
def test_second_shutdown_finishes_an_interrupted_one():
    c = collector()
    next(iter(c))
    pids = {info["pid"] for info in c.infos}
    os.kill(c.infos[1]["pid"], signal.SIGSTOP)  # its stop request waits: shutdown() takes a while
    entered = time.monotonic()
    interrupt_when(lambda: time.monotonic() - entered > 0.5)
    with pytest.raises(KeyboardInterrupt):
        c.shutdown()
    c.shutdown()
    assert not wait_gone(pids, 10), "workers kept running after the second shutdown()"
    works_again()


# ------------------------------------------------------------------ 4. dropped collectors
def test_dropped_collector_is_collected_and_cleans_up():
    c = collector(sync=False)
    next(c.iterator())  # both workers now have requests in flight
    pids = {info["pid"] for info in c.infos}
    del c
    gc.collect()
    assert not wait_gone(pids, 10), "a dropped collector's workers kept running"
    works_again()


# ------------------------------------------------------------------ 5. inherited descriptors
def test_spawner_and_workers_do_not_inherit_the_trainers_descriptors(tmp_path):
    proc = run_script(tmp_path, """
        import os, socket, sys
        listener = socket.socket()
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        from rpc_collectors import RPCCollector
        from rpc_collectors.worker.spawner import shared_pid
        c = RPCCollector("CartPole-v1", None, num_collectors=2, frames_per_batch=100, launcher="local")
        pids = [shared_pid()] + [i["pid"] for i in c.infos]
        print(os.fstat(listener.fileno()).st_ino, *pids, flush=True)
        sys.stdin.readline()
        c.shutdown()
    """, stdin=subprocess.PIPE)
    try:
        inode, *pids = map(int, proc.stdout.readline().split())
        for pid in pids:
            held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            assert f"socket:[{inode}]" not in held, f"process {pid} holds the trainer's listening socket"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.communicate()


# ------------------------------------------------------------------ 6. the weights file
def test_trainer_killed_while_workers_join_leaves_no_weights_file(tmp_path):
    before = set(glob.glob("/dev/shm/rpc_collectors_weights_*"))
    proc = run_script(tmp_path, """
        import os, signal
        from torch import nn
        from rpc_collectors import RPCCollector
        from rpc_collectors.pools.local import LocalPool

        call = LocalPool.call
        def die_on_join(self, worker_id, method, *args):
            if method == "join_weights":  # the window: the file exists, no worker mapped it yet
                os.kill(os.getpid(), signal.SIGKILL)
            return call(self, worker_id, method, *args)
        LocalPool.call = die_on_join
        class Argmax(nn.Linear):
            def forward(self, observation):
                return super().forward(observation).argmax(-1)
        RPCCollector("CartPole-v1", Argmax(4, 2), num_collectors=2, frames_per_batch=100, launcher="local")
    """)
    try:
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
    assert not glob.glob(f"/dev/shm/rpc_collectors_weights_{proc.pid}_*")
    time.sleep(1.0)  # other trainers' files on this host are short-lived; a leftover stays
    left = {p for p in set(glob.glob("/dev/shm/rpc_collectors_weights_*")) - before if os.path.exists(p)}
    assert not left, f"weights files left behind: {left}"


# ------------------------------------------------------------------ 7. arguments, before any process
class LockedEnvFactory:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self):
        return GymEnv("CartPole-v1")


class LockedPolicy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.lock = threading.Lock()


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(rpc_timeout=float("nan")), ValueError, ["rpc_timeout", "nan", "accepted"]),
        (dict(rpc_timeout=float("inf")), ValueError, ["rpc_timeout", "inf", "accepted"]),
        (dict(rpc_timeout=1e12), ValueError, ["rpc_timeout", "1000000000000.0", "accepted"]),
        (dict(collector_kwargs={"init_random_frames": -5}), ValueError, ["collector_kwargs['init_random_frames']", "-5"]),
        (dict(collector_kwargs={"device": "cuda"}), ValueError, ["collector_kwargs['device']", "'cuda'"]),
        (dict(device="meta"), ValueError, ["device", "'meta'", "'cpu'"]),
        (dict(device="mps"), ValueError, ["device", "'mps'", "'cpu'"]),
        (dict(device="xpu"), ValueError, ["device", "'xpu'", "'cpu'"]),
        (dict(create_env_fn=LockedEnvFactory()), TypeError, ["create_env_fn[0]", "pickle"]),
        (dict(policy=LockedPolicy()), TypeError, ["policy=", "pickle"]),
        (dict(create_env_fn="NoSuchEnv-v0"), ValueError, ["create_env_fn", "'NoSuchEnv-v0'", "CartPole-v1"]),
    ],
)
def test_bad_arguments_fail_before_any_process_starts(kwargs, error, words):
    before = descendants() - {shared_pid()}
    with pytest.raises(error) as info:
        collector(**kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)
    assert descendants() - {shared_pid()} == before


def test_unknown_gym_id_in_gymenv_is_a_value_error():
    with pytest.raises(ValueError, match="'NoSuchEnv-v0'"):
        GymEnv("NoSuchEnv-v0")


# ------------------------------------------------------------------ 8. errors that say what they know
@pytest.mark.timeout(30)
def test_stopped_worker_is_reported_as_not_answering_within_rpc_timeout():
    c = collector(rpc_timeout=3)
    it = iter(c)
    next(it)
    os.kill(c.infos[0]["pid"], signal.SIGSTOP)
    stopped = time.monotonic()
    with pytest.raises(WorkerError) as info:
        for _ in range(100):
            next(it)
    assert time.monotonic() - stopped <= 3 + 2, "reported later than rpc_timeout + 2 s"
    assert info.value.worker_id == 0 and "did not answer within rpc_timeout=3.0 s" in str(info.value)
    assert "unreachable" not in str(info.value)
    c.shutdown()


@pytest.mark.timeout(90)
def test_a_stopped_async_worker_is_reported_while_the_other_keeps_delivering():
    """Async batches come first-ready first-served; the other worker's batches never stand in for
    a stopped worker's answer: its request times out after rpc_timeout like any other wait."""
    paced = lambda: slow_cartpole(0.002)  # noqa: E731
    c = collector(create_env_fn=[paced, paced], num_collectors=None, sync=False, frames_per_batch=20, rpc_timeout=3)
    try:
        it, delivered = iter(c), set()
        for _ in range(1000):  # both workers delivered (a loaded machine may start one late)
            next(it)
            delivered |= set(c.last_batch.worker_frames)
            if delivered == {0, 1}:
                break
        assert delivered == {0, 1}
        os.kill(c.infos[1]["pid"], signal.SIGSTOP)
        from_0 = 0
        with pytest.raises(WorkerError) as info:
            for _ in range(1000):  # about 40 s of worker 0's batches
                next(it)
                from_0 += 0 in c.last_batch.worker_frames
        assert info.value.worker_id == 1 and "did not answer within rpc_timeout=3.0 s" in str(info.value)
        assert from_0 > 0
    finally:
        c.shutdown()


class RaisingEnvFactory:
    def __call__(self):
        raise OSError("the simulator binary is missing")


def test_debug_launcher_reports_a_raised_error_with_its_traceback():
    with pytest.raises(WorkerError) as info:
        collector(create_env_fn=RaisingEnvFactory(), launcher="debug")
    err = info.value
    assert "raised an error" in str(err) and "unreachable" not in str(err)
    assert "the simulator binary is missing" in err.remote_traceback and "__call__" in err.remote_traceback


def step_slowly():
    return slow_cartpole(0.05)


def test_shutdown_from_another_thread_does_not_blame_a_worker():
    c = collector(create_env_fn=step_slowly, frames_per_batch=400)
    started = time.monotonic()
    threading.Timer(0.5, c.shutdown).start()
    with pytest.raises(RuntimeError) as info:
        next(iter(c))
    assert not isinstance(info.value, WorkerError) and "shut down" in str(info.value)
    assert time.monotonic() - started < 30


def test_calls_after_shutdown_and_bad_arguments_are_clear_errors():
    c = collector(policy=ArgmaxLinear(4, 2), launcher="debug")
    with pytest.raises(ValueError, match="worker_ids=True"):
        c.update_policy_weights_(worker_ids=True)
    with pytest.raises(TypeError, match="seed='abc'"):
        c.set_seed("abc")
    # the first tensor that differs, in key order
    with pytest.raises(ValueError, match=r"policy_or_weights: weight 'bias' is torch.float32 \[3\], the policy has "
                                         r"torch.float32 \[2\]"):
        c.update_policy_weights_(nn.Linear(4, 3))
    with pytest.raises(ValueError, match="policy_or_weights: weight 'bias' is absent"):
        c.update_policy_weights_({"weight": torch.zeros(2, 4)})
    c.shutdown()
    with pytest.raises(RuntimeError, match="was shut down"):
        c.update_policy_weights_()
    with pytest.raises(RuntimeError, match="was shut down"):
        c.set_seed(1)


# ------------------------------------------------------------------ 9. a quiet, named, closed run
def test_clean_run_is_quiet_names_its_processes_and_closes_its_store(tmp_path):
    proc = run_script(tmp_path, """
        import os, sys
        from procs import listening_addresses
        from rpc_collectors import RPCCollector
        from rpc_collectors.worker.spawner import shared_pid
        from test_rpc_collector import BiasPolicy
        for _ in range(2):
            c = RPCCollector("CartPole-v1", BiasPolicy(), num_collectors=2, frames_per_batch=100, launcher="local")
            it = iter(c)
            next(it)
            c.update_policy_weights_()
            next(it)
            print(shared_pid(), *[i["pid"] for i in c.infos], flush=True)
            sys.stdin.readline()
            c.shutdown()
            print(len(listening_addresses(os.getpid())), flush=True)
    """, stdin=subprocess.PIPE)
    try:
        for _ in range(2):
            spawner_pid, *workers = map(int, proc.stdout.readline().split())
            names = [open(f"/proc/{pid}/comm").read().strip() for pid in [spawner_pid, *workers]]
            assert names == ["rpc-spawner", "rpc-worker0", "rpc-worker1"]
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "0", "the trainer still listens after shutdown()"
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 0
        noisy = [line for line in stderr.splitlines() if re.search(r"error|warn|EOF|closed|^\[[WE]", line, re.I)]
        assert not noisy, "\n".join(noisy)
    finally:
        proc.kill()
        proc.communicate()


# ------------------------------------------------------------------ 10. ports in TIME_WAIT
def time_wait_port() -> int:
    """A loopback port whose only trace is a connection in TIME_WAIT (this side closed first)."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: it keeps the port in TIME_WAIT
        client.recv(1)
        client.close()
    return port


def test_a_port_in_time_wait_counts_as_free():
    from rpc_collectors.cluster.task_hosts import _check_port_free
    from rpc_collectors.transport.rendezvous import serve_store

    port = time_wait_port()
    _check_port_free(port)  # as the store binds it, so does the check
    store, bound = serve_store("127.0.0.1", port, 5.0)
    assert bound == port
    del store
