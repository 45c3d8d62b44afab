"""SLURM submission through submitit: one process per task, torch.distributed variables set.

``submit(fn, *args, log_dir=..., nodes=2, tasks_per_node=3)`` runs ``fn(*args)`` in every task
of one SLURM job after exporting RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT
(submitit's ``TorchDistributedEnvironment``), so ``RPCCollector`` (or any ``env://`` init)
finds its rendezvous. ``result(job)`` returns task 0's value or raises the first task failure.

Elastic runs (``RPCCollector(elastic=True)``): a trainer job submitted with ``elastic=True``
writes its rendezvous address to ``<log_dir>/<job id>_rendezvous.json``; a job submitted with
``join=<that job id>`` and the same ``log_dir`` runs collectors only, which join that trainer.
In both, a task that fails no longer ends the job's other tasks.

Runs longer than an allocation (``requeue=True``, with ``checkpoint_dir``): SLURM signals the job
``signal_delay_s`` before its time limit; the trainer finishes its batch, checkpoints
(:class:`~rpc_collectors.cluster.run_checkpoint.RunCheckpoint`) and the job requeues, as on
preemption (:mod:`rpc_collectors.cluster.requeue`).
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import runpy
import shlex
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import submitit
from submitit.helpers import TorchDistributedEnvironment
from submitit.slurm.slurm import _make_sbatch_string

from rpc_collectors.cluster import checkpoint, requeue, task_start
from rpc_collectors.cluster.task_hosts import (
    _check_interface,
    _check_port_free,
    _interface_names,
    _loopback,
    _resolve,
    _scontrol_node_addr,
)
from rpc_collectors.core import checks, rank_limits
from rpc_collectors.transport.rendezvous import interface_towards

__all__ = ["SlurmConfig", "submit", "result", "run_script", "sbatch_script",
           "setup_distributed_env", "master_address", "rendezvous_file"]

_MEM_RE = re.compile(r"^[0-9]+[KMGT]?$")
_FLAG_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
_JOB_ID_RE = re.compile(r"^[0-9]+(_[0-9]+)?$")
# A task that exits non-zero ends the whole job, so no rank waits forever for a dead peer;
# elastic jobs keep going: a failed collector's slot is taken by another.
_SRUN_ARGS = ("--kill-on-bad-exit=1",)
_ELASTIC_SRUN_ARGS = ("--kill-on-bad-exit=0",)
# a job's MASTER_PORT, below the kernel's ephemeral ports
JOB_PORTS = range(20000, 32768)
# how long a joining task waits for its trainer's rendezvous file
JOIN_WAIT_S = 600.0
# result(): seconds between its own asks of SLURM for a job's state
STATE_CHECK_S = 5.0


@dataclass(frozen=True)
class SlurmConfig:
    """Resources of one job. ``sbatch_flags`` adds ``--key=value`` lines (True: ``--key``)."""

    # stored as an absolute Path
    log_dir: str | os.PathLike
    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1
    partition: str | None = None
    time_min: int = 60
    mem: str | None = None
    sbatch_flags: Mapping[str, str | int | bool] = field(default_factory=dict)
    interface: str | None = None
    job_name: str = "rpc_collectors"
    # a trainer that collector jobs may join (writes its rendezvous file)
    elastic: bool = False
    # job id of an elastic trainer: this job runs collectors that join it
    join: str | None = None
    # at the time limit or on preemption the trainer checkpoints and the job requeues
    requeue: bool = False
    # seconds before the time limit that SLURM signals the job (submitit's USR2)
    signal_delay_s: int = 120
    # requeues the library may ask for: at the time limit, or after a signal SLURM sent
    # without a requeue (preemptions are SLURM's to count)
    max_requeues: int = 10
    # the tasks' $RPC_COLLECTORS_CHECKPOINT_DIR
    checkpoint_dir: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.log_dir, (str, os.PathLike)) or not str(self.log_dir):
            raise TypeError(f"log_dir={self.log_dir!r} is invalid; accepted: a folder path "
                            "(str or Path) that every node can read")
        object.__setattr__(self, "log_dir", Path(self.log_dir).expanduser().absolute())
        for name in ("nodes", "tasks_per_node", "cpus_per_task", "time_min"):
            checks.positive_int(name, getattr(self, name))
        checks.non_negative_int("gpus_per_node", self.gpus_per_node)
        for name in ("partition", "interface", "job_name"):
            _check_word(name, getattr(self, name), optional=name != "job_name")
        if self.mem is not None and not (isinstance(self.mem, str) and _MEM_RE.match(self.mem)):
            raise ValueError(f"mem={self.mem!r} is invalid; accepted: None or sbatch's --mem "
                             "format, e.g. '16G', '500M'")
        _check_sbatch_flags(self.sbatch_flags)
        checks.boolean("elastic", self.elastic)
        job_id = isinstance(self.join, str) and _JOB_ID_RE.match(self.join)
        if self.join is not None and not job_id:
            raise ValueError(f"join={self.join!r} is invalid; accepted: None or the SLURM job id "
                             "of an elastic trainer job, e.g. '1234'")
        checks.boolean("requeue", self.requeue)
        rank_limits.check_slurm_job(self.nodes, self.tasks_per_node)
        checks.positive_int("signal_delay_s", self.signal_delay_s)
        checks.non_negative_int("max_requeues", self.max_requeues)
        requeue.check_signal_delay(self.signal_delay_s, self.time_min, self.requeue)
        if self.join is not None and self.elastic:
            raise ValueError(f"elastic=True and join={self.join!r}: a job either trains (elastic) "
                             "or runs collectors that join a trainer (join); accepted: one of them")

    def sbatch_parameters(self) -> dict[str, Any]:
        """Keyword arguments for ``submitit.SlurmExecutor.update_parameters``."""
        params: dict[str, Any] = {
            "job_name": self.job_name,
            "nodes": self.nodes,
            "ntasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "time": self.time_min,
            "srun_args": list(_ELASTIC_SRUN_ARGS if self.elastic or self.join else _SRUN_ARGS),
            "signal_delay_s": self.signal_delay_s,
        }
        optional = {"gpus_per_node": self.gpus_per_node or None, "partition": self.partition,
                    "mem": self.mem, "additional_parameters": {
                        **({"requeue": True} if self.requeue else {}), **self.sbatch_flags} or None}
        params.update({k: v for k, v in optional.items() if v is not None})
        return params

    def task_stops(self) -> dict[str, Any] | None:
        """What the tasks need to checkpoint and requeue; a bad folder or checkpoint fails here."""
        stops: dict[str, Any] = {"max_requeues": self.max_requeues} if self.requeue else {}
        if self.checkpoint_dir is not None:
            stops["checkpoint_dir"] = str(checkpoint.check_directory(self.checkpoint_dir))
            if (Path(stops["checkpoint_dir"]) / checkpoint.FILE_NAME).exists():
                checkpoint.read(Path(stops["checkpoint_dir"]) / checkpoint.FILE_NAME)
        return stops or None


def _check_word(name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        accepted = "None or a" if optional else "a"
        raise ValueError(f"{name}={value!r} is invalid; accepted: {accepted} non-empty string "
                         "without spaces")


def _check_sbatch_flags(flags: Any) -> None:
    if not isinstance(flags, Mapping):
        raise TypeError(f"sbatch_flags={flags!r} is invalid; accepted: a dict such as "
                        "{'account': 'myproj', 'exclusive': True}")
    for key, value in flags.items():
        if not isinstance(key, str) or not _FLAG_RE.match(key):
            raise ValueError(f"sbatch_flags key {key!r} is invalid; accepted: an sbatch long "
                             "option name without dashes, e.g. 'account', 'qos', 'constraint'")
        if not isinstance(value, (str, int)) or value is False:
            raise ValueError(f"sbatch_flags[{key!r}]={value!r} is invalid; accepted: a string, "
                             "an int, or True for a flag without value")


def submit(fn: Callable[..., Any], *args: Any, **options: Any) -> submitit.Job:
    """Submit ``fn(*args)`` to run in every task; ``options`` are ``SlurmConfig`` fields.

    The function must be importable or picklable by cloudpickle. Use ``result(job)`` to wait.
    """
    if not callable(fn):
        raise TypeError(f"fn={fn!r} is not callable; accepted: a function run in every task")
    unknown = sorted(set(options) - {f.name for f in fields(SlurmConfig)})
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; accepted: "
                        f"{sorted(f.name for f in fields(SlurmConfig))}")
    config = SlurmConfig(**options)
    executor = submitit.SlurmExecutor(folder=config.log_dir, python=task_start.python_command())
    executor.update_parameters(**config.sbatch_parameters())
    return executor.submit(_run_task, fn, args, config.interface, config.gpus_per_node > 0,
                           config.elastic, config.join, str(config.log_dir), config.task_stops())


def sbatch_script(config: SlurmConfig) -> str:
    """The sbatch script ``submit`` would use for ``config`` (nothing is submitted)."""
    command = " ".join([task_start.python_command(), "-u -m submitit.core._submit",
                        shlex.quote(str(config.log_dir))])
    return _make_sbatch_string(command=command, folder=config.log_dir, **config.sbatch_parameters())


def result(job: submitit.Job, timeout_s: float | None = None, poll_s: float = 1.0) -> Any:
    """Wait for every task of ``job``; return task 0's value (None if it served a collector).

    Raises ``submitit.core.utils.FailedJobError`` (with the task's traceback) if a task raised,
    ``UncompletedJobError`` naming the SLURM state if the job was cancelled, timed out or killed,
    and ``TimeoutError`` if it has not finished after ``timeout_s`` (the job keeps running). A job's
    end is seen within about ``STATE_CHECK_S`` seconds of SLURM's accounting recording it.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    # submitit asks SLURM less and less often (up to once a minute): ask it ourselves
    asked = time.monotonic()
    while True:
        late = deadline is not None and time.monotonic() > deadline
        # at the deadline: the state as SLURM has it now
        force = late or time.monotonic() - asked >= STATE_CHECK_S
        if force:
            asked = time.monotonic()
        # submitit's cache can miss a requeued job's end
        state = requeue.job_state(job.job_id) if force else None
        if job.done(force_check=force) or (state is not None and state not in requeue.UNFINISHED):
            break
        if late:
            raise TimeoutError(f"SLURM job {job.job_id} has not finished after {timeout_s} s "
                               f"(state {state or job.state}); cancel it with `scancel "
                               f"{job.job_id}`")
        time.sleep(poll_s)
    state = requeue.job_state(job.job_id) or job.state
    tasks = [job.task(i) for i in range(job.num_tasks)]
    for task in tasks:
        if task.paths.result_pickle.exists():
            error = task.exception()
            if error is not None:
                raise submitit.core.utils.FailedJobError(
                    f"SLURM job {job.job_id}, task {task.task_id} raised:\n{error}") from error
    if not tasks[0].paths.result_pickle.exists():
        # collector servers end with exit code 0 and no result
        if state.startswith("COMPLETED"):
            return None
        raise submitit.core.utils.UncompletedJobError(
            f"SLURM job {job.job_id} ended as {state} without a result (cancelled, out of "
            f"time or killed); its log: {tasks[0].paths.stderr}\n{tasks[0].stderr() or ''}")
    return tasks[0].result()


def run_script(path: str | os.PathLike, argv: Sequence[str] = ()) -> None:
    """Run a Python script as ``__main__`` with ``sys.argv = [path, *argv]`` (in a task); as under
    ``python script.py``, its folder comes first on ``sys.path``, so it
    imports its sibling modules."""
    sys.argv = [str(path), *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except requeue.Requeued:
        # ends the task without a result: the job was requeued
        raise
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise RuntimeError(f"{path} exited with status {exit_.code!r}") from exit_


# --------------------------------------------------------------------------- inside a task


def _run_task(fn: Callable[..., Any], args: tuple, interface: str | None, gpus: bool,
              elastic: bool = False, join: str | None = None, log_dir: str = "",
              stops: dict | None = None, dist_env: Any = None) -> Any:
    if stops is not None and "checkpoint_dir" in stops:
        os.environ[checkpoint.ENV_DIR] = stops["checkpoint_dir"]
    # replaces submitit's handlers (see cluster/requeue.py)
    if stops is not None and "max_requeues" in stops:
        trainer_job = join or os.environ["SLURM_JOB_ID"]
        trainer = join is None and os.environ.get("SLURM_PROCID", "0") == "0"
        # the trainer's job's collector tasks tell it of their signals
        requeue.install(trainer=trainer, forward=join is None and not trainer,
                        max_requeues=stops["max_requeues"],
                        rendezvous=rendezvous_file(log_dir, trainer_job),
                        followers=Path(log_dir) / f"{trainer_job}_followers" if elastic or join
                        else None)
    # a signal that came while the task started is handled now (submitit's, without requeue)
    requeue.unblock()
    if join is not None:
        setup_join_env(rendezvous_file(log_dir, join), interface)
    else:
        dist_env = setup_distributed_env(interface, gpus, dist_env)
        if elastic and dist_env.rank == 0:
            _write_json(rendezvous_file(log_dir, os.environ["SLURM_JOB_ID"]),
                        {"master_addr": dist_env.master_addr, "master_port": dist_env.master_port})
    return fn(*args)


def rendezvous_file(log_dir: str | os.PathLike, job_id: str) -> Path:
    """Where elastic trainer job ``job_id`` leaves its rendezvous address for collector jobs."""
    return Path(log_dir) / f"{job_id}_rendezvous.json"


def _write_json(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    # readers never see half a file
    tmp.replace(path)


def setup_join_env(path: Path, interface: str | None = None, wait_s: float = JOIN_WAIT_S) -> str:
    """Export ``RPC_COLLECTORS_JOIN`` from an elastic trainer's rendezvous file (waiting up to
    ``wait_s`` for the trainer to write it) and pick the network interface towards it."""
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no elastic trainer wrote {path} within {wait_s:.0f} s: is the "
                               "trainer job running, submitted with elastic=True (submit.py "
                               "--elastic), with this log_dir?")
        time.sleep(1.0)
    record = json.loads(path.read_text())
    address = record["master_addr"]
    trainer_is_local = ipaddress.ip_address(_resolve(address) or address).is_loopback
    ifname = task_interface(interface, address, remote_peers=not trainer_is_local)
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["TP_SOCKET_IFNAME"] = ifname
    os.environ["RPC_COLLECTORS_JOIN"] = f"{address}:{record['master_port']}"
    return os.environ["RPC_COLLECTORS_JOIN"]


def setup_distributed_env(interface: str | None = None, set_cuda_visible_devices: bool = False,
                          dist_env: Any = None) -> TorchDistributedEnvironment:
    """Export the torch.distributed variables of this SLURM task and pick the network interface.

    MASTER_ADDR is the first node's address as other nodes reach it (``scontrol``'s NodeAddr
    when its name does not resolve or resolves to loopback); MASTER_PORT is derived from the
    job id unless already set (:func:`job_port`). GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME are
    set to ``interface`` (default: GLOO_SOCKET_IFNAME if it reaches the other nodes, else the
    interface that routes to MASTER_ADDR; see :func:`task_interface`). ``dist_env``: read already.
    """
    dist_env = dist_env or TorchDistributedEnvironment()
    if "MASTER_PORT" not in os.environ:
        dist_env.master_port = job_port(os.environ["SLURM_JOB_ID"])
    num_nodes = dist_env.world_size // dist_env.local_world_size
    dist_env.master_addr = master_address(dist_env.master_addr, multi_node=num_nodes > 1)
    if dist_env.rank == 0:
        _check_port_free(dist_env.master_port)
    ifname = task_interface(interface, dist_env.master_addr, remote_peers=num_nodes > 1)
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["TP_SOCKET_IFNAME"] = ifname
    return dist_env.export(set_cuda_visible_devices=set_cuda_visible_devices, overwrite=True)


def job_port(job_id: str) -> int:
    """The rendezvous port of SLURM job ``job_id``: the same on every node, and below Linux's
    ephemeral range (32768 and up), so no connection a process opens can hold it."""
    return JOB_PORTS[int(job_id.split("_")[0]) % len(JOB_PORTS)]


def master_address(hostname: str, multi_node: bool) -> str:
    """An IPv4 address of node ``hostname`` that the job's other nodes can reach."""
    address = _resolve(hostname)
    if address is None or ipaddress.ip_address(address).is_loopback:
        node_addr = _scontrol_node_addr(hostname)
        address = (_resolve(node_addr) if node_addr else None) or address
    if address is None:
        raise RuntimeError(f"cannot resolve the master node {hostname!r}, neither by name nor "
                           "through `scontrol show node`")
    if multi_node and ipaddress.ip_address(address).is_loopback:
        raise RuntimeError(
            f"the master node {hostname!r} resolves to the loopback address {address}, which "
            "other nodes cannot reach; fix its /etc/hosts entry or its NodeAddr in slurm.conf")
    return address


def task_interface(interface: str | None, peer: str, remote_peers: bool) -> str:
    """The interface a task binds gloo and TensorPipe to, to reach ``peer`` (the master, or the
    trainer a collector joins) and, with ``remote_peers``, tasks on other nodes.

    ``interface`` (given to :func:`submit`) is checked. Otherwise ``GLOO_SOCKET_IFNAME`` is used
    when it names an interface of this node that reaches those peers: sbatch copies the
    submitting process's environment into the job, so the variable may well be the submitter's,
    a loopback interface (other nodes would be told to connect to 127.0.0.1) or one that this
    node lacks. Else the interface that routes to ``peer``.
    """
    if interface:
        ifname = _check_interface(interface)
        if remote_peers and _loopback(ifname):
            raise ValueError(f"interface={interface!r} is a loopback interface, which the job's "
                             "other nodes cannot reach; accepted here: "
                             f"{[n for n in _interface_names() if not _loopback(n)]}")
        return ifname
    preset = os.environ.get("GLOO_SOCKET_IFNAME")
    if preset in _interface_names() and not (remote_peers and _loopback(preset)):
        return preset
    return interface_towards(peer)


