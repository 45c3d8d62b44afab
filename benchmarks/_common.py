"""Helpers shared by the benchmarks: a latency-bound env, quiet logs, process bookkeeping.

Not a benchmark itself. Worker processes are forked from the trainer, so they import this
module the same way the benchmark script did (``benchmarks/`` is on ``sys.path``).
"""
from __future__ import annotations

import mmap
import os
import resource
import statistics
import subprocess
import time
import warnings

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rpc_collectors import GymEnv


class SleepEnv(gym.Env):
    """An env whose every step sleeps ``step_s`` seconds (a simulator or a remote game server).

    Observations are 4 zeros, actions Discrete(2), an episode lasts ``episode_len`` steps. The
    sleep makes it latency-bound: N copies in N processes should deliver about N times the
    frames/s of one, whatever the number of cores.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, step_s: float = 0.005, episode_len: int = 200) -> None:
        self.step_s, self.episode_len = step_s, episode_len
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs.copy(), {}

    def step(self, action):
        time.sleep(self.step_s)
        self._t += 1
        return self._obs.copy(), 1.0, False, self._t >= self.episode_len, {}


def make_sleep_env(step_s: float = 0.005) -> GymEnv:
    return GymEnv(SleepEnv(step_s))


class NoWorkEnv(gym.Env):
    """An env that does no work: every step returns the same preallocated observation.

    ``shape``/``dtype`` choose the observation (4 floats, an Atari stack, a camera image), so
    what a collector costs per frame and per byte is all that is measured. Episodes last
    ``episode_len`` steps; actions are Discrete(2).
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, shape: tuple = (4,), dtype: str = "float32", episode_len: int = 1000) -> None:
        high = 255 if dtype == "uint8" else 1.0
        self.observation_space = gym.spaces.Box(0, high, tuple(shape), np.dtype(dtype))
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(shape, dtype)
        self.episode_len, self._t = episode_len, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action):
        self._t += 1
        return self._obs, 0.0, False, self._t >= self.episode_len, {}


def make_no_work_env(shape: tuple = (4,), dtype: str = "float32") -> GymEnv:
    return GymEnv(NoWorkEnv(shape, dtype))


def make_pong() -> GymEnv:
    """Pong as Atari agents see it: gymnasium's AtariPreprocessing and a 4-frame stack, 4x84x84 uint8 (needs ale-py)."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env)
    return GymEnv(gym.wrappers.FrameStackObservation(env, 4))


def quiet() -> None:
    """Silence the C++ (TensorPipe/gloo) warnings that shutdown prints; keep errors."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", message=".*as a ProcessGroup.*")


def children_of(pid: int | None = None) -> list[int]:
    """Pids of the living (non-zombie) descendants of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rss_mib(pids: list[int]) -> float:
    """Sum of the private (unshared) memory of ``pids`` in MiB (PSS: shared pages split)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by ``pids`` (living ones)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / tick


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def process_costs(pids: list[int]) -> dict:
    """Of the living ``pids``: how many, and their mean minor page faults, user and system CPU
    milliseconds so far."""
    tick, rows = os.sysconf("SC_CLK_TCK"), []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        rows.append((int(fields[7]), int(fields[11]) * 1e3 / tick, int(fields[12]) * 1e3 / tick))
    if not rows:
        return {"processes": 0, "faults": 0.0, "user_ms": 0.0, "system_ms": 0.0}
    faults, user, system = (statistics.mean(column) for column in zip(*rows))
    return {"processes": len(rows), "faults": faults, "user_ms": user, "system_ms": system}


def fault_costs(processes: int, mib: int = 128) -> tuple[float, float]:
    """System time, in microseconds, a page fault costs here when ``processes`` forked children
    fault at once, each writing one byte of each 4 KiB page of ``mib`` MiB: first of memory it
    shares with its parent (a copy-on-write fault, what a forked worker pays for the interpreter's
    memory it writes), then of new memory (a zero-fill fault). Means over the children."""
    page, pages = mmap.PAGESIZE, (mib << 20) // mmap.PAGESIZE

    def touch(memory: mmap.mmap) -> float:
        view = np.frombuffer(memory, dtype=np.uint8)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        view[::page] = 1
        del view
        return (resource.getrusage(resource.RUSAGE_SELF).ru_stime - before) / pages * 1e6

    shared = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    touch(shared)
    read, write = os.pipe()
    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            fresh = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            os.write(write, f"{touch(shared)} {touch(fresh)}\n".encode())
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    os.close(write)
    with os.fdopen(read) as lines:
        rows = [tuple(map(float, line.split())) for line in lines]
    shared.close()
    return statistics.mean(row[0] for row in rows), statistics.mean(row[1] for row in rows)


