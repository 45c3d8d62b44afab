"""Small envs for the tests: their observations say where in an episode they are.

``CountEnv`` (gymnasium) and ``TDCountEnv`` (TorchRL's ``EnvBase`` protocol, no gymnasium)
observe ``[t, episode, last action]``; episode ``k`` lasts ``lengths[k % len(lengths)]`` steps
and ends terminated when ``k`` is even, truncated when ``k`` is odd. So a test can tell from a
batch alone whether final observations, resets, truncation and trajectory ids are right.
``FixedAction`` is a linear policy whose weights alone decide its action.
"""
from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch import nn

from folders import FOLDERS

sys.path[:0] = [str(folder) for folder in FOLDERS if str(folder) not in sys.path]  # modules import one another by name


class CountEnv(gym.Env):
    """Gymnasium env observing ``[t, episode, last action]`` (float32); Discrete(2) actions."""

    metadata: dict = {"render_modes": []}

    def __init__(self, lengths=(3, 5, 2), offset: int = 0) -> None:
        self.lengths = [int(n) for n in lengths]
        self.offset = offset  # shifts the episode lengths, so copies in a vector env differ
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.episode, self.t = -1, 0
        self.closed = False

    def _obs(self, action: float) -> np.ndarray:
        return np.array([self.t, self.episode, action], np.float32)

    def length(self) -> int:
        return self.lengths[(self.episode + self.offset) % len(self.lengths)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(-1), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length()
        terminated, truncated = end and self.episode % 2 == 0, end and self.episode % 2 == 1
        return self._obs(float(action)), float(self.t), terminated, truncated, {}

    def close(self) -> None:
        self.closed = True


class FixedAction(nn.Module):
    """Action = argmax(W obs + b) on ``obs_size`` floats; with W = 0 the bias alone picks ``action``,
    so the weights alone decide it."""

    def __init__(self, action: int, obs_size: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(obs_size, 2)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.copy_(torch.eye(2)[action])

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation.float()).argmax(-1)


class TDCountEnv:
    """The same episodes as ``CountEnv`` behind TorchRL's ``EnvBase`` protocol, batch ``[]`` or ``[B]``.

    Env ``i`` of a batch uses ``offset=i``. ``reset(td)`` resets only where ``td["_reset"]`` is
    True; ``reset_masks`` records what each reset was asked to reset.
    """

    def __init__(self, num_envs: int | None = None, lengths=(3, 5, 2)) -> None:
        self.batch_size = torch.Size([] if num_envs is None else [num_envs])
        n = 1 if num_envs is None else num_envs
        self.lengths = torch.tensor(lengths)
        self.offset = torch.arange(n)
        self.t = torch.zeros(n, dtype=torch.long)
        self.episode = torch.full((n,), -1, dtype=torch.long)
        self.last_action = torch.full((n,), -1.0)
        self.generator = torch.Generator().manual_seed(0)
        self.reset_masks: list[torch.Tensor] = []
        self.steps = 0
        self.closed = False

    def _shape(self, x: torch.Tensor, *trailing: int) -> torch.Tensor:
        return x.reshape(*self.batch_size, *trailing)

    def _obs(self) -> torch.Tensor:
        obs = torch.stack([self.t.float(), self.episode.float(), self.last_action], -1)
        return self._shape(obs, 3)

    def _flags(self, terminated: torch.Tensor, truncated: torch.Tensor) -> dict:
        return {
            "done": self._shape(terminated | truncated, 1),
            "terminated": self._shape(terminated, 1),
            "truncated": self._shape(truncated, 1),
        }

    def reset(self, td: TensorDict | None = None) -> TensorDict:
        n = self.t.numel()
        mask = torch.ones(n, dtype=torch.bool)
        if td is not None and "_reset" in td.keys():
            mask = td["_reset"].reshape(n)
        self.reset_masks.append(mask.clone())
        self.episode = torch.where(mask, self.episode + 1, self.episode)
        self.t = torch.where(mask, 0, self.t)
        self.last_action = torch.where(mask, -1.0, self.last_action)
        false = torch.zeros(n, dtype=torch.bool)
        return TensorDict({"observation": self._obs(), **self._flags(false, false)}, batch_size=self.batch_size)

    def step(self, td: TensorDict) -> TensorDict:
        self.steps += 1
        action = td["action"].reshape(-1)
        self.t = self.t + 1
        self.last_action = action.float()
        length = self.lengths[(self.episode + self.offset) % len(self.lengths)]
        end = self.t >= length
        terminated, truncated = end & (self.episode % 2 == 0), end & (self.episode % 2 == 1)
        nxt = TensorDict(
            {"observation": self._obs(), "reward": self._shape(self.t.float(), 1), **self._flags(terminated, truncated)},
            batch_size=self.batch_size,
        )
        td.set("next", nxt)
        return td

    def rand_action(self, td: TensorDict | None = None) -> TensorDict:
        td = TensorDict(batch_size=self.batch_size) if td is None else td
        td.set("action", torch.randint(0, 2, self.batch_size, generator=self.generator))
        return td

    def set_seed(self, seed: int) -> int:
        self.generator.manual_seed(seed)
        return seed + 1

    def close(self) -> None:
        self.closed = True


if "CountEnv-v0" not in gym.registry:
    gym.register("CountEnv-v0", entry_point=CountEnv)


def slow_cartpole(seconds_per_step: float):
    """A ``GymEnv`` of CartPole whose every step takes ``seconds_per_step`` longer."""
    import time

    from rpc_collectors import GymEnv

    env = GymEnv("CartPole-v1")
    step = env.step_arrays

    def slow(action):
        time.sleep(seconds_per_step)
        return step(action)

    env.step_arrays = slow
    return env



@pytest.fixture
def no_leftover_processes():
    """Fail the test if a process it started outlives it (the shared spawner and Python's
    multiprocessing resource tracker, one per interpreter until it exits, excepted)."""
    from multiprocessing import resource_tracker

    from procs import descendants, wait_gone
    from rpc_collectors.worker.spawner import shared_pid

    before = descendants()
    yield
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    assert not wait_gone(descendants() - before - {shared_pid(), tracker}, 10), "worker processes were left behind"


@pytest.fixture
def ctrl_c_raises_here():
    """SIGINT raises KeyboardInterrupt in this process during the test (as in a terminal), also when
    the test run was started with SIGINT ignored; the previous handler comes back afterwards."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------- SLURM dev clusters
# One dev cluster at a time runs on a machine (fixed ports), shared by every SLURM test of the
# session: the tests on one node run together, then those on two (tests/cluster/test_slurm.py and
# tests/cluster/test_requeue_slurm.py), at the end of the session, so each cluster starts once.
CLUSTER_FIXTURES = ("one_node", "two_nodes")


REPORTED = ("torch", "tensordict", "cloudpickle", "gymnasium", "numpy", "submitit", "hypothesis", "prometheus_client", "ray")


def pytest_report_header(config) -> str:
    """The versions the library's behaviour rests on, first in every run: a red run names what moved."""
    import importlib.metadata as metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    return "dependencies: " + ", ".join(f"{name} {version(name)}" for name in REPORTED)


def pytest_configure(config) -> None:
    dist = getattr(config.option, "dist", "no")  # pytest-xdist's option; "load" where -n came alone
    if dist not in ("no", "loadgroup"):
        raise pytest.UsageError(f"--dist {dist}: accepted with -n: --dist loadgroup (one worker runs each "
                                f"xdist_group's tests, e.g. every SLURM test: one dev cluster on a machine)")


def xdist_group(item) -> str | None:
    """The tests that must not run beside each other in two pytest-xdist workers share a group (one
    worker runs a group's tests one after another, in the session's order); None: any worker, any time.

    - every SLURM test: one dev cluster on the machine, started once per worker session;
    - a module's network-namespace hosts (its fixed names, subnet and ports), and a module-scoped
      fixture (a module's own Ray on 127.0.0.1, the warmed process the doc blocks fork from): the module.
    """
    if "slurm_clusters" in item.fixturenames or item.get_closest_marker("slurm"):
        return "slurm"
    fixtures = item._fixtureinfo.name2fixturedefs.values()
    if item.get_closest_marker("cluster") or any(defs[-1].scope == "module" for defs in fixtures):
        return item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list) -> None:
    def order(item) -> int:
        uses = [i for i, name in enumerate(CLUSTER_FIXTURES, start=1) if name in getattr(item, "fixturenames", ())]
        return uses[0] if uses else 0

    items.sort(key=order)  # stable: the order within each group stays
    for item in items:
        group = None if item.get_closest_marker("xdist_group") else xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)  # after the test's own fixtures (their jobs) are torn down
