"""Heterogeneous SLURM jobs: the trainer's resources and the collectors' in one allocation.

``submit(fn, *args, log_dir=..., groups=[dict(partition="gpu", gpus_per_node=1),
dict(partition="cpu", nodes=2, tasks_per_node=32)])`` submits one job of several resource groups
(sbatch's ``#SBATCH hetjob`` between them) whose tasks run as one ``srun --het-group=0,1,...``
step. Task 0, the trainer, is group 0's first task; RANK counts on across the groups, and the
tasks after task 0 serve collectors, as in any job of :mod:`.submission`. submitit has no
heterogeneous jobs: the script is written here from submitit's sbatch lines for each group, and
the job is a ``submitit.SlurmJob`` with submitit's pickles and log paths, so that ``result(job)``
waits for it as for any job. ``requeue=True`` requeues the whole job: ``scontrol requeue`` of the
leader (group 0) requeues every group.

In such a step (SLURM 22.05) every task sees the leader's job id as SLURM_JOB_ID, its rank among
all tasks as SLURM_PROCID, and each group's nodes and task count in
``SLURM_JOB_NODELIST_HET_GROUP_<g>`` and ``SLURM_NTASKS_HET_GROUP_<g>``; MASTER_ADDR is group 0's
first node, which need not be the first of the job's sorted node list.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import uuid
from typing import Any, Callable, Mapping, Sequence

import submitit
from submitit.core.utils import DelayedSubmission, FailedSubmissionError
from submitit.helpers import TorchDistributedEnvironment
from submitit.slurm.slurm import _make_sbatch_string, _parse_node_list

from rpc_collectors.cluster import submission, task_start
from rpc_collectors.cluster.submission import SlurmConfig

__all__ = ["HetConfig", "HetJobRefused", "submit", "sbatch_script", "het_environment"]

# a group's resources; the other SlurmConfig fields are the job's, the same for every group
GROUP_FIELDS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "partition", "mem",
                "sbatch_flags")
# words of sbatch's refusal of a heterogeneous job (22.05 without sched/backfill: "Requested
# operation not supported on this system"; a site may have it "presently disabled")
_REFUSALS = ("not supported", "presently disabled", "heterogeneous", "hetjob")
_EXAMPLE = ("[dict(partition='gpu', gpus_per_node=1), "
            "dict(partition='cpu', nodes=2, tasks_per_node=32)]")


class HetJobRefused(FailedSubmissionError):
    """The cluster refused a heterogeneous job; the message says what sbatch answered and how to
    run the same trainer and collectors as two jobs."""


class HetConfig:
    """A heterogeneous job: ``groups[g]`` holds group g's fields of ``GROUP_FIELDS`` (group 0 runs
    task 0, the trainer), ``options`` the other ``SlurmConfig`` fields, the job's. ``sbatch_flags``
    given in ``options`` apply to every group, under each group's own."""

    def __init__(self, groups: Sequence[Mapping[str, Any]], **options: Any) -> None:
        if (not isinstance(groups, (list, tuple)) or len(groups) < 2
                or not all(isinstance(group, Mapping) for group in groups)):
            raise TypeError(f"groups={groups!r} is invalid; accepted: a list of 2 or more dicts "
                            f"of {list(GROUP_FIELDS)}, group 0 the trainer's (task 0), e.g. "
                            f"{_EXAMPLE}")
        names = {f.name for f in dataclasses.fields(SlurmConfig)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; accepted: {sorted(names)}")
        per_group = [name for name in GROUP_FIELDS[:-1] if name in options]
        if per_group:
            raise TypeError(f"{per_group[0]}={options[per_group[0]]!r} with groups=...: it is a "
                            f"group's resource; accepted: {per_group[0]} in each group's dict, "
                            f"e.g. groups={_EXAMPLE}")
        for name in ("elastic", "join"):
            if options.get(name):
                raise ValueError(f"{name}={options[name]!r} with groups=...: a heterogeneous job "
                                 "runs the trainer and its collectors already; accepted: groups "
                                 "without elastic/join, or two jobs without groups (the trainer "
                                 "with elastic=True, the collectors with join=<its job id>)")
        self.job = SlurmConfig(**options)
        self.groups = tuple(self._group(index, group) for index, group in enumerate(groups))

    def _group(self, index: int, group: Mapping[str, Any]) -> SlurmConfig:
        unknown = sorted(set(group) - set(GROUP_FIELDS))
        if unknown:
            raise TypeError(f"groups[{index}] has unknown key(s) {unknown}; accepted: "
                            f"{list(GROUP_FIELDS)} (the job's options go beside groups=)")
        flags = group.get("sbatch_flags", {})
        if isinstance(flags, Mapping):
            flags = {**self.job.sbatch_flags, **flags}
        try:
            # SlurmConfig's own checks, each error prefixed with the group it is about
            return dataclasses.replace(self.job, **{**group, "sbatch_flags": flags})
        except (TypeError, ValueError) as err:
            raise type(err)(f"groups[{index}]: {err}") from None

    @property
    def num_tasks(self) -> int:
        """The tasks of every group together (WORLD_SIZE)."""
        return sum(group.nodes * group.tasks_per_node for group in self.groups)


def submit(fn: Callable[..., Any], *args: Any, groups: Sequence[Mapping[str, Any]] | None = None,
           **options: Any) -> submitit.Job:
    """:func:`.submission.submit`; with ``groups``, one heterogeneous job (:class:`HetConfig`).

    Raises :class:`HetJobRefused` where the cluster does not run heterogeneous jobs.
    """
    if groups is None:
        return submission.submit(fn, *args, **options)
    if not callable(fn):
        raise TypeError(f"fn={fn!r} is not callable; accepted: a function run in every task")
    config = HetConfig(groups, **options)
    folder = config.job.log_dir
    delayed = DelayedSubmission(_run_het_task, fn, args, config.job.interface,
                                [group.gpus_per_node > 0 for group in config.groups], str(folder),
                                config.job.task_stops())
    folder.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex
    pickle, script = folder / f"{tag}.pkl", folder / f".submission_file_{tag}.sh"
    delayed.dump(pickle)
    script.write_text(sbatch_script(config))
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise sbatch_error(done.stderr or done.stdout, config)
    except BaseException:
        pickle.unlink(missing_ok=True)
        script.unlink(missing_ok=True)
        raise
    job = submitit.SlurmJob(folder=folder, job_id=done.stdout.strip().split(";")[0],
                            tasks=list(range(config.num_tasks)))
    # the tasks wait up to a minute for the pickle (submitit's _submit)
    job.paths.move_temporary_file(pickle, "submitted_pickle")
    job.paths.move_temporary_file(script, "submission_file", keep_as_symlink=True)
    return job


def sbatch_error(answer: str, config: HetConfig) -> FailedSubmissionError:
    """The error for sbatch's ``answer`` (its stderr) to a heterogeneous job: a
    :class:`HetJobRefused` when the cluster does not run them."""
    answer = answer.strip()
    if not any(word in answer.lower() for word in _REFUSALS):
        return FailedSubmissionError(f"sbatch refused the heterogeneous job: {answer}")
    first, rest = config.groups[0], config.groups[1:]
    collectors = sum(group.nodes * group.tasks_per_node for group in rest)
    return HetJobRefused(
        f"this SLURM cluster refused the heterogeneous job of {len(config.groups)} groups (sbatch: "
        f"{answer}): it does not run heterogeneous jobs (SLURM needs SchedulerType=sched/backfill "
        "for them; a site may also disable them). Submit the trainer and the collectors as two "
        "jobs instead, the script building its RPCCollector with elastic=True: the trainer with "
        f"elastic=True and partition={first.partition!r} (slurm/submit.py --elastic), then the "
        f"collectors with join=<its job id> and partition={rest[0].partition!r}, {collectors} "
        "tasks (slurm/submit.py --join JOBID), with the same log_dir")


def sbatch_script(config: SlurmConfig | HetConfig) -> str:
    """The sbatch script that ``submit`` would use for ``config`` (nothing is submitted)."""
    if isinstance(config, SlurmConfig):
        return submission.sbatch_script(config)
    blocks = []
    for group in config.groups:
        lines = _make_sbatch_string(command="", folder=config.job.log_dir,
                                    **group.sbatch_parameters()).splitlines()
        blocks.append("\n".join(line for line in lines if line.startswith("#SBATCH")))
    folder = shlex.quote(str(config.job.log_dir))
    srun_args = " ".join(config.job.sbatch_parameters()["srun_args"])
    # srun's %j and %t name a group's files after its own job id and an offset rank: each task
    # writes submitit's <leader id>_<rank>_log.out and .err itself
    logs = 'exec "$@" >>"${0}_${SLURM_PROCID}_log.out" 2>>"${0}_${SLURM_PROCID}_log.err"'
    command = (f"srun --unbuffered --het-group={','.join(map(str, range(len(config.groups))))} "
               f"{srun_args} bash -c {shlex.quote(logs)} {folder}/\"$SLURM_JOB_ID\" "
               f"{task_start.python_command()} -u -m submitit.core._submit {folder}")
    return "\n".join(["#!/bin/bash", "", "# Parameters", "\n#SBATCH hetjob\n".join(blocks), "",
                      "# command", "export SUBMITIT_EXECUTOR=slurm", command, ""])


# --------------------------------------------------------------------------- inside a task


def het_environment() -> TorchDistributedEnvironment:
    """This task's torch.distributed variables in a heterogeneous job's step, read from SLURM's
    per-group variables: RANK and WORLD_SIZE across every group, MASTER_ADDR group 0's first
    node, LOCAL_WORLD_SIZE the tasks per node (submitit's count: all tasks over all nodes)."""
    groups = range(int(os.environ["SLURM_HET_SIZE"]))
    tasks = [int(os.environ[f"SLURM_NTASKS_HET_GROUP_{g}"]) for g in groups]
    nodes = [_parse_node_list(os.environ[f"SLURM_JOB_NODELIST_HET_GROUP_{g}"]) for g in groups]
    dist_env = TorchDistributedEnvironment()
    if dist_env.world_size != sum(tasks):
        raise RuntimeError(f"this step runs {dist_env.world_size} tasks (SLURM_NTASKS), the job's "
                           f"groups {tasks} (SLURM_NTASKS_HET_GROUP_*): the tasks must be started "
                           f"in one step of every group (srun --het-group=0-{len(tasks) - 1})")
    dist_env.master_addr = nodes[0][0]
    dist_env.local_world_size = dist_env.world_size // len(set().union(*nodes))
    return dist_env


def het_group(rank: int) -> int:
    """The group that task ``rank`` of a heterogeneous job's step runs in."""
    first = 0
    for group in range(int(os.environ["SLURM_HET_SIZE"])):
        first += int(os.environ[f"SLURM_NTASKS_HET_GROUP_{group}"])
        if rank < first:
            return group
    raise RuntimeError(f"rank {rank} is in no group of this job ({first} tasks)")


def _run_het_task(fn: Callable[..., Any], args: tuple, interface: str | None, gpus: list[bool],
                  log_dir: str, stops: dict | None) -> Any:
    dist_env = het_environment()
    return submission._run_task(fn, args, interface, gpus[het_group(dist_env.rank)],
                                log_dir=log_dir, stops=stops, dist_env=dist_env)