def own_cpu_seconds() -> float:
    """User + system CPU seconds used so far by this process (all its threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def push_seconds(collector, it, pushes: int) -> list[float]:
    """The time of each of ``pushes`` calls to ``update_policy_weights_()``, a batch from ``it`` after each."""
    times = []
    for _ in range(pushes):
        start = time.perf_counter()
        collector.update_policy_weights_()
        times.append(time.perf_counter() - start)
        next(it)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def steady_rate(collector, seconds: float, warmup_batches: int = 1) -> float:
    """Frames/s of ``collector`` over about ``seconds`` after ``warmup_batches`` batches."""
    it = iter(collector)
    for _ in range(warmup_batches):
        next(it)
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        frames += next(it).numel()
    return frames / (time.perf_counter() - start)


def run_case(script: str, case: dict, timeout: float = 240.0, flag: str = "--case",
             warnings: bool = False) -> dict:
    """Run one case of ``script`` (``script flag <case as JSON>``) in a fresh Python process;
    return the JSON it prints last. ``warnings``: keep Python's warnings on (in every process the
    case starts) and return the lines of its stderr that name one, as ``"warnings"``.

    One collector per process: a process that has run an RPC agent cannot fork RPC workers
    again (see benchmarks/README.md), and a fresh process keeps cases from disturbing each other.
    The child is killed (its workers die with it) if it runs past ``timeout``.
    """
    import json
    import subprocess
    import sys

    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONWARNINGS="default" if warnings else "ignore")
    proc = subprocess.Popen(
        [sys.executable, script, flag, json.dumps(case)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"case {case} ran past {timeout} s; stderr tail:\n{err[-2000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"case {case} failed (exit code {proc.returncode}); stderr tail:\n{err[-3000:]}")
    result = json.loads(lines[-1])
    if warnings:
        result["warnings"] = [line[:300] for line in err.splitlines() if "Warning" in line]
    return result


def run_on_hosts(net, argv: list[str], env: dict, hosts: list[int], name: str, timeout: float) -> dict:
    """Run ``argv`` as rank r in namespace host ``hosts[r]`` of ``net`` (``slurm/devcluster.py``'s
    ``HostNetwork``; torchrun's variables in ``env``, ``RANK`` added), ranks > 0 under a host name of
    their own (``name`` + host number); return the JSON line rank 0 prints last. Every rank is
    killed if still running at the end."""
    import json
    import subprocess

    procs = []
    try:
        for rank, host in enumerate(hosts):
            cmd = list(argv)
            if rank > 0:  # a machine of its own name: the collector must not take it for the trainer's
                cmd = ["unshare", "--uts", "sh", "-c", f'hostname {name}{host} && exec "$@"', "sh", *cmd]
            procs.append(net.popen(host, cmd, env={**env, "RANK": str(rank), "LOCAL_RANK": "0"},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        out, err = procs[0].communicate(timeout=timeout)
        for proc in procs[1:]:
            proc.wait(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if procs[0].returncode != 0 or not lines:
        raise RuntimeError(f"the trainer failed ({procs[0].returncode})\n{err[-3000:]}")
    return json.loads(lines[-1])


def reap(procs: list[subprocess.Popen], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for each of ``procs``; kill and reap one that outlives it."""
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def emit(result: dict) -> None:
    """Print a case's result as the JSON line ``run_case`` reads."""
    import json

    print(json.dumps(result), flush=True)


class ArgmaxLinear(nn.Module):
    """CartPole policy: ``argmax(Linear(4, 2)(observation))``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs).argmax(-1)


def devcluster():
    """``slurm/devcluster.py``, loaded by path (it is a script, not a module of the package)."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "devcluster", Path(__file__).resolve().parents[1] / "slurm" / "devcluster.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["devcluster"] = module
    spec.loader.exec_module(module)
    return module
