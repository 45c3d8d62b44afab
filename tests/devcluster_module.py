"""``slurm/devcluster.py`` (a script, not a package) loaded as the module ``devcluster``, and the
one dev cluster that every SLURM test of a session shares (:class:`ClusterPool`)."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

PATH = Path(__file__).resolve().parents[1] / "slurm" / "devcluster.py"


def load() -> ModuleType:
    """The module, loaded once per process."""
    if "devcluster" not in sys.modules:
        spec = importlib.util.spec_from_file_location("devcluster", PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["devcluster"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["devcluster"]


class ClusterPool:
    """Holds at most one running dev cluster (they use fixed ports); asking for another node count
    stops the running one first. tests/conftest.py runs the tests of each node count together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cluster = None

    def use(self, nodes: int):
        """A running cluster of ``nodes`` nodes, exported as SLURM_CONF (sbatch and sacct read it)."""
        if self.cluster is None or len(self.cluster.nodes) != nodes:
            self.close()
            self.cluster = load().start(nodes, self.root / f"{nodes}nodes")
            import submitit

            submitit.SlurmJob.watcher.clear()  # job ids restart: forget the last cluster's states
        os.environ["SLURM_CONF"] = str(self.cluster.slurm_conf)
        return self.cluster

    def close(self) -> None:
        if self.cluster is not None:
            load().stop(self.cluster.workdir)
            self.cluster = None


@contextlib.contextmanager
def host_network(hosts: int, prefix: str, subnet: str) -> Iterator:
    """``hosts`` namespace hosts for one test, deleted afterwards with every process in them.

    Without root the test fails rather than skips (CI runs as root); a namespace that cannot be
    made raises, so the test errors."""
    if os.geteuid() != 0:
        pytest.fail("namespace hosts need root (network namespaces); CI runs the tests as root")
    network = load().HostNetwork(hosts, prefix=prefix, subnet=subnet)
    network.create()
    try:
        yield network
    finally:
        network.teardown()


def namespace_pids(net) -> dict[str, list[int]]:
    """Pids of every process in each of ``net``'s namespaces (bridge included)."""
    names = [host.netns for host in net.hosts] + [net.bridge_netns]
    return {
        name: [int(p) for p in subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                              text=True).stdout.split()]
        for name in names
    }


def torchrun_env(world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """This environment as torchrun would set it for the ranks of one run (each adds its RANK),
    without the variables of a torchrun or SLURM job the tests themselves may run in."""
    env = {
        **os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port), "PYTHONUNBUFFERED": "1",
    }
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_JOB_ID", "SLURM_NTASKS"):
        env.pop(name, None)
    return env
