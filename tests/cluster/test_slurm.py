"""SLURM submission against a real local SLURM cluster (slurm/devcluster.py), run as root.

The clusters are real: munge, MariaDB + slurmdbd, slurmctld and slurmd; the two-node cluster
puts each slurmd in its own network namespace (10.77.0.1 and 10.77.0.2). One cluster runs at a
time, shared with tests/cluster/test_requeue_slurm.py (the fixtures ``one_node`` and ``two_nodes`` of
tests/conftest.py): the 1-node tests come first, then the 2-node ones, so each is started once.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator
from unittest import mock

import cloudpickle
import pytest
import submitit
import torch
from submitit.core.utils import FailedJobError, UncompletedJobError

import devcluster_module
from folders import PYTHONPATH
from rpc_collectors import Evaluator
from rpc_collectors.cluster import submission as slurm
from rpc_collectors.cluster import task_hosts
from rpc_collectors.transport.rendezvous import free_port, interface_address

REPO = Path(__file__).resolve().parents[2]
RESULT_TIMEOUT_S = 90

# Task functions below are defined in this test module, which jobs cannot import: ship by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


devcluster = devcluster_module.load()


@pytest.fixture
def log_dir(slurm_clusters, request) -> Path:
    path = slurm_clusters.root / "logs" / request.node.name
    path.mkdir(parents=True)
    return path


class Submitted:
    """Jobs of a group of tests submitted at once, by the group's first test, so that their waits
    for SLURM (scheduling, start, the polls of their states) overlap; each test takes its own job
    and checks it as if it had just submitted it. Whatever a test leaves running is cancelled."""

    def __init__(self, cluster, root: Path) -> None:
        self.cluster, self.root = cluster, root
        self.jobs: dict[str, submitit.Job] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.held: list[socket.socket] = []

    def log_dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        return path

    def submit(self, name: str, fn, *args, env: dict[str, str | None] | None = None, **options) -> None:
        """``slurm.submit`` with ``env`` set (None: unset) in the environment that the job inherits."""
        with mock.patch.dict(os.environ):
            for key, value in (env or {}).items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self.jobs[name] = slurm.submit(fn, *args, log_dir=self.log_dir(name), **options)

    @contextlib.contextmanager
    def take(self, name: str) -> Iterator[submitit.Job]:
        job = self.jobs.pop(name)
        try:
            yield job
        finally:
            self.cancel([job])

    def cancel(self, jobs: list[submitit.Job]) -> None:
        """Cancels ``jobs`` on this group's cluster (job ids repeat across clusters); a no-op for ended ones."""
        if jobs:
            subprocess.run(["scancel", *(job.job_id for job in jobs)], env=self.cluster.env, capture_output=True, timeout=30)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)
        self.cancel(list(self.jobs.values()))
        for held in self.held:
            held.close()


# --------------------------------------------------------------------------- task functions


