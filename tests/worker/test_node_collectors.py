"""Node collectors: ``collector_class="sync"|"async"`` with ``num_workers_per_collector=W``.

Each of the trainer's workers is a node that runs W local worker processes and answers with
one batch. Checked on this host (local launcher: nodes are local worker processes that run
local workers of their own) and across namespace hosts (slurm/devcluster.py's ``HostNetwork``,
namespaces ``rpcc-nc-*``, subnet 10.86.0.0/24): the trainer in host 1, a node in each of hosts
2 and 3, every rank running tests/scripts/node_collectors_trainer.py with torchrun's variables.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
from torch import nn

import devcluster_module
from devcluster_module import namespace_pids
from folders import PYTHONPATH
from multihost_trainer import ArgmaxPolicy
from procs import descendants, kill_sessions, killed_at_exit, wait_gone
from rpc_collectors import (
    Collector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RPCCollector,
    WorkerError,
    WorkerRestartWarning,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "node_collectors_trainer.py"
PREFIX, SUBNET, MASTER_PORT = "rpcc-nc", "10.86.0", 29586
TRAJ_IDS, WORKER_ID = ("collector", "traj_ids"), ("collector", "worker_id")


def make_env() -> GymEnv:
    return GymEnv("CartPole-v1")


def collect(batches: int, launcher: str = "local", **kwargs) -> list:
    with RPCCollector(make_env, None, frames_per_batch=4 * 20, cat_results="stack", launcher=launcher,
                      track_policy_version=True, **kwargs) as c:  # frames with their versions and worker ids
        c.set_seed(5)
        return [batch.clone() for _, batch in zip(range(batches), c)]


def assert_same_frames(flat: list, nodes: list, per_node: int) -> None:
    """Node batches ``[N, W, T]`` hold, frame for frame, the flat run's ``[N*W, T]`` (worker ids aside)."""
    assert len(flat) == len(nodes)
    for f, n in zip(flat, nodes):
        assert n.shape[1] == per_node and n.reshape(f.shape).shape == f.shape
        keys = set(f.keys(True, True)) - {WORKER_ID}
        assert keys == set(n.keys(True, True)) - {WORKER_ID}
        for key in keys:
            assert torch.equal(n.reshape(f.shape).get(key), f.get(key)), key
        node_ids = torch.arange(n.shape[0]).reshape(-1, 1, 1).expand(n.shape)
        assert torch.equal(n.get(WORKER_ID), node_ids)  # the trainer's worker: the node


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("collector_class, per_node, words", [
    ("multi", 2, ["collector_class='multi'", "'single', 'sync', 'async'"]),
    (nn.Module, 2, ["collector_class=<class 'torch.nn.modules.module.Module'>", "MultiSyncCollector"]),
    ("sync", 0, ["num_workers_per_collector=0", "int >= 1"]),
    ("async", 2.0, ["num_workers_per_collector=2.0", "int >= 1"]),
    ("single", 2, ["num_workers_per_collector=2", "collector_class='single'", "accepted", "1"]),
    (Collector, 3, ["num_workers_per_collector=3", "Collector", "1"]),
])
def test_bad_node_arguments_fail_before_any_process(collector_class, per_node, words):
    before = descendants()
    with pytest.raises(ValueError) as err:
        RPCCollector(make_env, None, num_collectors=2, frames_per_batch=40, launcher="local",
                     collector_class=collector_class, num_workers_per_collector=per_node)
    assert all(word in str(err.value) for word in words), str(err.value)
    assert descendants() == before


def test_a_subclass_is_not_taken_for_its_base():
    class Mine(MultiSyncCollector):
        pass

    with pytest.raises(ValueError, match="collector_class=.*Mine.*accepted"):
        RPCCollector(make_env, None, num_collectors=2, frames_per_batch=40, launcher="local",
                     collector_class=Mine, num_workers_per_collector=2)


# --------------------------------------------------------------------------- on this host


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("collector_class, launcher", [("sync", "local"), (MultiSyncCollector, "local"), ("sync", "debug")])
def test_sync_nodes_give_the_flat_runs_frames(collector_class, launcher, no_leftover_processes):
    flat = collect(3, num_collectors=4)
    nodes = collect(3, launcher, num_collectors=2, collector_class=collector_class, num_workers_per_collector=2)
    assert nodes[0].shape == (2, 2, 20) and flat[0].shape == (4, 20)
    assert_same_frames(flat, nodes, 2)


