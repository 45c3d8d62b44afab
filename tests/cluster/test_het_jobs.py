"""One SLURM job of a trainer group and collector groups (a heterogeneous job, rpc_collectors.cluster.het_jobs).

The unit tests check the configuration's checks and the script, without SLURM. The others run on the
session's two-node dev cluster (the ``two_nodes`` fixture of tests/conftest.py, shared with
tests/cluster/test_slurm.py and tests/cluster/test_requeue_slurm.py): partition ``learner`` is node n1,
``envs`` node n2. tests/scripts/het_trainer.py (tests/scripts/requeue_trainer.py, each task first
recording where it runs) trains in task 0 on n1 while two collector tasks serve on n2; a refusal comes
from a controller of its own that runs without sched/backfill, as SLURM needs for heterogeneous jobs.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import devcluster_module
from rpc_collectors import slurm
from rpc_collectors.cluster import checkpoint, het_jobs, requeue
from test_requeue_slurm import BATCH, STEP_SLEEP, job_processes, trainer_log, wait_for_batch, wait_for_end_of

REPO = Path(__file__).resolve().parents[2]
TRAINER = REPO / "tests" / "scripts" / "het_trainer.py"
GROUPS = [dict(partition="learner"), dict(partition="envs", tasks_per_node=2)]


def het_config(tmp_path: Path, **options) -> het_jobs.HetConfig:
    return het_jobs.HetConfig(options.pop("groups", GROUPS), log_dir=tmp_path / "logs", **options)


# --------------------------------------------------------------------------- without SLURM


@pytest.mark.timeout(60)
def test_the_script_has_a_block_per_group_and_one_step_across_them(tmp_path):
    groups = [dict(partition="gpu", gpus_per_node=1, cpus_per_task=8, sbatch_flags={"constraint": "a100"}),
              dict(partition="cpu", nodes=2, tasks_per_node=32, mem="64G"), dict(partition="cpu2")]
    script = slurm.sbatch_script(het_config(tmp_path, groups=groups, time_min=30, requeue=True,
                                            sbatch_flags={"account": "proj"}))
    blocks = script.split("# command")[0].split("#SBATCH hetjob\n")
    assert len(blocks) == 3, script
    for block, partition in zip(blocks, ["gpu", "cpu", "cpu2"]):
        for line in [f"--partition={partition}", "--time=30", "--requeue", "--signal=USR2@120", "--account=proj"]:
            assert f"#SBATCH {line}\n" in block, f"{line!r} missing from:\n{block}"
    assert "--gpus-per-node=1" in blocks[0] and "--cpus-per-task=8" in blocks[0] and "--constraint=a100" in blocks[0]
    assert "--nodes=2" in blocks[1] and "--ntasks-per-node=32" in blocks[1] and "--mem=64G" in blocks[1]
    assert "gpus" not in blocks[1] + blocks[2] and "constraint" not in blocks[1] + blocks[2]
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--het-group=0,1,2" in srun and "--kill-on-bad-exit=1" in srun and "submitit.core._submit" in srun
    assert het_config(tmp_path, groups=groups).num_tasks == 1 + 64 + 1
    # a group's sbatch_flags come after the job's: the group's own win
    script = slurm.sbatch_script(het_config(tmp_path, sbatch_flags={"qos": "low"},
                                            groups=[dict(sbatch_flags={"qos": "high"}), {}]))
    first, second = script.split("#SBATCH hetjob\n")
    assert "--qos=high" in first and "--qos=low" not in first and "--qos=low" in second


@pytest.mark.parametrize(
    "options, error, words",
    [
        ({"groups": [dict(partition="gpu")]}, TypeError, ["groups=", "2 or more dicts", "trainer"]),
        ({"groups": "gpu,cpu"}, TypeError, ["groups='gpu,cpu'", "2 or more dicts"]),
        ({"groups": [{}, dict(nodes=0)]}, ValueError, ["groups[1]: nodes=0", "int > 0"]),
        ({"groups": [dict(partition="a b"), {}]}, ValueError, ["groups[0]: partition='a b'", "without spaces"]),
        ({"groups": [{}, dict(mem="lots")]}, ValueError, ["groups[1]: mem='lots'", "16G"]),
        ({"groups": [{}, dict(sbatch_flags=["x"])]}, TypeError, ["groups[1]: sbatch_flags=", "dict"]),
        ({"groups": [{}, dict(time_min=5)]}, TypeError, ["groups[1]", "'time_min'", "beside groups="]),
        ({"nodes": 2}, TypeError, ["nodes=2 with groups=", "in each group's dict"]),
        ({"elastic": True}, ValueError, ["elastic=True with groups=", "join=<its job id>"]),
        ({"join": "12"}, ValueError, ["join='12' with groups="]),
        ({"frobnicate": 1}, TypeError, ["frobnicate", "accepted"]),
        ({"time_min": 2, "signal_delay_s": 115, "requeue": True}, ValueError, ["signal_delay_s=115", "time_min=2"]),
    ],
)
@pytest.mark.timeout(60)
def test_bad_groups_and_options_are_refused_before_anything_is_submitted(tmp_path, options, error, words):
    with pytest.raises(error) as info:
        slurm.submit(print, log_dir=tmp_path / "logs", **{"groups": GROUPS, **options})
    for word in words:
        assert word in str(info.value), str(info.value)
    assert not list(tmp_path.iterdir()), "nothing may be written before the arguments are valid"


@pytest.mark.timeout(60)
def test_sbatchs_refusal_of_heterogeneous_jobs_says_what_to_do_and_other_errors_stay_sbatchs(tmp_path):
    config = het_config(tmp_path)
    error = het_jobs.sbatch_error("sbatch: error: Batch job submission failed: Requested operation not supported "
                                  "on this system\n", config)
    assert isinstance(error, slurm.HetJobRefused)
    for words in ["refused the heterogeneous job of 2 groups", "Requested operation not supported", "sched/backfill",
                  "elastic=True", "partition='learner'", "join=<its job id>", "partition='envs'", "2 tasks"]:
        assert words in str(error), str(error)
    other = het_jobs.sbatch_error("sbatch: error: invalid partition specified: envs", config)
    assert not isinstance(other, slurm.HetJobRefused) and "invalid partition specified: envs" in str(other)


@pytest.mark.timeout(300)
def test_submit_py_takes_groups(tmp_path):
    """slurm/submit.py as users run it (a Python that imports torch: allow for a loaded machine)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    cmd = [sys.executable, str(REPO / "slurm" / "submit.py"), str(tmp_path / "train.py"), "--lr", "3",
           "--group", "partition=gpu,gpus-per-node=1", "--group", "partition=cpu,nodes=2,tasks-per-node=32",
           "--time", "30", "--log-dir", str(tmp_path / "logs"), "--dry-run"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=140, check=True).stdout
    first, second = out.split("#SBATCH hetjob\n")
    assert "--partition=gpu" in first and "--gpus-per-node=1" in first
    assert "--partition=cpu" in second and "--nodes=2" in second and "--ntasks-per-node=32" in second
    assert "--het-group=0,1" in second
    mixed = subprocess.run([*cmd, "--nodes", "2"], capture_output=True, text=True, timeout=140)
    assert mixed.returncode == 2 and "--nodes with --group" in mixed.stderr, mixed.stderr