def allreduce_task() -> dict:
    """Check the exported variables, all_reduce rank+1 over gloo via a TCPStore rendezvous."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    assert rank == int(os.environ["SLURM_PROCID"]) and world == int(os.environ["SLURM_NTASKS"])
    store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value)
        ifname = os.environ["GLOO_SOCKET_IFNAME"]
        my_addr = interface_address(ifname)
        addrs = [None] * world
        dist.all_gather_object(addrs, my_addr)
    finally:
        dist.destroy_process_group()
    return {"sum": value.item(), "world": world, "master": addr, "port": port, "addresses": addrs}


def rpc_collect_task(frames_per_batch: int, total_frames: int, probe_ifname: str | None) -> dict:
    """Trainer on task 0, collector servers elsewhere: collect, update weights once, summarise."""
    import torch
    from torch import nn
    from torch.distributed import rpc

    from rpc_collectors import GymEnv, RPCCollector
    from rpc_collectors.transport.rendezvous import interface_address

    class ArgmaxPolicy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 2)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.linear(obs).argmax(-1)

    policy = ArgmaxPolicy()
    collector = RPCCollector(lambda: GymEnv("CartPole-v1"), policy, frames_per_batch=frames_per_batch,
                             total_frames=total_frames, launcher="slurm", rpc_timeout=60, track_policy_version=True)
    # Only task 0 gets here: the other tasks serve collectors and exit when it shuts down.
    frames, versions, traj_ids = 0, [], {}
    try:
        for i, batch in enumerate(collector):
            frames += batch.numel()
            versions.append(sorted(set(batch["collector", "policy_version"].flatten().tolist())))
            workers = batch["collector", "worker_id"].flatten().tolist()
            for worker, traj in zip(workers, batch["collector", "traj_ids"].flatten().tolist()):
                traj_ids.setdefault(worker, set()).add(traj)
            if i == 0:
                with torch.no_grad():
                    policy.linear.weight.add_(1.0)
                collector.update_policy_weights_(policy)
        threads = [info["threads"] for info in collector.infos]
        workers_at = {}
        if probe_ifname is not None:
            workers_at = {rank: rpc.rpc_sync(f"collector{rank}", interface_address, args=(probe_ifname,))
                          for rank in range(1, int(os.environ["WORLD_SIZE"]))}
    finally:
        collector.shutdown()
    return {"frames": frames, "versions": versions, "traj_ids": traj_ids, "workers_at": workers_at, "threads": threads,
            "trainer_at": os.environ["MASTER_ADDR"]}


def _check_rpc_summary(out: dict, total_frames: int, workers: int) -> None:
    assert out["frames"] == total_frames
    assert set(out["traj_ids"]) == set(range(workers)), "every collector server delivered frames"
    all_ids = [i for ids in out["traj_ids"].values() for i in ids]
    assert len(all_ids) == len(set(all_ids)), "trajectory ids are unique across workers"
    assert out["versions"][0] == [0]
    assert out["versions"][-1] == [1], "the weight update reached the workers"
    assert out["threads"] == [1] * workers, "a collector server runs one torch thread (srun sets no OMP_NUM_THREADS)"


def failing_task() -> None:
    raise ValueError("deliberate failure in task")


def blocking_task() -> None:
    import time

    time.sleep(600)  # cancelled long before


def exit_without_result_once(flag: str) -> None:
    """Ends, with exit code 0 and no result (as a collector server's task ends), once ``flag`` exists."""
    import time

    while not os.path.exists(flag):  # bounded by the job's time limit
        time.sleep(0.1)
    os._exit(0)


# --------------------------------------------------------------------------- 1 node


@pytest.fixture(scope="module")
def one_node_jobs(slurm_clusters):
    """The jobs of the one-node tests below, submitted at once (8 CPUs: the last ones wait for the
    first to end). The taken port stays bound until the module's tests are done."""
    cluster = slurm_clusters.use(1)
    submitted = Submitted(cluster, slurm_clusters.root / "logs" / "one-node")
    taken = socket.socket()
    submitted.held.append(taken)
    taken.bind(("", 0))
    try:
        submitted.submit("rpc", rpc_collect_task, 200, 1000, None, tasks_per_node=3, time_min=5)
        submitted.submit("allreduce", allreduce_task, tasks_per_node=3, time_min=5)
        submitted.submit("failing", failing_task, time_min=5)
        submitted.submit("taken-port", allreduce_task, time_min=5, env={"MASTER_PORT": str(taken.getsockname()[1])})
        submitted.submit("blocking", blocking_task, time_min=5)
        flag = submitted.root / "end"
        submitted.submit("exit-once", exit_without_result_once, str(flag), time_min=5)
        submitted.procs["submit-script"] = _start_submit_script(submitted.log_dir("submit-script"), cluster.env)
        yield submitted
    finally:
        submitted.close()


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_allreduce_three_tasks_one_node(one_node, one_node_jobs):
    with one_node_jobs.take("allreduce") as job:
        out = slurm.result(job, timeout_s=RESULT_TIMEOUT_S)
    assert out["world"] == 3
    assert out["sum"] == 1 + 2 + 3
    assert out["master"] == "127.0.0.1"
    # the derived port lies below the ephemeral ports, which any connection may hold
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert out["port"] == slurm.job_port(job.job_id) < ephemeral_low


@pytest.mark.slurm
@pytest.mark.timeout(240)
def test_rpc_collector_one_trainer_two_collectors_one_node(one_node, one_node_jobs):
    with one_node_jobs.take("rpc") as job:
        out = slurm.result(job, timeout_s=RESULT_TIMEOUT_S * 2)
    _check_rpc_summary(out, 1000, workers=2)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_failing_task_reaches_submitter(one_node, one_node_jobs):
    with one_node_jobs.take("failing") as job, pytest.raises(FailedJobError, match="deliberate failure in task") as info:
        slurm.result(job, timeout_s=RESULT_TIMEOUT_S)
    assert "ValueError" in str(info.value)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_cancelled_job_reported(one_node, one_node_jobs):
    with one_node_jobs.take("blocking") as job:
        _wait_running(job)
        job.cancel()
        with pytest.raises(UncompletedJobError, match="CANCELLED"):
            slurm.result(job, timeout_s=RESULT_TIMEOUT_S)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_result_returns_soon_after_a_job_ended_however_long_it_ran(one_node, one_node_jobs):
    """submitit asks SLURM for the states of old jobs only about once a minute; result() must not
    report a job that ended as still running until then."""
    import time

    with one_node_jobs.take("exit-once") as job:
        _wait_running(job)
        submitit.SlurmJob.watcher._start_time -= 240  # as if submitted four minutes ago, as a long run's jobs are
        assert not job.done(force_check=True)  # submitit has just seen it running
        (one_node_jobs.root / "end").touch()
        deadline = time.monotonic() + 60
        while _states([job.job_id]).get(job.job_id) != "COMPLETED":  # SLURM's accounting has it ended
            assert time.monotonic() < deadline, _states([job.job_id])
            time.sleep(0.2)
        assert slurm.result(job, timeout_s=15) is None


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_taken_master_port_is_a_clear_error(one_node, one_node_jobs):
    port = one_node_jobs.held[0].getsockname()[1]  # the job inherited MASTER_PORT={port}
    with one_node_jobs.take("taken-port") as job, pytest.raises(FailedJobError, match=f"MASTER_PORT {port} .*already in use"):
        slurm.result(job, timeout_s=RESULT_TIMEOUT_S)


def _wait_running(job: submitit.Job, timeout_s: float = 60) -> None:
    """Poll squeue until the job runs (submitit's own state lags)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job.job_id, "-o", "%T"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        if out == "RUNNING":
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job.job_id} not running after {timeout_s} s")


def _start_submit_script(folder: Path, env: dict[str, str]) -> subprocess.Popen:
    """``slurm/submit.py train.py --out FOLDER --tasks-per-node 2 --wait``: each task writes a file."""
    script = folder / "train.py"
    script.write_text(
        "import os, sys, pathlib\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
        "(out / os.environ['RANK']).write_text(os.environ['WORLD_SIZE'] + ' ' + __name__)\n"
    )
    cmd = [sys.executable, str(REPO / "slurm" / "submit.py"), str(script), "--out", str(folder),
           "--tasks-per-node", "2", "--log-dir", str(folder / "logs"), "--wait", "--timeout", "90"]
    # The port submitit derives from the job id lies among the ephemeral ports, and the local
    # cluster's job ids repeat from 1, so now and then it is taken by an unrelated connection
    # (test_taken_master_port_is_a_clear_error covers that error): this test pins a free one.
    env = dict(env, MASTER_PORT=str(free_port()))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_submit_script_runs_training_script_in_every_task(one_node, one_node_jobs):
    proc = one_node_jobs.procs["submit-script"]
    out, err = proc.communicate(timeout=150)
    folder = one_node_jobs.root / "submit-script"
    assert proc.returncode == 0, out + err
    assert "submitted SLURM job" in out and str(folder / "logs") in out
    assert (folder / "0").read_text() == "2 __main__"
    assert (folder / "1").read_text() == "2 __main__"


@pytest.mark.slurm
@pytest.mark.timeout(60)
def test_dry_run_prints_sbatch_options(tmp_path):
    cmd = [sys.executable, str(REPO / "slurm" / "submit.py"), str(tmp_path / "train.py"), "--lr", "3",
           "--nodes", "2", "--tasks-per-node", "3", "--gpus-per-node", "1", "--cpus-per-task", "4",
           "--partition", "gpu", "--time", "30", "--mem", "16G", "--sbatch-flag", "account=proj",
           "--sbatch-flag", "exclusive", "--log-dir", str(tmp_path / "logs"), "--dry-run"]
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=50, check=True).stdout
    for line in ["--nodes=2", "--ntasks-per-node=3", "--gpus-per-node=1", "--cpus-per-task=4",
                 "--partition=gpu", "--time=30", "--mem=16G", "--account=proj", "--exclusive",
                 "--kill-on-bad-exit=1", str(tmp_path / "logs")]:
        assert line in out, f"{line!r} missing from:\n{out}"


@pytest.mark.parametrize("flag", [["--elastic"], ["--join", "1234"]])
def test_elastic_jobs_keep_going_when_a_task_fails(tmp_path, flag, capsys):
    """slurm/submit.py's ``main`` in this process (test_dry_run_prints_sbatch_options runs the script itself)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = importlib.util.spec_from_file_location("submit_script", REPO / "slurm" / "submit.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(tmp_path / "train.py"), *flag, "--log-dir", str(tmp_path / "logs"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--kill-on-bad-exit=0" in out and "--kill-on-bad-exit=1" not in out, out


def test_join_env_comes_from_the_trainers_rendezvous_file(tmp_path, monkeypatch):
    for key in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "RPC_COLLECTORS_JOIN"):
        monkeypatch.setenv(key, "")  # restored (or removed) after the test, which sets them
        monkeypatch.delenv(key)
    path = slurm.rendezvous_file(tmp_path, "77")
    with pytest.raises(TimeoutError, match=r"no elastic trainer wrote .*77_rendezvous.json within 0 s"):
        slurm.setup_join_env(path, wait_s=0)
    slurm._write_json(path, {"master_addr": "127.0.0.1", "master_port": 29123})
    assert slurm.setup_join_env(path, wait_s=0) == "127.0.0.1:29123"
    assert os.environ["RPC_COLLECTORS_JOIN"] == "127.0.0.1:29123" and os.environ["TP_SOCKET_IFNAME"] == "lo"