class TablePolicy(nn.Module):
    """argmax of ``Linear(4, 2)``, and the sum of a table of 2M floats: a spec larger than a pipe holds."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.table = nn.Parameter(torch.rand(2_000_000, generator=torch.Generator().manual_seed(0)), requires_grad=False)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(observation).argmax(-1), self.table.double().sum().expand(observation.shape[:-1])


def shared_files(pid: int) -> list[str]:
    """The shared-memory files of large specs that process ``pid`` holds open."""
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return [link for link in links if "rpc_collectors_bytes_" in link]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_large_policy_reaches_every_local_worker_whole_and_leaves_no_shared_file(no_leftover_processes):
    from tensordict.nn import TensorDictModule

    policy = TablePolicy()
    expected = float(policy.table.double().sum())
    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action", "table_sum"])
    with RPCCollector(make_env, module, num_collectors=2, frames_per_batch=4 * 20, launcher="local",
                      collector_class="sync", num_workers_per_collector=2, cat_results="stack") as c:
        batch = c.next()
        assert batch.shape == (2, 2, 20)
        assert (batch["table_sum"] == expected).all()  # every frame of every local worker of both nodes
        for pid in [os.getpid()] + [info["pid"] for info in c.infos]:
            assert shared_files(pid) == [], pid


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_default_layout_concatenates_node_batches_as_torchrl():
    # TorchRL's RPCCollector torch.cat()s its nodes' [W, T] batches
    with RPCCollector(make_env, None, num_collectors=2, frames_per_batch=80, launcher="local",
                      collector_class="sync", num_workers_per_collector=2) as c:
        batch = c.next()
    assert batch.shape == (4, 20) and batch.names == [None, "time"]
    assert batch[TRAJ_IDS][:, 0].tolist() == [0, 1, 2, 3]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_async_nodes_yield_one_local_workers_batch_with_unique_ids(no_leftover_processes):
    frames = 30
    with RPCCollector(make_env, None, num_collectors=2, frames_per_batch=frames, launcher="local", sync=False,
                      collector_class=MultiAsyncCollector, num_workers_per_collector=2, total_frames=frames * 12,
                      track_policy_version=True) as c:
        batches = [batch.clone() for batch in c]
    assert len(batches) == 12 and all(b.shape == (frames,) for b in batches)
    nodes = {int(b[WORKER_ID][0]) for b in batches}
    assert nodes == {0, 1}
    # a node's local worker w is the flat run's worker node * W + w: its ids are that worker's, mod N * W
    residues = {(int(b[WORKER_ID][0]), int(b[TRAJ_IDS][0]) % 4) for b in batches}
    assert residues <= {(0, 0), (0, 1), (1, 2), (1, 3)} and len(residues) >= 3, residues


def point(policy: ArgmaxPolicy, action: int) -> None:
    """Make ``policy`` choose ``action`` whatever it observes."""
    with torch.no_grad():
        policy.linear.weight.zero_()
        policy.linear.bias.copy_(torch.eye(2)[action])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_unbounded_async_nodes_hand_out_what_their_local_workers_collected_before_a_push(no_leftover_processes):
    """A push after every batch, the action flipped by each: nothing is dropped, and every frame's version names
    the weights that chose it (version v: action 1 - v % 2), also in the local batches begun before a push."""
    policy = ArgmaxPolicy()
    point(policy, 1)
    with RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=20, launcher="local", sync=False,
                      collector_class="async", num_workers_per_collector=2, track_policy_version=True) as c:
        batches = []
        for batch in c:
            batches.append(batch.clone())
            if len(batches) == 16:
                break
            point(policy, 1 - (c.policy_version + 1) % 2)
            c.update_policy_weights_()
        assert c.dropped_frames == c.dropped_batches == 0
    version = ("collector", "policy_version")
    for b in batches:
        assert b[version].unique().numel() == 1  # a local worker takes a push between its batches
        assert torch.equal(b["action"].reshape(-1), 1 - b[version] % 2)
    assert len({int(b[version][0]) for b in batches}) >= 2  # the pushes reached the local workers


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_weights_reach_every_local_worker_once_per_push():
    policy = ArgmaxPolicy()
    with RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=40, launcher="local",
                      collector_class="sync", num_workers_per_collector=2, cat_results="stack",
                      track_policy_version=True) as c:
        first = c.next()
        point(policy, 0)  # always push left
        c.update_policy_weights_()
        second = c.next()
    assert first["collector", "policy_version"].unique().tolist() == [0]
    assert second["collector", "policy_version"].unique().tolist() == [1]
    assert (second["action"] == 0).all()  # every local worker of every node runs the pushed weights


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_local_worker_killed_on_a_node_is_one_worker_error_naming_node_and_worker(no_leftover_processes):
    assert_killed_local_worker_is_one_worker_error(None)


def assert_killed_local_worker_is_one_worker_error(policy, **kwargs) -> None:
    """SIGKILL node 1's local worker 1: the next batches raise one WorkerError naming the node and the worker."""
    c = RPCCollector(make_env, policy, num_collectors=2, frames_per_batch=80, launcher="local",
                     collector_class="sync", num_workers_per_collector=2, rpc_timeout=20, **kwargs)
    with c:
        c.next()
        node = c.infos[1]
        victim = node["local_pids"][1]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(WorkerError) as err:
            for _ in range(10):
                c.next()
    error = err.value
    assert error.worker_id == 1 and error.pid == node["pid"]
    assert error.reason == f"lost its local worker 1 (pid {victim}), which died with exit code -9 (SIGKILL)"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_local_worker_killed_on_a_node_is_replaced_under_max_worker_restarts(no_leftover_processes):
    with RPCCollector(make_env, None, num_collectors=2, frames_per_batch=80, launcher="local", cat_results="stack",
                      collector_class="sync", num_workers_per_collector=2, max_worker_restarts=1) as c:
        before = c.next().clone()
        os.kill(c.infos[0]["local_pids"][0], signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match=r"node 0's local worker 0 died with exit code -9"):
            after = [c.next().clone() for _ in range(3)]
    assert all(b.shape == (2, 2, 20) for b in after)
    ids = [set(b[TRAJ_IDS][0, 0].tolist()) for b in (before, *after)]
    # the replacement starts new trajectories, with ids its predecessor never used, of its flat worker (0)
    assert all(i % 4 == 0 for s in ids for i in s)
    assert max(ids[0]) < min(ids[-1])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_nodes_local_restart_reaches_the_trainer_as_a_warning_a_count_and_a_pid(no_leftover_processes):
    """Node 1 replaces its local worker 0: the trainer warns naming both, counts it for node 1 (not in
    the trajectory-id bounds of its own restarts) and lists the replacement's pid."""
    with RPCCollector(make_env, None, num_collectors=2, frames_per_batch=80, launcher="local", cat_results="stack",
                      collector_class="sync", num_workers_per_collector=2, max_worker_restarts=1) as c:
        c.next()
        victim = c.infos[1]["local_pids"][0]
        os.kill(victim, signal.SIGKILL)
        with pytest.warns(WorkerRestartWarning, match=r"node 1's local worker 0 .*died with exit code -9") as caught:
            for _ in range(3):
                c.next()
        assert sum("node 1's local worker 0" in str(w.message) for w in caught) == 1
        assert c.worker_restarts == [0, 1]
        assert c.roster.counts == [0, 0]  # the trainer replaced no node
        pids = c.infos[1]["local_pids"]
        assert victim not in pids and len(pids) == 2
        os.kill(pids[0], 0)  # the replacement runs


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_hung_local_worker_is_replaced_before_the_trainer_gives_up_on_its_node(no_leftover_processes):
    """Nested waits, nested deadlines: a node waits for a local worker half the trainer's rpc_timeout, so a
    stopped local worker is replaced and the node's batch reaches the trainer before the trainer's wait ends."""
    with RPCCollector(make_env, None, num_collectors=2, frames_per_batch=80, launcher="local", cat_results="stack",
                      collector_class="sync", num_workers_per_collector=2, max_worker_restarts=1, rpc_timeout=12) as c:
        c.next()
        victim = c.infos[1]["local_pids"][0]
        os.kill(victim, signal.SIGSTOP)
        try:  # no WorkerError: the node replaced its local worker
            with pytest.warns(WorkerRestartWarning, match=r"node 1's local worker 0 did not answer within rpc_timeout"):
                after = [c.next().clone() for _ in range(2)]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
        assert all(b.shape == (2, 2, 20) for b in after)
        assert not wait_gone({victim}, 10), "the node left its hung local worker running"


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_nodes_resume_from_state_dict_with_later_trajectory_ids():
    args = dict(num_collectors=2, frames_per_batch=80, launcher="local", cat_results="stack", collector_class="sync",
                num_workers_per_collector=2, track_policy_version=True)
    with RPCCollector(make_env, ArgmaxPolicy(), **args) as c:
        first = c.next().clone()
        c.update_policy_weights_()
        state = c.state_dict()
    with RPCCollector(make_env, ArgmaxPolicy(), **args) as d:
        d.load_state_dict(state)
        after = d.next()
    assert after["collector", "policy_version"].unique().tolist() == [1]
    for node in range(2):
        for local in range(2):
            old, new = first[TRAJ_IDS][node, local], after[TRAJ_IDS][node, local]
            assert set((new % 4).tolist()) == set((old % 4).tolist()) == {node * 2 + local}
            assert new.min() > old.max()  # the envs restarted: new trajectories, ids never used before


