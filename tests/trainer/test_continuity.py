"""Trajectory continuity where a worker's stream is cut: a batch dropped for ``max_policy_lag`` (by
the trainer, or by a node collector for its local workers), a worker replaced, a resume.

Each path is run on ``CountEnv``, whose observations say ``[t, episode, last action]``: within
one trajectory id the steps must be consecutive (:mod:`continuity`), and where the path allows,
each worker's frames must be those of a single-process ``Collector`` on the same env, less the
frames dropped.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from conftest import CountEnv, TDCountEnv
from continuity import TRAJ, assert_no_gaps, rows, steps
from rpc_collectors import Collector, GymEnv, MultiAsyncCollector, RPCCollector, WorkerRestartWarning
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(240)]

FRAMES = 7  # batches end mid-episode


def count_env() -> GymEnv:
    """Episodes longer than a batch, so a dropped batch falls inside one."""
    return GymEnv(CountEnv(lengths=(20, 31, 9)))


def td_count_env() -> TDCountEnv:
    """The same episodes behind TorchRL's ``EnvBase`` protocol."""
    return TDCountEnv(lengths=(20, 31, 9))


def single_process(make_env, batches: int) -> list[torch.Tensor]:
    """The steps of a single-process ``Collector``'s first ``batches`` batches on ``make_env()``."""
    with Collector(make_env, BiasPolicy(1, size=3), frames_per_batch=FRAMES) as c:
        return [steps(c.next())[0] for _ in range(batches)]


def assert_single_process_less_the_dropped(make_env, per_worker: dict[int, list[torch.Tensor]]) -> None:
    """Each worker's batches, in order, are batches of the single-process stream, in order (the
    ones between them were dropped): the env was neither reset nor stepped by a dropped batch twice."""
    longest = max(len(kept) for kept in per_worker.values())
    reference = single_process(make_env, 4 * longest + 8)
    for worker, kept in per_worker.items():
        position = 0
        for n, batch in enumerate(kept):
            while position < len(reference) and not torch.equal(reference[position], batch):
                position += 1
            assert position < len(reference), f"worker {worker}'s batch {n} is not the single-process stream's next"
            position += 1


def lag_run(make, batches: int = 40) -> tuple[list, dict, int]:
    """A trainer that bumps the weights after every batch; the batches, each worker's, the drops."""
    handed, per_worker = [], {}
    with make() as c:
        for i, batch in enumerate(c):
            handed.append(batch.clone())
            for worker in c.last_batch.worker_frames:
                per_worker.setdefault(worker, []).append(steps(batch)[0])
            c.update_policy_weights_()
            if i + 1 == batches:
                break
        dropped = c.dropped_batches
    return handed, per_worker, dropped


@pytest.mark.parametrize("make_env", [count_env, td_count_env], ids=["gymnasium", "EnvBase"])
def test_a_batch_dropped_for_lag_ends_its_trajectories(make_env):
    """Trajectories in progress when a batch is dropped continue under new ids after it; the
    frames kept are the single-process stream less the dropped batches."""
    handed, per_worker, dropped = lag_run(lambda: MultiAsyncCollector(
        [make_env] * 4, BiasPolicy(1, size=3), frames_per_batch=FRAMES, max_policy_lag=0, policy_lag_mode="drop"))
    assert dropped > 0, "no batch was dropped: the test shows nothing"
    assert_no_gaps(handed)
    assert_single_process_less_the_dropped(make_env, per_worker)


@pytest.mark.parametrize("node, inference", [("async", "worker"), ("async", "node"), ("sync", "node")])
def test_a_node_batch_dropped_for_lag_ends_its_local_workers_trajectories(node, inference):
    """The trainer drops a node's batch: every local worker of the node starts new ids; a node
    that drops its local workers' stale batches (or rounds) does the same."""
    handed, _, dropped = lag_run(lambda: RPCCollector(
        count_env, BiasPolicy(1, size=3), num_collectors=2, launcher="local", collector_class=node,
        num_workers_per_collector=2, frames_per_batch=FRAMES * (2 if node == "sync" else 1), rpc_timeout=60,
        sync=False, max_policy_lag=0, policy_lag_mode="drop", inference=inference), batches=30)
    assert dropped > 0, "no batch was dropped: the test shows nothing"
    assert_no_gaps(handed)


def steps_before(t: float, episode: float, lengths=(20, 31, 9)) -> int:
    """How many steps a ``CountEnv`` took before the step that observes ``(t, episode)``."""
    return sum(lengths[j % len(lengths)] for j in range(int(episode))) + int(t)


