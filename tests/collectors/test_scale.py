"""Many workers on one trainer: 4 node collectors x 16 local workers, and torchrun with 16 collector ranks.

Each local worker steps ``test_restarts.StampEnv``, whose observation holds the pid of the
process that stepped it and its step counter, so a batch alone shows whose frames it holds and
whether one was lost or repeated; ``BiasPolicy`` picks the action its weights say, so a batch
shows which weights collected it.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest
import torch

from procs import descendants, run_in_session, wait_gone
from rpc_collectors import GymEnv, RPCCollector
from rpc_collectors.transport.rendezvous import free_port
from test_restarts import StampEnv
from test_rpc_collector import BiasPolicy

pytestmark = pytest.mark.multiprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODES, PER_NODE, STEPS, ROUNDS = 4, 16, 10, 4
TRAJ_IDS, VERSION = ("collector", "traj_ids"), ("collector", "policy_version")


def stamp_env() -> GymEnv:
    return GymEnv(StampEnv(0))


@pytest.mark.timeout(300)
def test_64_local_workers_as_4_nodes_collect_every_frame_once_with_the_pushed_weights(no_leftover_processes):
    workers = NODES * PER_NODE
    policy = BiasPolicy(0, size=3)
    collector = RPCCollector(
        stamp_env, policy, num_collectors=NODES, collector_class="sync", num_workers_per_collector=PER_NODE,
        launcher="local", frames_per_batch=workers * STEPS, total_frames=workers * STEPS * ROUNDS,
        cat_results="stack", track_policy_version=True, rpc_timeout=120,
    )
    with collector:
        local_pids = [pid for info in collector.infos for pid in info["local_pids"]]
        batches = []
        for round_ in range(ROUNDS):
            batch = collector.next().clone()
            batches.append(batch)
            policy.set_action((round_ + 1) % 2)
            collector.update_policy_weights_()
    assert len(set(local_pids)) == workers
    assert sum(b.numel() for b in batches) == workers * STEPS * ROUNDS
    owners: dict[int, int] = {}  # trajectory id -> the process whose frames carry it
    for version, batch in enumerate(batches):
        assert batch.shape == (NODES, PER_NODE, STEPS)
        obs = batch["observation"].reshape(workers, STEPS, -1)
        pids = obs[:, :, 0]
        assert (pids == pids[:, :1]).all(), "a row holds frames of two processes"
        assert sorted(pids[:, 0].long().tolist()) == sorted(local_pids), "a local worker's frames are missing"
        assert (obs[:, :, 1].diff(dim=1) == 1).all(), "frames missing or repeated within a batch"
        # every local worker of every node ran the weights pushed before this batch
        assert (batch["action"].reshape(workers, STEPS) == version % 2).all()
        assert (batch[VERSION] == version).all()
        for row, ids in zip(pids[:, 0].long().tolist(), batch[TRAJ_IDS].reshape(workers, STEPS).tolist()):
            for traj_id in ids:
                assert owners.setdefault(traj_id, row) == row, f"trajectory id {traj_id} used by two workers"
    # frames continue across batches: each process's step counter picks up where it left off
    first = torch.stack([b["observation"].reshape(workers, STEPS, -1)[:, 0, 1] for b in batches])
    by_pid = [{int(p): float(c) for p, c in zip(b["observation"].reshape(workers, STEPS, -1)[:, 0, 0], f)}
              for b, f in zip(batches, first)]
    for earlier, later in zip(by_pid, by_pid[1:]):
        assert all(later[pid] == earlier[pid] + STEPS for pid in earlier)


@pytest.mark.timeout(300)
def test_torchrun_with_16_collector_ranks_collects_updates_and_exits_zero():
    ranks, per_batch = 16, 16 * 25
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        f"--nproc-per-node={ranks + 1}", f"--master-port={free_port()}", os.path.join(ROOT, "launch", "collect.py"),
        "--frames", str(per_batch * 4), "--frames-per-batch", str(per_batch), "--rpc-timeout", "240",
    ]
    before = descendants()
    run = run_in_session(cmd, timeout=280, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    summaries = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1, "only the trainer (rank 0) prints a summary"
    summary = summaries[0]
    assert summary["launcher"] == "torchrun" and summary["workers"] == ranks
    assert summary["frames"] == per_batch * 4
    assert summary["policy_versions"] == [0, 1]
    assert "exitcode" not in run.stderr  # torchrun reports no failed rank
    assert not wait_gone(descendants() - before, 30)