# --------------------------------------------------------------------------- across namespace hosts


class Run:
    """Trainer (host 1) and two nodes (hosts 2, 3); rank 0's stdout and every rank's stderr in files."""

    def __init__(self, net, logdir: Path, *args: str, ahead: tuple[int, ...] = (0, 0, 0)) -> None:
        """``ahead``: each host's monotonic clock runs that many seconds ahead (a time namespace)."""
        self.logdir, self.procs = logdir, []
        env = devcluster_module.torchrun_env(3, net.host(1).address, MASTER_PORT)
        env["PYTHONPATH"] = f"{PYTHONPATH}:{os.environ.get('PYTHONPATH', '')}"
        for rank in range(3):
            clock = ["unshare", "--time", f"--monotonic={ahead[rank]}"] if ahead[rank] else []
            with open(logdir / f"rank{rank}.out", "wb") as out, open(logdir / f"rank{rank}.err", "wb") as err:
                self.procs.append(net.popen(
                    rank + 1, [*clock, sys.executable, str(SCRIPT), *args], env={**env, "RANK": str(rank)},
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=REPO, start_new_session=True,
                ))

    def records(self) -> list[dict]:
        text = (self.logdir / "rank0.out").read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def record(self, event: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = self.procs[0].poll() is not None
            found = [r for r in self.records() if r["event"] == event]
            if found:
                return found[0]
            if ended:
                break
            time.sleep(0.1)
        pytest.fail(f"the trainer printed no {event!r} record\n{self.report()}")

    def wait(self, timeout: float) -> list[int]:
        try:
            return [proc.wait(timeout=timeout) for proc in self.procs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout:.0f} s\n{self.report()}")

    def report(self) -> str:
        parts = [f"exit codes: {[p.poll() for p in self.procs]}"]
        for rank in range(3):
            for kind in ("out", "err"):
                path = self.logdir / f"rank{rank}.{kind}"
                text = path.read_text(errors="replace") if path.exists() else ""
                parts += [f"--- rank {rank} std{kind} (tail)", "\n".join(text.splitlines()[-30:])]
        return "\n".join(parts)

    def kill(self) -> None:
        kill_sessions(self.procs)


@pytest.fixture
def net() -> Iterator:
    with devcluster_module.host_network(3, PREFIX, SUBNET) as network:
        yield network


@pytest.fixture
def run(net, tmp_path) -> Iterator:
    with killed_at_exit(lambda *args, **kwargs: Run(net, tmp_path, *args, **kwargs)) as start:
        yield start


def processes_left(net, grace: float = 15.0) -> dict[str, list[str]]:
    """The command lines of processes still in ``net``'s namespaces ``grace`` seconds after a run
    ended (a node's local workers exit once they see their node's pipes close)."""
    deadline = time.monotonic() + grace
    while any(namespace_pids(net).values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return {name: [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                   for pid in pids if Path(f"/proc/{pid}").exists()]
            for name, pids in namespace_pids(net).items() if pids}


@pytest.mark.cluster
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_two_hosts_of_two_local_workers_give_the_flat_runs_frames(net, run, tmp_path):
    r = run("--batches", "4", "--out", str(tmp_path))
    codes = r.wait(180)
    assert codes == [0, 0, 0], r.report()
    nodes = r.record("start", 1)["nodes"]
    assert [n["address"] for n in nodes] == [net.host(2).address, net.host(3).address]
    assert all(len(n["local_pids"]) == 2 for n in nodes)
    assert r.record("end", 1)["batches"] == 4
    node_batches = torch.load(tmp_path / "node.pt", weights_only=False)
    flat_batches = torch.load(tmp_path / "flat.pt", weights_only=False)
    assert node_batches[0].batch_size == (2, 2, 25)
    # weights pushed after every batch reached every local worker on both hosts, as in the flat run
    assert [b["collector", "policy_version"].unique().tolist() for b in node_batches] == [[0], [1], [2], [3]]
    assert_same_frames(flat_batches, node_batches, 2)
    assert not processes_left(net)


@pytest.mark.cluster
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_local_worker_killed_on_another_host_is_one_worker_error(net, run):
    r = run("--endless")
    start = r.record("start", 120)
    r.record("batch", 60)
    victim = start["nodes"][1]["local_pids"][0]
    os.kill(victim, signal.SIGKILL)  # one pid namespace: the test reaches every host's processes
    codes = r.wait(90)
    error = r.record("error", 1)
    assert codes[0] == 0, r.report()
    assert error["worker_id"] == 1 and error["rank"] == 2 and net.host(3).address in error["host"], error
    assert error["reason"] == f"lost its local worker 0 (pid {victim}), which died with exit code -9 (SIGKILL)"
    assert not processes_left(net), "a process outlived the run"



@pytest.mark.cluster
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_trace_across_hosts_puts_the_nodes_and_their_local_workers_on_the_trainers_clock(net, run, tmp_path):
    from node_collectors_trainer import STEPS
    from test_trace_window import assert_in_order_without_overlap, labels, read

    # the nodes' hosts run their monotonic clocks 1000 s and 2000 s ahead of the trainer's host
    path, rounds, ahead_ms = tmp_path / "hosts.json", 3, {"node 0": 1e6, "node 1": 2e6}
    r = run("--batches", str(rounds), "--trace", str(path), ahead=(0, 1000, 2000))
    assert r.wait(180) == [0, 0, 0], r.report()
    trace, clocks = read(path), labels(path)
    assert [name.split(" (")[0] for name in trace] == [
        "trainer", "node 0", "node 0's local worker 0", "node 0's local worker 1",
        "node 1", "node 1's local worker 0", "node 1's local worker 1"]
    for name, (offset, error) in clocks.items():
        assert abs(offset - ahead_ms[name[:6]]) <= error, (name, offset, error)
    trainer = [s for name, threads in trace.items() if name.startswith("trainer") for t in threads.values() for s in t]
    handed = sorted((s for s in trainer if s["name"] == "hand-out"), key=lambda s: s["ts"])
    assert len(handed) == rounds and sum(s["name"] == "push" for s in trainer) == rounds - 1
    asked = [-float("inf")] + [s["ts"] + s["dur"] for s in handed]  # round k is asked after batch k - 1 was handed out
    for name, threads in trace.items():
        if "local worker" not in name:
            continue
        error_us = clocks[name][1] * 1e3
        steps = [s for s in threads["rollout"] if s["name"] == "env"]
        assert len(steps) == rounds * STEPS, name
        for k in range(rounds):  # on the trainer's clock, each round's steps lie between its request and its hand-out
            first, last = steps[k * STEPS], steps[(k + 1) * STEPS - 1]
            assert asked[k] - error_us <= first["ts"] + first["dur"], (name, k)
            assert last["ts"] + last["dur"] <= handed[k]["ts"] + error_us, (name, k)
    assert_in_order_without_overlap(trace)
    assert not processes_left(net)