def pytest_runtest_teardown(item, nextitem) -> None:
    """The cluster stops after the session's last SLURM test, not at the end of the session: the
    tests that a pytest-xdist worker runs after its SLURM tests find none of its daemons among
    their process's descendants."""
    if "slurm_clusters" in item.fixturenames and (nextitem is None or "slurm_clusters" not in nextitem.fixturenames):
        item.funcargs["slurm_clusters"].close()


@pytest.fixture(scope="session")
def slurm_clusters():
    """The session's dev cluster pool; stops whatever cluster runs at the end, even after failures."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from devcluster_module import ClusterPool

    root = Path(tempfile.mkdtemp(prefix="rpcc-slurm-"))
    root.chmod(0o755)  # MariaDB runs as user mysql
    pool = ClusterPool(root)
    old_conf = os.environ.get("SLURM_CONF")
    try:
        yield pool
    finally:
        pool.close()
        shutil.rmtree(root)  # MariaDB data dirs: hundreds of MB
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf


def _check_states_every_second(monkeypatch) -> None:
    """``submission.result`` asks SLURM for a job's state every second rather than every 5 s: a
    test that waits for a job's end sees it sooner (the dev cluster's accounting answers at once)."""
    from rpc_collectors.cluster import submission

    monkeypatch.setattr(submission, "STATE_CHECK_S", 1.0)


@pytest.fixture
def one_node(slurm_clusters, monkeypatch):
    """A running one-node dev cluster (on loopback), exported as SLURM_CONF."""
    _check_states_every_second(monkeypatch)
    return slurm_clusters.use(1)


@pytest.fixture
def two_nodes(slurm_clusters, monkeypatch):
    """A running two-node dev cluster (each slurmd in its own network namespace), exported as SLURM_CONF."""
    _check_states_every_second(monkeypatch)
    return slurm_clusters.use(2)