# --------------------------------------------------------------------------- on the dev cluster


def records(folder: Path) -> dict[str, dict]:
    """What each task of het_trainer.py recorded, by ``<rank>_<restart>``."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))}


def group_states(job_id: str) -> dict[str, list[str]]:
    """Each group's state in every allocation (``sacct -D``), by ``<leader id>+<group>``."""
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "JobID,State"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    states: dict[str, list[str]] = {}
    for line in filter(None, out.splitlines()):
        component, state = line.split("|")
        states.setdefault(component, []).append(state)
    return states


def check_placement(recorded: dict[str, dict], cluster, restarts: int) -> None:
    """Task 0 on n1 (partition learner), the two collectors on n2 (envs), one rendezvous, in each allocation."""
    assert sorted(recorded) == sorted(f"{rank}_{r}" for rank in range(3) for r in range(restarts + 1)), sorted(recorded)
    for key, task in recorded.items():
        rank = int(key.split("_")[0])
        assert task["SLURMD_NODENAME"] == ("n1" if rank == 0 else "n2"), (key, task)
        assert (task["RANK"], task["WORLD_SIZE"]) == (str(rank), "3"), (key, task)
        assert task["LOCAL_RANK"] == str(max(rank - 1, 0)), (key, task)
        assert task["MASTER_ADDR"] == cluster.nodes["n1"] and task["MASTER_PORT"] == recorded["0_0"]["MASTER_PORT"]
        assert task["GLOO_SOCKET_IFNAME"] == "veth0", (key, task)


def submit_het(tmp_path: Path, frames: int, **options: object):
    """The het trainer job of ``frames`` (GROUPS), recording where each task ran."""
    return slurm.submit(slurm.run_script, str(TRAINER),
                        ["--record", str(tmp_path / "where"), "--frames", str(frames), "--batch", str(BATCH),
                         "--step-sleep", str(STEP_SLEEP)],
                        log_dir=tmp_path / "logs", groups=GROUPS, checkpoint_dir=tmp_path / "ckpt", **options)


