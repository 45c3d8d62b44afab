"""Inference per node: ``inference="node"`` with node collectors (``collector_class="sync"|"async"``).

Each node runs one policy for its local workers. Checked on this host (local launcher) and
across namespace hosts (slurm/devcluster.py's ``HostNetwork``, namespaces ``rpcc-ni-*``, subnet
10.91.0.0/24), with tests/scripts/node_collectors_trainer.py on every rank as tests/worker/test_node_collectors.py runs it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch import nn

import devcluster_module
from folders import PYTHONPATH
from multihost_trainer import ArgmaxPolicy
from procs import descendants, killed_at_exit
from rpc_collectors import (
    DistributedCollector,
    GymEnv,
    MultiCollector,
    RPCCollector,
    WorkerError,
    WorkerRestartWarning,
)
from rpc_collectors.transport.data import IN_FLIGHT
from test_node_collectors import (
    SCRIPT,
    Run,
    assert_killed_local_worker_is_one_worker_error,
    assert_same_frames,
    point,
    processes_left,
)

PREFIX, SUBNET, MASTER_PORT = "rpcc-ni", "10.91.0", 29591
VERSION, WORKER_ID, TRAJ_IDS = ("collector", "policy_version"), ("collector", "worker_id"), ("collector", "traj_ids")


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1")


def push_left(policy: ArgmaxPolicy) -> None:
    point(policy, 0)


def run_with_pushes(inference: str, batches: int, **kwargs) -> list:
    """Sync node batches, with the same new weights pushed after each."""
    torch.manual_seed(0)
    policy = ArgmaxPolicy()
    out = []
    with RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=2 * 2 * 20, launcher="local",
                      collector_class="sync", num_workers_per_collector=2, cat_results="stack",
                      track_policy_version=True, inference=inference, **kwargs) as c:
        c.set_seed(3)
        for i, batch in enumerate(c):
            out.append(batch.clone())
            if len(out) == batches:
                break
            with torch.no_grad():
                for param in policy.parameters():
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(i)))
            c.update_policy_weights_()
    return out


# --------------------------------------------------------------------------- bad input


class TensorDictCallable:
    def __call__(self, td):
        td["action"] = torch.zeros(td.batch_size, dtype=torch.int64)
        return td


@pytest.mark.parametrize("policy, kwargs, words", [
    ("argmax", {"collector_class": "sync", "num_workers_per_collector": 2, "inference": "gpu"},
     ["inference='gpu'", "'worker'", "'node'"]),
    ("argmax", {"inference": "node"}, ["inference='node'", "collector_class='single'", "'sync' or 'async'"]),
    (None, {"collector_class": "sync", "num_workers_per_collector": 2, "inference": "node"},
     ["policy=None", "TensorDictModule", "nn.Module"]),
    ("callable", {"collector_class": "async", "num_workers_per_collector": 2, "inference": "node"},
     ["policy=", "in_keys", "TensorDictModule"]),
])
def test_bad_inference_arguments_fail_before_any_process(policy, kwargs, words):
    policy = {"argmax": ArgmaxPolicy(), "callable": TensorDictCallable(), None: None}[policy]
    before = descendants()
    with pytest.raises(ValueError) as err:
        RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=40, launcher="local", **kwargs)
    assert all(word in str(err.value) for word in words), str(err.value)
    assert descendants() == before


@pytest.mark.parametrize("cls, kwargs", [(DistributedCollector, {"launcher": "mp", "num_collectors": 2}),
                                         (MultiCollector, {"num_workers": 2})])
def test_every_class_with_node_collectors_refuses_node_inference_without_them(cls, kwargs):
    before = descendants()
    with pytest.raises(ValueError, match="inference='node' needs node collectors"):
        cls(make_env, ArgmaxPolicy(), frames_per_batch=40, inference="node", **kwargs)
    assert descendants() == before


def test_node_inference_takes_no_policy_factory():
    with pytest.raises(ValueError, match="inference='node'.*policy_factory=None"):
        RPCCollector(make_env, None, policy_factory=ArgmaxPolicy, num_collectors=2, frames_per_batch=40,
                     launcher="local", collector_class="sync", num_workers_per_collector=2, inference="node")


# --------------------------------------------------------------------------- on this host


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_node_inference_gives_the_batches_of_a_policy_in_every_local_worker(no_leftover_processes):
    per_worker = run_with_pushes("worker", 4)
    per_node = run_with_pushes("node", 4)
    assert per_node[0].shape == (2, 2, 20)
    for a, b in zip(per_worker, per_node):
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert a.get(key).dtype == b.get(key).dtype and torch.equal(a.get(key), b.get(key)), key
    # every push is in the very next batch of every local worker of both nodes
    assert [b[VERSION].unique().tolist() for b in per_node] == [[0], [1], [2], [3]]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_node_inference_matches_flat_workers_frame_for_frame(no_leftover_processes):
    nodes = run_with_pushes("node", 3)
    torch.manual_seed(0)
    policy = ArgmaxPolicy()
    flat = []
    with RPCCollector(make_env, policy, num_collectors=4, frames_per_batch=4 * 20, launcher="local",
                      cat_results="stack", track_policy_version=True) as c:
        c.set_seed(3)
        for i, batch in enumerate(c):
            flat.append(batch.clone())
            if len(flat) == 3:
                break
            with torch.no_grad():
                for param in policy.parameters():
                    param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(i)))
            c.update_policy_weights_()
    assert_same_frames(flat, nodes, 2)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_async_nodes_run_the_pushed_weights_from_their_next_step(no_leftover_processes):
    policy = ArgmaxPolicy()
    with RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=20, launcher="local", sync=False,
                      collector_class="async", num_workers_per_collector=2, track_policy_version=True,
                      inference="node") as c:
        first = c.next().clone()
        assert [info["inference"] for info in c.infos] == ["node", "node"]
        push_left(policy)
        c.update_policy_weights_()
        later = [c.next().clone() for _ in range(16)]
        assert c.dropped_frames == 0  # the batches begun before the push are handed out, not dropped
    assert first.shape == (20,) and first[VERSION].unique().tolist() == [0]
    for node in (0, 1):
        mine = [b for b in later if int(b[WORKER_ID][0]) == node]
        # begun before the push: the node's answers on their way and its local workers' requests in flight
        assert sum(int(b[VERSION].min() < 1) for b in mine) <= IN_FLIGHT + 2 * IN_FLIGHT
        for b in mine:  # the node's policy took the push at once: each frame's version names its weights
            versions = b[VERSION].tolist()
            assert versions == sorted(versions)
            assert (b["action"][b[VERSION] == 1] == 0).all()
    assert any(b[VERSION].min() == 1 for b in later)


class FailingPolicy(nn.Module):
    """Raises in its forward once its bias is pushed above 100."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.linear.bias[0] > 100:
            raise ValueError("policy forward failed on purpose")
        return self.linear(observation).argmax(-1)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_policy_exception_in_a_node_surfaces_once_with_its_traceback(no_leftover_processes):
    policy = FailingPolicy()
    c = RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=40, launcher="local",
                     collector_class="sync", num_workers_per_collector=2, inference="node", rpc_timeout=30)
    with c:
        c.next()
        with torch.no_grad():
            policy.linear.bias.fill_(1000.0)
        c.update_policy_weights_()
        with pytest.raises(WorkerError) as err:
            c.next()
        with pytest.raises(StopIteration):  # not the same error again: the run ended with it
            c.next()
    text = f"{err.value}\n{err.value.remote_traceback}"
    assert "policy forward failed on purpose" in text
    assert "in forward" in err.value.remote_traceback and "raise ValueError" in err.value.remote_traceback


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_policy_that_fails_on_the_first_step_fails_the_start_with_its_traceback(no_leftover_processes):
    policy = FailingPolicy()
    with torch.no_grad():
        policy.linear.bias.fill_(1000.0)
    with pytest.raises(WorkerError) as err:
        RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=40, launcher="local",
                     collector_class="sync", num_workers_per_collector=2, inference="node", rpc_timeout=30)
    assert "policy forward failed on purpose" in f"{err.value}\n{err.value.remote_traceback}"
    assert "raise ValueError" in err.value.remote_traceback


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_local_worker_killed_under_node_inference_is_one_worker_error(no_leftover_processes):
    assert_killed_local_worker_is_one_worker_error(ArgmaxPolicy(), inference="node")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_local_worker_killed_under_node_inference_is_replaced(no_leftover_processes):
    policy = ArgmaxPolicy()
    with RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=80, launcher="local", cat_results="stack",
                      collector_class="sync", num_workers_per_collector=2, max_worker_restarts=1, inference="node",
                      track_policy_version=True) as c:
        c.next()
        os.kill(c.infos[0]["local_pids"][0], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match="node 0.s local worker 0 died with exit code -9"):
            c.next()
        push_left(policy)
        c.update_policy_weights_()
        after = c.next().clone()
    assert after.shape == (2, 2, 20)
    assert after[VERSION].unique().tolist() == [1] and (after["action"] == 0).all()  # the replacement too


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_node_inference_resumes_from_state_dict_with_its_version(no_leftover_processes):
    args = dict(num_collectors=2, frames_per_batch=80, launcher="local", cat_results="stack", collector_class="sync",
                num_workers_per_collector=2, track_policy_version=True, inference="node")
    with RPCCollector(make_env, ArgmaxPolicy(), **args) as c:
        first = c.next().clone()
        c.update_policy_weights_()
        c.update_policy_weights_()
        state = c.state_dict()
    with RPCCollector(make_env, ArgmaxPolicy(), **args) as d:
        d.load_state_dict(state)
        after = d.next()
    assert after["collector", "policy_version"].unique().tolist() == [2]
    for node in range(2):  # each env's ids keep increasing (ids of env w are w + 4k); none comes back
        for local in range(2):
            old, new = first[TRAJ_IDS][node, local], after[TRAJ_IDS][node, local]
            assert set((new % 4).tolist()) == set((old % 4).tolist()) == {node * 2 + local}
            assert new.min() > old.max()