@pytest.mark.slurm
@pytest.mark.parametrize(
    "options, error, words",
    [
        ({"nodes": 0}, ValueError, ["nodes=0", "int > 0"]),
        ({"tasks_per_node": "3"}, ValueError, ["tasks_per_node='3'"]),
        ({"gpus_per_node": -1}, ValueError, ["gpus_per_node=-1", "int >= 0"]),
        ({"time_min": 1.5}, ValueError, ["time_min=1.5"]),
        ({"mem": "lots"}, ValueError, ["mem='lots'", "16G"]),
        ({"partition": ""}, ValueError, ["partition=''"]),
        ({"sbatch_flags": {"--account": "x"}}, ValueError, ["'--account'", "without dashes"]),
        ({"sbatch_flags": ["account=x"]}, TypeError, ["sbatch_flags=", "dict"]),
        ({"log_dir": None}, TypeError, ["log_dir=None", "folder path"]),
        ({"frobnicate": 1}, TypeError, ["frobnicate", "tasks_per_node"]),
        ({"join": "latest"}, ValueError, ["join='latest'", "job id of an elastic trainer"]),
        ({"join": "12", "elastic": True}, ValueError, ["join='12'", "either trains"]),
        ({"elastic": 1}, TypeError, ["elastic=1"]),
    ],
)
def test_bad_arguments_rejected_before_submission(tmp_path, options, error, words):
    kwargs = {"log_dir": tmp_path, **options}
    with pytest.raises(error) as info:
        slurm.submit(print, **kwargs)
    for word in words:
        assert word in str(info.value)
    assert not list(tmp_path.iterdir()), "nothing may be written before the arguments are valid"


