"""tests/scripts/requeue_trainer.py in a heterogeneous SLURM job, for tests/cluster/test_het_jobs.py:
each task first records where it runs and the torch.distributed variables it was given.

    --record DIR        each task writes DIR/<RANK>_<SLURM_RESTART_COUNT>.json (its node, address,
                        group, RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
    (the other arguments are requeue_trainer.py's)
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import requeue_trainer

RECORDED = ("SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_PROCID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "SLURM_RESTART_COUNT")


def main() -> None:
    at = sys.argv.index("--record")
    folder = Path(sys.argv[at + 1])
    del sys.argv[at:at + 2]
    folder.mkdir(parents=True, exist_ok=True)
    record = {name: os.environ.get(name) for name in RECORDED}
    name = f"{os.environ['RANK']}_{os.environ.get('SLURM_RESTART_COUNT', '0') or '0'}.json"
    (folder / name).write_text(json.dumps(record))
    requeue_trainer.main()


if __name__ == "__main__":
    main()