def wait_gone(job_id: str) -> None:
    deadline = time.monotonic() + 30
    while job_processes(job_id):
        assert time.monotonic() < deadline, f"processes of job {job_id} outlived it: {job_processes(job_id)}"
        time.sleep(0.5)


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_het_job_trains_on_the_learner_node_with_collectors_on_the_env_node(two_nodes, tmp_path):
    frames = 10 * BATCH
    job = submit_het(tmp_path, frames, time_min=10)
    try:
        assert slurm.result(job, timeout_s=500) is None
        content = checkpoint.read(tmp_path / "ckpt" / checkpoint.FILE_NAME)
        assert content["frames"] == frames and sum(b["frames"] for b in content["extra"]["batches"]) == frames
        check_placement(records(tmp_path / "where"), two_nodes, restarts=0)
        wait_for_end_of(job)
        assert group_states(job.job_id) == {f"{job.job_id}+0": ["COMPLETED"], f"{job.job_id}+1": ["COMPLETED"]}
        assert [job.task(rank).stdout() is not None for rank in range(3)] == [True] * 3, "a task's log is missing"
        assert "batch 10 " in job.task(0).stdout()
        wait_gone(job.job_id)
    finally:
        subprocess.run(["scancel", job.job_id], timeout=60)


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_scontrol_requeue_of_a_het_job_brings_every_group_back_and_the_run_resumes(two_nodes, tmp_path):
    frames = 20 * BATCH
    job = submit_het(tmp_path, frames, time_min=30, requeue=True)
    try:
        wait_for_batch(job, 5)
        subprocess.run(["scontrol", "requeue", job.job_id], check=True, timeout=60)
        assert slurm.result(job, timeout_s=800) is None
        content = checkpoint.read(tmp_path / "ckpt" / checkpoint.FILE_NAME)
        batches, allocations = content["extra"]["batches"], content["allocations"]
        assert content["frames"] == frames and sum(b["frames"] for b in batches) == frames
        assert [a["end"] for a in allocations] == [requeue.STOPPED, "finished"] and allocations[0]["frames"] >= 5 * BATCH
        assert [a["restart"] for a in allocations] == [0, 1] and sorted({b["restart"] for b in batches}) == [0, 1]
        ids = [set().union(*(b["traj_ids"] for b in batches if b["restart"] == r)) for r in (0, 1)]
        assert not ids[0] & ids[1], "the resumed allocation reused trajectory ids"
        assert min(b["versions"][0] for b in batches if b["restart"] == 1) > \
            max(b["versions"][1] for b in batches if b["restart"] == 0)
        assert "SLURM requeues it (preempted or `scontrol requeue`)" in trainer_log(job)
        check_placement(records(tmp_path / "where"), two_nodes, restarts=1)
        wait_for_end_of(job)
        assert group_states(job.job_id) == {f"{job.job_id}+{g}": ["REQUEUED", "COMPLETED"] for g in (0, 1)}
        wait_gone(job.job_id)
    finally:
        subprocess.run(["scancel", job.job_id], timeout=60)


REFUSING_PORT = 6917


@contextlib.contextmanager
def controller_without_backfill(folder: Path):
    """A slurmctld of its own (port 6917, no nodes running, no accounting) with sched/builtin, under
    which SLURM takes no heterogeneous job; it uses the dev cluster's munged."""
    for sub in ("state", "log"):
        (folder / sub).mkdir(parents=True)
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(f"""\
ClusterName=rpccrefuse
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={REFUSING_PORT}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
StateSaveLocation={folder}/state
SlurmctldPidFile={folder}/slurmctld.pid
SlurmctldLogFile={folder}/log/slurmctld.log
NodeName=r1 NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=learner Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=envs Nodes=ALL MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    proc = subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-i"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not devcluster_module.load()._port_open("127.0.0.1", REFUSING_PORT):
            assert proc.poll() is None and time.monotonic() < deadline, (folder / "log" / "slurmctld.log").read_text()
            time.sleep(0.2)
        yield conf
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_a_cluster_that_refuses_het_jobs_is_a_clear_error(two_nodes, tmp_path, monkeypatch):
    with controller_without_backfill(tmp_path / "ctld") as conf:
        monkeypatch.setenv("SLURM_CONF", str(conf))
        with pytest.raises(slurm.HetJobRefused) as info:
            slurm.submit(print, log_dir=tmp_path / "logs", groups=GROUPS, time_min=5)
        # the same controller takes a plain job: it is the heterogeneous job it refuses
        plain = subprocess.run(["sbatch", "--parsable", "--hold", "--wrap", "true"], capture_output=True, text=True,
                               timeout=60)
        assert plain.returncode == 0, plain.stderr
    message = str(info.value)
    for words in ["refused the heterogeneous job", "not supported", "elastic=True", "join=<its job id>"]:
        assert words in message, message
    assert [p.name for p in (tmp_path / "logs").iterdir()] == [], "a refused job leaves no pickle or script"