@pytest.mark.parametrize("where", ["a-file", "under-a-file", "sysfs"])
def test_an_unwritable_collector_jobs_folder_is_refused_before_anything_starts(tmp_path, where):
    """launcher="submitit" writes its rendezvous and the jobs' files into slurm_kwargs["folder"]:
    one it cannot write is a ValueError naming it before any process, agent or job starts."""
    from procs import descendants
    from rpc_collectors import DistributedCollector

    (tmp_path / "file").write_text("")
    folder = {"a-file": tmp_path / "file", "under-a-file": tmp_path / "file" / "logs",
              "sysfs": Path("/sys/rpc-collectors-logs")}[where]
    before = descendants()
    with pytest.raises(ValueError) as info:
        DistributedCollector(["CartPole-v1"] * 2, None, frames_per_batch=20, launcher="submitit",
                             slurm_kwargs={"folder": str(folder), "timeout_min": 5})
    assert f"slurm_kwargs['folder']={str(folder)!r}" in str(info.value) and "accepted" in str(info.value), info.value
    assert descendants() <= before and not torch.distributed.rpc.api._is_current_rpc_agent_set()


def test_an_unwritable_default_collector_jobs_folder_is_refused_naming_it(tmp_path, monkeypatch):
    """Without slurm_kwargs["folder"] the jobs' folder is ./log_test: a file there is refused by its path."""
    from procs import descendants
    from rpc_collectors import DistributedCollector

    monkeypatch.chdir(tmp_path)
    (tmp_path / "log_test").write_text("")
    before = descendants()
    with pytest.raises(ValueError) as info:
        DistributedCollector(["CartPole-v1"] * 2, None, frames_per_batch=20, launcher="submitit")
    expected = f"the collector jobs' folder {str(tmp_path / 'log_test')!r} (slurm_kwargs has no 'folder') is not a folder"
    assert expected in str(info.value) and "accepted" in str(info.value), info.value
    assert descendants() <= before


@pytest.mark.slurm
def test_submit_rejects_non_callable(tmp_path):
    with pytest.raises(TypeError, match="fn=42 is not callable"):
        slurm.submit(42, log_dir=tmp_path)


@pytest.mark.slurm
def test_wrong_interface_lists_available():
    with pytest.raises(ValueError, match=r"interface='nope0' does not exist.*'lo'"):
        task_hosts._check_interface("nope0")


def _reachable_interface() -> tuple[str, str]:
    """A non-loopback interface of this machine and its address."""
    for name in task_hosts._interface_names():
        if not task_hosts._loopback(name):
            return name, interface_address(name)
    pytest.fail("this machine has no network interface but loopback")


def test_a_loopback_interface_inherited_from_the_submitter_is_not_used_across_nodes(monkeypatch):
    # sbatch copies the submitting process's environment into the job: a GLOO_SOCKET_IFNAME=lo
    # there would make every rank advertise 127.0.0.1 to the other nodes
    name, address = _reachable_interface()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert slurm.task_interface(None, address, remote_peers=True) == name
    assert slurm.task_interface(None, "127.0.0.1", remote_peers=False) == "lo"  # one node: loopback is fine
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nope0")  # the submitter's interface, which this node lacks
    assert slurm.task_interface(None, address, remote_peers=True) == name
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", name)  # one that reaches the others is kept
    assert slurm.task_interface(None, "127.0.0.1", remote_peers=True) == name
    with pytest.raises(ValueError, match=rf"interface='lo' is a loopback interface.*other nodes.*'{name}'"):
        slurm.task_interface("lo", address, remote_peers=True)


# --------------------------------------------------------------------------- 2 nodes


