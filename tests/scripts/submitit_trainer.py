"""A trainer that submits its collectors as SLURM jobs (``launcher="submitit"``) and collects
until it is killed or interrupted, for tests/cluster/test_slurm.py; run with SLURM_CONF set.

    python tests/scripts/submitit_trainer.py LOG_DIR [FRAMES]

Prints one JSON line once the first batch arrived: the collectors' pids and the guard's pid.
With FRAMES it collects that many frames and returns without shutting the collector down, as
a script that simply ends.
"""
from __future__ import annotations

import json
import sys

import cloudpickle

import conftest
from rpc_collectors import DistributedCollector, GymEnv

cloudpickle.register_pickle_by_value(conftest)  # the jobs cannot import the tests' conftest


CountEnv = conftest.CountEnv


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def main() -> None:
    frames = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    collector = DistributedCollector(
        [count_env] * 2, None, frames_per_batch=20, total_frames=frames, sync=True, launcher="submitit",
        slurm_kwargs={"folder": sys.argv[1], "timeout_min": 5}, rpc_timeout=20, join_timeout=120,
    )
    for i, _batch in enumerate(collector):
        if i == 0:
            print(json.dumps({"pids": [info["pid"] for info in collector.infos],
                              "guard": collector.workers.jobs._guard.pid}), flush=True)


if __name__ == "__main__":
    main()
