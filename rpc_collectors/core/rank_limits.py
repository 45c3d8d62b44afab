"""How many collector ranks one trainer may have over ``torch.distributed.rpc``, checked before any
process starts (on a torchrun/SLURM rank, before ``init_rpc``).

Two limits live here, each measured by ``benchmarks/rpc_limits.py`` (docs/scaling.md, "RPC's
limits"):

- the trainer's open files: every rank costs the trainer sockets (TensorPipe's connections,
  gloo's, the rendezvous store's);
  :func:`check_open_files` raises the soft ``RLIMIT_NOFILE`` up to the hard limit when it is
  short, and else refuses the run;
- the ranks measured to start: ``torch.distributed.rpc`` is in maintenance mode upstream and
  reports of ``init_rpc`` failing at a few dozen ranks exist (pytorch/pytorch#85607);
  :func:`check_ranks` warns past the sizes this library was measured at.

Past either, node collectors keep the ranks equal to the nodes (``collector_class="sync"``,
``num_workers_per_collector=W``), and ``RayCollector`` runs its workers without RPC ranks.
"""
from __future__ import annotations

import os
import resource

from rpc_collectors.core.user_warnings import warn

# the trainer's open files with its RPC agent up, besides those of its ranks (146-150 measured)
BASE_OPEN_FILES = 150
# the sockets each collector rank adds to them: 3 to the rendezvous store, 5 of the trainer's pipe
# to the rank, 5 of the rank's to the trainer (opened at its first ping); 13 measured, 64-80 ranks
OPEN_FILES_PER_RANK = 13
# files the trainer keeps for everything else it opens (datasets, logs, checkpoints)
SPARE_OPEN_FILES = 256
# the most collector ranks measured to start, collect, push and stop here, all together
MEASURED_RANKS = 80
# of them, the most in one host
MEASURED_RANKS_PER_HOST = 64
ALTERNATIVES = (
    "node collectors keep the ranks equal to the nodes (collector_class='sync', "
    "num_workers_per_collector=W: one rank per host, W local workers in it), and RayCollector "
    "runs its workers without RPC ranks"
)


def open_files_needed(ranks: int) -> int:
    """The open files a trainer of ``ranks`` collector ranks needs, with room for its own."""
    return BASE_OPEN_FILES + OPEN_FILES_PER_RANK * ranks + SPARE_OPEN_FILES


def check_open_files(ranks: int, given: str) -> int:
    """Make this process's soft ``RLIMIT_NOFILE`` enough for ``ranks`` collector ranks, raising
    it up to the hard limit; returns the soft limit then in force.

    ``ValueError`` naming ``given`` (the argument that set ``ranks`` and its value,
    ``"name=value"``), the need and the fix when the hard limit is too low too."""
    need = open_files_needed(ranks)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    most = max(0, (hard - BASE_OPEN_FILES - SPARE_OPEN_FILES) // OPEN_FILES_PER_RANK)
    raise ValueError(
        f"{given}: the trainer needs about {need} open files for {ranks} collector "
        f"ranks ({OPEN_FILES_PER_RANK} per rank), but its RLIMIT_NOFILE is {soft} (hard limit "
        f"{hard}); raise the hard limit (`ulimit -Hn {need}` as root before the run, 'nofile' in "
        "/etc/security/limits.conf, or the limit of the SLURM nodes, which srun propagates), or "
        f"run fewer ranks: accepted with this limit at most {most}; {ALTERNATIVES}"
    )


def check_ranks(ranks: int, given: str, per_host: int | None = None) -> None:
    """Warn when ``ranks`` collector ranks (``per_host`` processes of the run in one host, when
    known) are more than were measured to work, naming ``given`` (``"name=value"``) and the
    alternatives."""
    if ranks > MEASURED_RANKS:
        warn(f"{given}: {ranks} collector ranks, more than the {MEASURED_RANKS} that "
             "torch.distributed.rpc (in maintenance mode upstream) was measured to start with "
             "this library (docs/scaling.md, \"RPC's limits\"); past it, " + ALTERNATIVES)
    if per_host is not None and per_host > MEASURED_RANKS_PER_HOST:
        warn(f"{given}: {per_host} ranks in one host, more than the "
             f"{MEASURED_RANKS_PER_HOST} measured to start in one host (upstream reports init_rpc "
             "failing above 18, pytorch/pytorch#85607); past it, " + ALTERNATIVES)


def ranks_per_host() -> int | None:
    """The ranks of one host under torchrun (``LOCAL_WORLD_SIZE``) or SLURM
    (``SLURM_NTASKS_PER_NODE``); None when neither says."""
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def check_trainer(ranks: int, given: str) -> None:
    """Both checks, for a trainer of ``ranks`` collector ranks about to start its RPC agent."""
    check_open_files(ranks, given)
    check_ranks(ranks, given, ranks_per_host())


def check_slurm_job(nodes: int, tasks_per_node: int) -> None:
    """:func:`check_ranks` for a SLURM job of ``nodes`` x ``tasks_per_node`` tasks (one trains)."""
    check_ranks(nodes * tasks_per_node - 1, f"nodes={nodes}, tasks_per_node={tasks_per_node}",
                tasks_per_node)