@pytest.fixture(scope="module")
def two_node_jobs(slurm_clusters):
    """The jobs of the two-node tests below, submitted at once (7 of each node's 8 CPUs)."""
    submitted = Submitted(slurm_clusters.use(2), slurm_clusters.root / "logs" / "two-nodes")
    try:
        # the job inherits the submitter's environment: a loopback GLOO_SOCKET_IFNAME there (a local
        # run's, or one a starting RPC agent sets in this process meanwhile) must not reach the ranks
        for submitter_ifname in (None, "lo"):
            submitted.submit(f"allreduce-{submitter_ifname}", allreduce_task, nodes=2, tasks_per_node=2, time_min=5,
                             env={"GLOO_SOCKET_IFNAME": submitter_ifname, "TP_SOCKET_IFNAME": submitter_ifname})
        # n1: the trainer and collector 1; n2: collectors 2 and 3
        submitted.submit("rpc", rpc_collect_task, 300, 1200, "veth0", nodes=2, tasks_per_node=2, time_min=5)
        submitted.submit("wrong-interface", allreduce_task, nodes=2, interface="nope0", time_min=5)
        yield submitted
    finally:
        submitted.close()


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(180)
@pytest.mark.parametrize("submitter_ifname", [None, "lo"], ids=["clean-env", "submitter-loopback"])
def test_allreduce_across_two_namespace_nodes(two_nodes, two_node_jobs, submitter_ifname):
    with two_node_jobs.take(f"allreduce-{submitter_ifname}") as job:
        out = slurm.result(job, timeout_s=RESULT_TIMEOUT_S)
    assert out["sum"] == 1 + 2 + 3 + 4
    assert out["master"] == two_nodes.nodes["n1"]
    assert out["addresses"] == ["10.77.0.1", "10.77.0.1", "10.77.0.2", "10.77.0.2"]


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_rpc_collector_across_two_namespace_nodes(two_nodes, two_node_jobs):
    with two_node_jobs.take("rpc") as job:
        out = slurm.result(job, timeout_s=RESULT_TIMEOUT_S * 2)
    _check_rpc_summary(out, 1200, workers=3)
    assert out["trainer_at"] == "10.77.0.1"
    assert out["workers_at"] == {1: "10.77.0.1", 2: "10.77.0.2", 3: "10.77.0.2"}


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_wrong_interface_fails_the_job_clearly(two_nodes, two_node_jobs):
    with two_node_jobs.take("wrong-interface") as job, \
            pytest.raises(FailedJobError, match=r"interface='nope0' does not exist.*veth0"):
        slurm.result(job, timeout_s=RESULT_TIMEOUT_S)


# --------------------------------------------------------------------------- namespace hosts

_SERVER = "import socket; s = socket.create_server(('0.0.0.0', 7777)); print('up', flush=True)\nwhile True: s.accept()[0].close()"
_CLIENT = "import socket, sys; socket.create_connection((sys.argv[1], 7777), timeout=1).close()"


def _connects(net, index: int, address: str) -> bool:
    proc = subprocess.run(net.command(index, [sys.executable, "-c", _CLIENT, address]),
                          capture_output=True, timeout=30)
    return proc.returncode == 0


@pytest.mark.cluster
@pytest.mark.timeout(60)
def test_host_network_addresses_cut_and_teardown():
    net = devcluster.HostNetwork(2, prefix="rpcc-t", subnet="10.79.0")
    with net:
        assert [h.address for h in net.hosts] == ["10.79.0.1", "10.79.0.2"]
        server = net.popen(1, [sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "up"
        assert _connects(net, 2, "10.79.0.1")
        net.cut(2)
        assert not _connects(net, 2, "10.79.0.1")
        net.restore(2)
        assert _connects(net, 2, "10.79.0.1")
    assert server.wait(timeout=10) is not None, "teardown ends the namespace's processes"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "rpcc-t-" not in listed


# --------------------------------------------------------------------------- elastic


def _trainer_records(job: submitit.Job) -> list[dict]:
    text = job.task(0).stdout() or ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _wait_for_record(job: submitit.Job, condition, timeout_s: float, what: str) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r for r in _trainer_records(job) if condition(r)]
        if found:
            return found[-1]
        if job.done():
            break
        time.sleep(0.2)
    raise AssertionError(f"no {what} from trainer job {job.job_id} within {timeout_s:.0f} s (state {job.state})\n"
                         f"{job.task(0).stdout()}\n{job.task(0).stderr()}")


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_elastic_trainer_job_outlives_a_cancelled_collectors_job(two_nodes, log_dir, monkeypatch):
    """n1: an elastic trainer job (one task); n2: a collectors-only job that joins it, is
    cancelled mid-run, and another that joins in its place; the trainer finishes its frames."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # job ids repeat across clusters: pin a free port
    monkeypatch.setenv("PYTHONPATH", PYTHONPATH)  # the jobs import the test modules
    script = str(REPO / "tests" / "scripts" / "elastic_trainer.py")
    frames = 15000
    trainer = slurm.submit(
        slurm.run_script, script, ["--slots", "2", "--frames", str(frames), "--batch-sleep", "0.05",
                                   "--rpc-timeout", "10", "--join-timeout", "120"],
        log_dir=log_dir, elastic=True, sbatch_flags={"nodelist": "n1"}, time_min=5, job_name="trainer",
    )
    collectors = dict(log_dir=log_dir, join=trainer.job_id, tasks_per_node=2, sbatch_flags={"nodelist": "n2"},
                      time_min=5, job_name="collectors")
    first = slurm.submit(slurm.run_script, script, [], **collectors)
    record = _wait_for_record(trainer, lambda r: r["event"] == "batch", 90, "batch")
    first_pids = {s["pid"] for s in record["slots"]}
    assert {s["address"] for s in record["slots"]} == {"10.77.0.2"}, record

    subprocess.run(["scancel", first.job_id], check=True, timeout=30)
    _wait_for_record(trainer, lambda r: r["event"] == "left", 60, "WorkerLeftWarning")
    second = slurm.submit(slurm.run_script, script, [], **collectors)
    joined = _wait_for_record(trainer, lambda r: r["event"] == "batch" and all(
        s and s["pid"] not in first_pids for s in r["slots"]), 90, "batch from the second collectors job")
    assert all(v == [joined["policy_version"]] for v in joined["versions"].values()), joined

    assert slurm.result(trainer, timeout_s=120) is None  # the trainer job completed
    records = _trainer_records(trainer)
    summary = next(r for r in records if r["event"] == "summary")
    assert summary["frames"] == frames, summary
    assert not [r for r in records if r["event"] == "error"], records
    assert all(r["shape"] == [100] for r in records if r["event"] == "batch")
    assert slurm.result(second, timeout_s=60) is None  # its collectors were stopped by the trainer: exit 0
    states = _final_states([trainer.job_id, first.job_id])  # job.state is submitit's last look, maybe a minute old
    assert states[trainer.job_id] == "COMPLETED" and states[first.job_id].startswith("CANCELLED"), states


# --------------------------------------------------------------------------- launcher="submitit"
# The trainer is this test process (on the bridge, 10.77.0.254); it submits one job per collector.


def _submitit_collector(log_dir: Path, policy=None, **kwargs):
    """A DistributedCollector whose 2 collector jobs each take a whole node (8 declared CPUs)."""
    import conftest
    from rpc_collectors import DistributedCollector, GymEnv

    cloudpickle.register_pickle_by_value(conftest)  # the jobs cannot import the tests' conftest
    env_class = conftest.CountEnv

    def count_env():
        return GymEnv(env_class())

    slurm_kwargs = {"folder": str(log_dir), "timeout_min": 5, "slurm_cpus_per_task": 8, **kwargs.pop("slurm_kwargs", {})}
    kwargs.setdefault("join_timeout", 120)
    return DistributedCollector([count_env] * 2, policy, frames_per_batch=20, launcher="submitit",
                                slurm_kwargs=slurm_kwargs, rpc_timeout=30, **kwargs)


def _check_count_frames(batch) -> None:
    """Each row of a CountEnv batch is one env's consecutive steps (see tests/conftest.py)."""
    obs, nxt, done = batch["observation"][..., 0], batch["next", "observation"][..., 0], batch["next", "done"].squeeze(-1)
    assert (nxt == obs + 1).all()
    going_on = ~done[..., :-1]
    assert (obs[..., 1:][going_on] == nxt[..., :-1][going_on]).all()
    assert (obs[..., 1:][~going_on] == 0).all()


def _queue() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i %T %N"], capture_output=True, text=True, timeout=30,
                          check=True).stdout.split("\n")[:-1]