@pytest.mark.parametrize("inference", ["worker", "node"])
def test_the_frames_a_node_drops_itself_count_in_the_trainers_dropped_frames(inference):
    """Nodes drop their local workers' stale batches themselves, the trainer drops nodes' batches:
    every step each env took up to the last one handed out was handed out once or is counted in
    the trainer's ``dropped_frames``. The weights change after each of the first batches, then no
    more, until every env handed out a batch collected with the last weights (each env's stream
    dropped nothing after it)."""
    nodes, width, bumps = 2, 2, 30
    envs = nodes * width  # local worker w of node i: trajectory ids i * width + w + k * envs
    handed, last_version, last_step, delivered = [], {}, {}, {}
    with RPCCollector(count_env, BiasPolicy(1, size=3), num_collectors=nodes, launcher="local", collector_class="async",
                      num_workers_per_collector=width, frames_per_batch=FRAMES, rpc_timeout=60, sync=False,
                      max_policy_lag=0, policy_lag_mode="drop", inference=inference,
                      track_policy_version=True) as c:
        for i, batch in enumerate(c):
            handed.append(batch.clone())
            for row in rows(batch):
                env = int(row.get(TRAJ)[0]) % envs
                last_version[env] = int(row.get(("collector", "policy_version")).min())
                last_step[env] = row.get("observation")[-1, :2].tolist()
                delivered[env] = delivered.get(env, 0) + row.numel()
            if i < bumps:
                c.update_policy_weights_()
            elif len(last_version) == envs and min(last_version.values()) == c.policy_version or i == bumps + 400:
                break
        assert sorted(last_version) == list(range(envs)) and min(last_version.values()) == c.policy_version, \
            f"not every env handed out a batch of the last weights (version {c.policy_version}): {last_version}"
        dropped_by_nodes = sum(c.get_distant_attr("local.dropped_frames"))
        dropped = c.dropped_frames
    assert dropped_by_nodes > 0, "no node dropped a local batch: the test shows nothing"
    collected = sum(steps_before(*last_step[env]) + 1 for env in range(envs))
    assert dropped == collected - sum(delivered.values()), (
        f"the envs took {collected} steps, {sum(delivered.values())} were handed out, "
        f"{dropped} counted as dropped ({dropped_by_nodes} by the nodes)")
    assert_no_gaps(handed)


@pytest.mark.parametrize("kind", ["workers", "nodes"])
def test_a_replaced_worker_starts_new_trajectories(kind):
    """A worker (a node's local worker) killed mid-run is replaced: its replacement's env starts
    afresh under new ids."""
    from test_resume import kill

    handed = []
    args = dict(frames_per_batch=FRAMES, max_worker_restarts=2, rpc_timeout=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", WorkerRestartWarning)
        with (MultiAsyncCollector([count_env] * 2, BiasPolicy(1, size=3), **args) if kind == "workers" else
              RPCCollector(count_env, BiasPolicy(1, size=3), num_collectors=2, launcher="local", sync=False,
                           collector_class="async", num_workers_per_collector=2, **args)) as c:
            replaced_at = None
            for i, batch in enumerate(c):  # until 10 batches after the replacement (its death shows in a wait)
                handed.append(batch.clone())
                if i == 5:
                    kill(c.infos[1]["pid"] if kind == "workers" else c.infos[1]["local_pids"][1])
                if replaced_at is None and c.worker_restarts == [0, 1]:
                    replaced_at = i
                if i == 2000 or (replaced_at is not None and i == replaced_at + 10):
                    break
            assert c.worker_restarts == [0, 1]
    assert_no_gaps(handed)


def test_after_a_lag_drop_a_worker_keeps_its_own_weights():
    """Weights per worker (``{worker_id: weights}``) with ``max_policy_lag``: a worker whose batch was
    dropped collects on with the weights pushed to it, and each frame's version names them."""
    own = {0: BiasPolicy(0, size=3), 1: BiasPolicy(1, size=3)}
    dropped, checked = 0, 0
    with MultiAsyncCollector([count_env] * 2, BiasPolicy(0, size=3), frames_per_batch=FRAMES, max_policy_lag=0,
                             policy_lag_mode="drop", track_policy_version=True) as c:
        for i, batch in enumerate(c):
            (worker,) = c.last_batch.worker_frames
            versions = batch.get(("collector", "policy_version"))
            pushed = versions >= 1  # chosen by the weights pushed per worker (version 0: the trainer's policy)
            wrong = (batch["action"][pushed] != worker).sum()
            assert not wrong, f"batch {i}: {int(wrong)} steps of worker {worker} ran other weights than its own"
            checked += int(pushed.sum())
            c.update_policy_weights_({w: policy.state_dict() for w, policy in own.items()})
            if i == 40:
                dropped = c.dropped_batches
                break
    assert dropped > 0 and checked > 0, "no batch was dropped: the test shows nothing"


@pytest.mark.parametrize("kind", ["Collector", "MultiCollector"])
def test_ids_never_repeat_across_resumes_of_a_killed_run(kind, tmp_path):
    """A run killed with SIGKILL two batches after its checkpoint, resumed twice by ``RunCheckpoint``:
    the batches handed out after the checkpoint and those of the resumes never share an id."""
    import os
    import subprocess
    import sys

    from folders import PYTHONPATH, SCRIPTS
    from procs import wait_gone

    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    handed = []
    for run in range(3):
        proc = subprocess.run([sys.executable, str(SCRIPTS / "killed_run.py"), kind, str(tmp_path / "ckpt"),
                               str(tmp_path), str(run)], env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == -9, proc.stderr[-2000:]
        pids = tmp_path / f"{run}.pids"
        if pids.exists():
            left = wait_gone({int(p) for p in pids.read_text().split()}, 30)
            assert not left, f"worker processes {left} outlived their killed trainer"
        batches = sorted(tmp_path.glob(f"{run}-*.pt"))
        assert len(batches) == 5
        handed += [torch.load(path, weights_only=False) for path in batches]
    assert_no_gaps(handed)


def test_a_batch_asked_before_load_state_dict_is_not_handed_out_after_it():
    """An async collector keeps its workers busy between batches: a state loaded meanwhile
    restarts their envs with the saved weights, and the batches they were asked for before (with
    the weights of then) are dropped."""
    with MultiAsyncCollector([count_env] * 2, BiasPolicy(1, size=3), frames_per_batch=FRAMES) as c:
        for _ in range(3):
            c.next()
        state = c.state_dict()  # weights choosing action 1
        c.update_policy_weights_(BiasPolicy(0, size=3))
        for _ in range(4):
            c.next()  # both workers collect with action 0 now, and are asked for their next batch
        c.load_state_dict(state)
        for n in range(4):
            batch = c.next()
            assert (batch["action"] == 1).all(), f"batch {n} after the load was collected before it"
