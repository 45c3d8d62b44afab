"""SLURM submission through submitit (``from rpc_collectors import slurm``): one process per
task, with the torch.distributed variables set. Defined in
:mod:`rpc_collectors.cluster.submission`; ``submit(..., groups=[...])``, one heterogeneous job of
a trainer group and collector groups, in :mod:`rpc_collectors.cluster.het_jobs`."""
from rpc_collectors.cluster.checkpoint import CheckpointError
from rpc_collectors.cluster.het_jobs import HetConfig, HetJobRefused, sbatch_script, submit
from rpc_collectors.cluster.requeue import Requeued
from rpc_collectors.cluster.run_checkpoint import RunCheckpoint
from rpc_collectors.cluster.submission import (
    SlurmConfig,
    job_port,
    master_address,
    rendezvous_file,
    result,
    run_script,
    setup_distributed_env,
    setup_join_env,
    task_interface,
)

__all__ = [
    "CheckpointError", "HetConfig", "HetJobRefused", "Requeued", "RunCheckpoint",
    "SlurmConfig", "job_port", "master_address", "rendezvous_file", "result", "run_script",
    "sbatch_script",
    "setup_distributed_env", "setup_join_env", "submit", "task_interface",
]