def _states(job_ids) -> dict[str, str]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split("|") for line in out.splitlines())


def _final_states(job_ids, timeout_s: float = 30) -> dict[str, str]:
    """The jobs' states once SLURM's accounting has them ended (it records an end a little after
    squeue stops listing the job)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        states = _states(job_ids)
        ended = len(states) == len(job_ids) and not {"PENDING", "RUNNING", "COMPLETING"} & set(states.values())
        if ended or time.monotonic() > deadline:
            return states
        time.sleep(0.25)


def _wait_queue_empty(timeout_s: float) -> list[str]:
    import time

    deadline = time.monotonic() + timeout_s
    while _queue() and time.monotonic() < deadline:
        time.sleep(0.25)
    return _queue()


def _assert_shutdown_ended_jobs() -> None:
    """Right after a collector's shutdown none of its jobs is pending or running: each completed,
    or SLURM is finishing it (COMPLETING, while slurmd reaps its processes, longer on a loaded
    machine); then the queue empties."""
    assert not [line for line in _queue() if line.split()[1] != "COMPLETING"], \
        f"shutdown left collector jobs pending or running: {_queue()}"
    assert _wait_queue_empty(30) == [], "the collector jobs stayed in the queue after shutdown"


class _Switch(torch.nn.Module):
    """Takes action ``bias`` (0 or 1) whatever it observes: a weight push shows in the actions."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([1.0, 0.0]))

    def forward(self, observation):
        return (observation[..., :1] * 0 + self.bias).argmax(-1)


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_trainer_submits_its_collector_jobs_sync_and_async(two_nodes, log_dir):
    """launcher="submitit": 2 jobs, one per node, join this process; sync and async batches
    with checked frames and weight pushes; at shutdown the jobs complete and leave the queue."""

    policy = _Switch()
    # broadcast: the weights' path between real hosts (these namespace nodes share the trainer's
    # machine, so "auto" would pick shared memory, as the async run below does)
    with _submitit_collector(log_dir, policy, sync=True, total_frames=80, weight_transport="broadcast",
                             track_policy_version=True) as collector:
        assert sorted(info["address"] for info in collector.infos) == ["10.77.0.1", "10.77.0.2"]
        assert len(_queue()) == 2
        # an evaluation in the second job's process, on its node, with the trainer's weights
        import conftest
        from rpc_collectors import GymEnv

        env_class, folder = conftest.CountEnv, str(log_dir)

        def marked_count_env():  # marks the process that builds it: the one that evaluates
            Path(folder, f"eval-{os.getpid()}").touch()
            return GymEnv(env_class())

        evaluator = Evaluator(marked_count_env, policy_factory=_Switch, num_trajectories=3,
                              frames_per_batch=4, backend="worker", worker_of=collector,
                              metrics_fn=lambda b: {"action": float(b["action"][b["collector", "mask"]].float().mean())})
        flipped = _Switch()
        with torch.no_grad():
            flipped.bias.copy_(flipped.bias.flip(0))
        result = evaluator.evaluate(flipped, version=5)
        assert result["eval/num_episodes"] == 3 and result["eval/action"] == 1.0 and result["eval/policy_version"] == 5
        assert (log_dir / f"eval-{collector.infos[1]['pid']}").exists()
        evaluator.shutdown()
        for i, batch in enumerate(collector):
            assert batch.shape == (2, 10)
            assert torch.equal(batch["collector", "worker_id"], torch.tensor([[0] * 10, [1] * 10]))
            assert (batch["collector", "policy_version"] == i).all() and (batch["action"] == i % 2).all()
            _check_count_frames(batch)
            with torch.no_grad():
                policy.bias.copy_(policy.bias.flip(0))
            collector.update_policy_weights_()
    _assert_shutdown_ended_jobs()

    # async: first ready, first served; a worker slowed down on a loaded machine may deliver its first
    # batch after many of the other's, so the run goes on until both delivered (a worker that never
    # answers is a WorkerError after rpc_timeout)
    with _submitit_collector(log_dir, policy, sync=False, total_frames=-1, track_policy_version=True) as collector:
        workers, pushed_to = set(), set()  # workers that delivered; those that delivered with the pushed weights
        for i, batch in enumerate(collector):
            assert batch.shape == (20,) and batch["collector", "worker_id"].unique().numel() == 1
            _check_count_frames(batch)
            workers.add(int(batch["collector", "worker_id"][0]))
            if (batch["collector", "policy_version"] == 1).all():
                pushed_to.add(int(batch["collector", "worker_id"][0]))
            if i == 0:
                with torch.no_grad():
                    policy.bias.copy_(torch.tensor([0.0, 1.0]))
                collector.update_policy_weights_()
            elif i > 2:  # both workers got the push; a batch in flight then may still be the old weights'
                assert (batch["action"] == 1).all() == (batch["collector", "policy_version"] == 1).all()
            if i >= 9 and pushed_to == {0, 1}:
                break
            assert i < 100_000, f"only worker(s) {workers} delivered, {pushed_to} with the pushed weights"
        jobs = [line.split()[0] for line in _queue()]
    _assert_shutdown_ended_jobs()
    assert set(_final_states(jobs).values()) == {"COMPLETED"}, "the stopped collectors' jobs completed on their own"
    assert not list(log_dir.glob("*_rendezvous.json")), "the trainer's rendezvous file is removed"


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, None], ids=["SIGKILL", "SIGINT", "finished"])
def test_killed_interrupted_or_finished_trainer_leaves_no_collector_job(two_nodes, log_dir, sig):
    """SIGKILL the trainer mid-run: its guard cancels the jobs; Ctrl-C, or a script that ends
    without shutdown(): it shuts the collector down and they complete. Either way the queue
    empties within a bound."""
    from procs import alive, ctrl_c_raises

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"),
                                                        os.environ.get("PYTHONPATH", "")])}
    frames = [] if sig else ["200"]
    trainer = subprocess.Popen([sys.executable, str(REPO / "tests" / "scripts" / "submitit_trainer.py"), str(log_dir), *frames],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=ctrl_c_raises)
    try:
        line = trainer.stdout.readline()  # after its first batch
        assert line.startswith("{"), trainer.communicate(timeout=60)
        started = json.loads(line)
        jobs = [entry.split()[0] for entry in _queue()]
        assert len(jobs) == 2
    finally:
        if sig is not None:
            trainer.send_signal(sig)
        try:
            _, err = trainer.communicate(timeout=120)  # "finished": it collects its frames and exits
        except subprocess.TimeoutExpired:
            trainer.kill()
            trainer.communicate(timeout=30)
            raise
    assert _wait_queue_empty(30) == [], "the trainer's collector jobs are still queued or running"
    assert not alive(started["guard"])
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err and trainer.returncode != 0
    if sig is None:
        assert trainer.returncode == 0 and err == "", err
    if sig != signal.SIGKILL:
        assert set(_final_states(jobs).values()) == {"COMPLETED"}, "the trainer stopped its collectors"


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_cancelled_collector_job_leaves_a_vacant_slot_under_elastic_membership(two_nodes, log_dir):
    import warnings

    from rpc_collectors import WorkerLeftWarning

    with _submitit_collector(log_dir, None, sync=False, elastic=True, total_frames=-1,
                             track_policy_version=True) as collector:
        seen, left = set(), []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", WorkerLeftWarning)
            batches = iter(collector)
            while seen != {0, 1}:
                seen.add(int(next(batches)["collector", "worker_id"][0]))
            on_n2 = next(i for i, info in enumerate(collector.infos) if info["address"] == "10.77.0.2")
            job = next(line.split()[0] for line in _queue() if line.endswith(" n2"))
            subprocess.run(["scancel", job], check=True, timeout=30)
            after = []
            while len(after) < 20:
                batch = next(batches)
                _check_count_frames(batch)
                if [w for w in caught if issubclass(w.category, WorkerLeftWarning)]:
                    after.append(int(batch["collector", "worker_id"][0]))
            left = [str(w.message) for w in caught if issubclass(w.category, WorkerLeftWarning)]
        assert len(left) == 1 and f"collector worker {on_n2}" in left[0], left
        assert set(after) == {1 - on_n2}, "only the remaining collector delivers"
        assert collector.worker_restarts[on_n2] == 1 and collector.infos[on_n2] is None
    assert _wait_queue_empty(10) == []
    assert _final_states([job])[job].startswith("CANCELLED")


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_sync_elastic_run_that_lost_its_collector_job_names_the_job_and_what_to_do(two_nodes, log_dir):
    """The slot stays vacant until join_timeout; the error then names the cancelled job and
    advice that fits launcher="submitit" (not an elastic trainer job's ``--join``)."""
    from rpc_collectors import WorkerLeftWarning

    collector = _submitit_collector(log_dir, None, sync=True, elastic=True, total_frames=-1, join_timeout=45)
    try:
        batches = iter(collector)
        next(batches)
        job = next(line.split()[0] for line in _queue() if line.endswith(" n2"))
        subprocess.run(["scancel", job], check=True, timeout=30)
        with pytest.warns(WorkerLeftWarning), pytest.raises(TimeoutError) as info:
            for _ in range(10_000):
                next(batches)
    finally:
        collector.shutdown()
    message = str(info.value)
    assert "join_timeout=45" in message and f"{job} CANCELLED" in message, message
    assert "launcher='submitit'" in message and "--join" not in message, message
    assert _wait_queue_empty(10) == []


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_collector_job_that_fails_to_start_is_a_clear_error(two_nodes, log_dir):
    with pytest.raises(RuntimeError, match=r"collector job \d+ ended as FAILED before it joined the trainer.*its log"):
        _submitit_collector(log_dir, None, sync=True, slurm_kwargs={"slurm_setup": ["exit 3"]})
    assert _wait_queue_empty(10) == []


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_cancelled_collector_job_is_one_worker_error_without_elastic_membership(two_nodes, log_dir):
    from rpc_collectors import WorkerError

    collector = _submitit_collector(log_dir, None, sync=True, total_frames=-1)
    try:
        batches = iter(collector)
        next(batches)
        job = next(line.split()[0] for line in _queue() if line.endswith(" n2"))
        subprocess.run(["scancel", job], check=True, timeout=30)
        with pytest.raises(WorkerError) as info:
            for _ in range(10_000):
                next(batches)
    finally:
        collector.shutdown()
    assert "(rank" in str(info.value) and f"SLURM jobs that ended: {job} CANCELLED" in str(info.value), str(info.value)
    assert _wait_queue_empty(10) == []


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", ["generic", "sync", "impala"])
def test_torchrls_submitit_scripts_run_without_a_folder(two_nodes, tmp_path, monkeypatch, capfd, script):
    """The calls of TorchRL's multi_nodes/generic.py, sync.py and IMPALA's impala_multi_node_submitit.py
    (slurm_kwargs without "folder"; CPU settings, on this cluster's partition): the jobs' logs go to
    ./log_test, as TorchRL's, which one line on stderr names; the batches are the envs' steps."""
    import conftest
    from rpc_collectors import Collector, DistributedCollector, DistributedSyncCollector, GymEnv

    cloudpickle.register_pickle_by_value(conftest)  # the jobs cannot import the tests' conftest
    env_class = conftest.CountEnv

    def make_env():
        return GymEnv(env_class())

    monkeypatch.chdir(tmp_path)
    slurm_conf = {"timeout_min": 100, "slurm_partition": "debug", "slurm_cpus_per_task": 1}
    collector_kwargs = {"device": "cpu", "storing_device": "cpu"}
    if script == "impala":
        collector = Collector(
            create_env_fn=make_env, backend="submitit", num_collectors=2, policy=None, frames_per_batch=40,
            total_frames=160, backend_options={"backend": "gloo", "collector_class": Collector,
                                               "collector_kwargs": collector_kwargs, "num_workers_per_collector": 1,
                                               "slurm_kwargs": slurm_conf},
            storing_device="cpu",
        )
    else:
        cls, sync = (DistributedCollector, {"sync": False}) if script == "generic" else (DistributedSyncCollector, {})
        collector = cls([make_env] * 2, None, num_workers_per_collector=1, frames_per_batch=40, total_frames=160,
                        collector_class=Collector, collector_kwargs=collector_kwargs, slurm_kwargs=slurm_conf,
                        storing_device="cpu", launcher="submitit", backend="gloo", **sync)
    try:
        frames = 0
        for batch in collector:
            assert batch.device == torch.device("cpu")
            _check_count_frames(batch)
            frames += batch.numel()
        jobs = [job.job_id for job in collector.workers.jobs.jobs]
    finally:
        collector.shutdown()
    folder = tmp_path / "log_test"
    said = [line for line in capfd.readouterr().err.splitlines() if "log_test" in line]
    assert said == [f"rpc_collectors: the collector jobs' logs go to {folder} (slurm_kwargs has no 'folder')"], said
    assert frames == 160 and len(jobs) == 2
    assert all((folder / f"{job}_0_log.err").exists() for job in jobs), sorted(p.name for p in folder.iterdir())
    assert _wait_queue_empty(30) == []