# --------------------------------------------------------------------------- across namespace hosts


@pytest.fixture
def net() -> Iterator:
    with devcluster_module.host_network(3, PREFIX, SUBNET) as network:
        yield network


class NodeInferenceRun(Run):
    """tests/scripts/node_collectors_trainer.py on the three hosts of this file's network."""

    def __init__(self, net, logdir: Path, *args: str) -> None:
        self.logdir, self.procs = logdir, []
        env = devcluster_module.torchrun_env(3, net.host(1).address, MASTER_PORT)
        env["PYTHONPATH"] = f"{PYTHONPATH}:{os.environ.get('PYTHONPATH', '')}"
        for rank in range(3):
            with open(logdir / f"rank{rank}.out", "wb") as out, open(logdir / f"rank{rank}.err", "wb") as err:
                self.procs.append(net.popen(
                    rank + 1, [sys.executable, str(SCRIPT), *args], env={**env, "RANK": str(rank)},
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=Path(__file__).parents[2],
                    start_new_session=True,
                ))


@pytest.mark.cluster
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_node_inference_on_two_hosts_gives_the_flat_runs_frames(net, tmp_path):
    with killed_at_exit(lambda *args: NodeInferenceRun(net, tmp_path, *args)) as start:
        r = start("--batches", "4", "--out", str(tmp_path), "--inference", "node")
        codes = r.wait(180)
    assert codes == [0, 0, 0], r.report()
    nodes = r.record("start", 1)["nodes"]
    assert [n["address"] for n in nodes] == [net.host(2).address, net.host(3).address]
    assert [n["inference"] for n in nodes] == ["node", "node"]
    node_batches = torch.load(tmp_path / "node.pt", weights_only=False)
    flat_batches = torch.load(tmp_path / "flat.pt", weights_only=False)
    assert node_batches[0].batch_size == (2, 2, 25)
    # each push reached the one policy of each host's node before its next batch
    assert [b["collector", "policy_version"].unique().tolist() for b in node_batches] == [[0], [1], [2], [3]]
    assert_same_frames(flat_batches, node_batches, 2)
    assert not processes_left(net)
