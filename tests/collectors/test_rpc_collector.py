"""RPCCollector and MultiCollector with real worker processes (local launcher) and in-process (debug)."""
from __future__ import annotations

import itertools
import os

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from procs import LOOPBACK, descendants, listening_addresses
from rpc_collectors import (
    MultiAsyncCollector,
    MultiaSyncDataCollector,
    MultiCollector,
    MultiSyncCollector,
    MultiSyncDataCollector,
    RPCCollector,
    split_trajectories,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

TRAJ, VERSION, WORKER = ("collector", "traj_ids"), ("collector", "policy_version"), ("collector", "worker_id")


class BiasPolicy(nn.Module):
    """Action = argmax(W obs + b) on ``size`` floats: with W = 0 the bias alone decides the action."""

    def __init__(self, action: int = 0, size: int = 4) -> None:
        super().__init__()
        self.linear = nn.Linear(size, 2)
        self.set_action(action)

    def set_action(self, action: int) -> None:
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.copy_(torch.tensor([1.0, 0.0]) if action == 0 else torch.tensor([0.0, 1.0]))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation.float()).argmax(-1)


def rpc(policy=None, **kwargs) -> RPCCollector:
    kwargs.setdefault("num_collectors", 2)
    kwargs.setdefault("frames_per_batch", 100)
    kwargs.setdefault("launcher", "local")
    kwargs.setdefault("rpc_timeout", 30)
    return RPCCollector("CartPole-v1", policy, **kwargs)


# ------------------------------------------------------------------ layout
@pytest.mark.parametrize("cat_results, shape", [(None, [100]), ("stack", [2, 50]), (0, [100]), (-1, [100])])
def test_sync_batches_in_worker_order(cat_results, shape):
    """RPCCollector's default (None) is TorchRL's RPCCollector layout: the workers' [T] concatenated."""
    with rpc(BiasPolicy(), cat_results=cat_results, total_frames=200, track_policy_version=True) as c:
        batches = list(c)
    assert len(batches) == 2
    for batch in batches:
        assert list(batch.shape) == shape
        assert batch.names[-1] == "time"
        workers = batch[WORKER].reshape(2, 50) if cat_results != "stack" else batch[WORKER]
        assert (workers[0] == 0).all() and (workers[1] == 1).all()
        assert batch["next", "reward"].shape == torch.Size(shape + [1])
    assert c.last_batch.iteration == 2 and c.last_batch.frames == 100 and c.last_batch.worker_frames == {0: 50, 1: 50}


@pytest.mark.parametrize("sync", [True, False])
def test_batches_have_torchrls_keys_and_the_record_says_who_collected_them(sync):
    """As TorchRL's without track_policy_version: no ("collector", "policy_version"/"worker_id");
    last_batch has the versions and each worker's frames."""
    with rpc(BiasPolicy(), sync=sync, total_frames=400) as c:
        for batch in c:
            assert set(batch.get("collector").keys()) == {"traj_ids"}
            record = c.last_batch
            assert record.oldest_version == record.newest_version == 0 and record.frames == 100
            if sync:
                assert record.worker_frames == {0: 50, 1: 50}
            else:  # one worker's batch
                assert len(record.worker_frames) == 1 and list(record.worker_frames.values()) == [100]


@pytest.mark.parametrize("cat_results, shape", [(None, [4, 50]), ("stack", [2, 2, 50])])
def test_sync_vector_envs_stack_to_worker_env_time(cat_results, shape):
    from rpc_collectors import GymEnv

    make = lambda: GymEnv("CartPole-v1", num_envs=2)  # noqa: E731 (a lambda travels with cloudpickle)
    with RPCCollector(make, BiasPolicy(), num_collectors=2, frames_per_batch=200, total_frames=200, launcher="local",
                      cat_results=cat_results) as c:
        batch = next(iter(c))
    assert list(batch.shape) == shape


def test_multi_sync_default_stacks_and_rounds_up_over_workers():
    """MultiSyncCollector stacks [N, T] (TorchRL's default); 101 frames over 2 workers: 51 each, with a warning."""
    with pytest.warns(UserWarning, match="does not divide evenly over 2 workers"):
        c = MultiSyncCollector(["CartPole-v1"] * 2, BiasPolicy(), frames_per_batch=101, total_frames=204)
    with c:
        batches = list(c)
    assert [list(b.shape) for b in batches] == [[2, 51], [2, 51]]


@pytest.mark.parametrize("cls, shape", [(MultiSyncCollector, (3, 10)), (MultiAsyncCollector, (30,))])
def test_num_workers_replicates_one_env_factory(cls, shape):
    """TorchRL's third parameter (keyword-only): ``MultiSyncCollector(make_env, policy, num_workers=3, ...)``."""
    with cls("CartPole-v1", BiasPolicy(1), num_workers=3, frames_per_batch=30, total_frames=30) as c:
        batch = c.next()
        assert c.num_workers == 3 and len({info["pid"] for info in c.infos}) == 3
    assert batch.shape == shape and (batch["action"] == 1).all()


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_workers": 0}, ValueError, ["num_workers=0"]),
    ({"num_workers": 2.0}, ValueError, ["num_workers=2.0"]),
    ({"num_workers": 3, "num_collectors": 2}, ValueError, ["num_workers=3", "the 2 workers"]),
    ({"num_wrokers": 2}, TypeError, ["MultiSyncCollector.__init__()", "'num_wrokers'"]),
])
def test_num_workers_bad_values_name_the_argument(kwargs, error, words):
    with pytest.raises(error) as info:
        MultiSyncCollector("CartPole-v1", None, frames_per_batch=10, **kwargs)
    assert all(w in str(info.value) for w in words), str(info.value)
    with pytest.raises(ValueError, match="num_workers=3 does not match the 2 workers"):
        MultiAsyncCollector(["CartPole-v1"] * 2, None, num_workers=3, frames_per_batch=10)


MAX_BATCHES = 2000  # a bound on the batches an async test waits for both workers in (a loaded machine)


def test_async_yields_one_worker_batch_first_ready():
    with rpc(BiasPolicy(), sync=False, total_frames=-1) as c:
        batches, workers = [], []
        for batch in c:
            batches.append(batch)
            workers.append(c.last_batch.worker_frames)
            if {next(iter(w)) for w in workers} == {0, 1} or len(batches) == MAX_BATCHES:
                break
        assert c.frames == 100 * len(batches)
    assert all(list(batch.shape) == [100] for batch in batches)
    assert all(len(w) == 1 and list(w.values()) == [100] for w in workers)  # one worker's batch
    assert {next(iter(w)) for w in workers} == {0, 1}, "one worker delivered every batch"


def test_trajectory_ids_unique_across_workers_and_kept_across_batches():
    with rpc(None, total_frames=-1, frames_per_batch=40, cat_results="stack") as c:
        batches = list(itertools.islice(c, 6))  # endless run: total_frames=-1 yields
        assert c.frames == 240
    per_worker = {0: [], 1: []}
    for batch in batches:
        for w in (0, 1):
            per_worker[w].append(batch[w])
    ids = {w: torch.cat([b[TRAJ] for b in per_worker[w]]) for w in per_worker}
    assert not set(ids[0].tolist()) & set(ids[1].tolist()), "two workers used the same trajectory id"
    for w, seq in ids.items():
        assert (seq[1:] >= seq[:-1]).all()  # a trajectory's id never changes, new ids only grow
        # a trajectory that crosses the batch boundary keeps its id: no done at the end of batch 0
        first, second = per_worker[w][0], per_worker[w][1]
        if not first["next", "done"][-1]:
            assert first[TRAJ][-1] == second[TRAJ][0]
    split = split_trajectories(batches[0][0])
    assert split[("collector", "mask")].sum() == 20


def test_len_and_total_frames():
    with pytest.warns(UserWarning, match="total_frames=450 is not a multiple"), rpc(BiasPolicy(), total_frames=450) as c:
        assert len(c) == 5
        assert sum(b.numel() for b in c) == 500


def test_legacy_names_and_multicollector_list():
    assert MultiSyncDataCollector is MultiSyncCollector and MultiaSyncDataCollector is MultiAsyncCollector
    with MultiCollector(["CartPole-v1", "CartPole-v1"], BiasPolicy(1), frames_per_batch=100, total_frames=100) as c:
        batch = next(iter(c))
    assert (batch["action"] == 1).all()
    with MultiAsyncCollector(["CartPole-v1"] * 2, BiasPolicy(), frames_per_batch=50, total_frames=100) as c:
        assert all(b.shape == torch.Size([50]) for b in c)


# ------------------------------------------------------------------ weights
@pytest.mark.parametrize("transport", ["shm", "broadcast", "rpc"])
def test_update_weights_versions_every_frame(transport):
    policy = BiasPolicy(0)
    with rpc(policy, total_frames=-1, weight_transport=transport, track_policy_version=True) as c:
        it = iter(c)
        first = next(it)
        assert (first[VERSION] == 0).all() and (first["action"] == 0).all()
        policy.set_action(1)
        c.update_policy_weights_()
        second = next(it)
        assert (second[VERSION] == 1).all() and (second["action"] == 1).all()
        c.update_policy_weights_(BiasPolicy(0).state_dict())  # a state dict
        assert (next(it)["action"] == 0).all()
        c.update_policy_weights_(TensorDict.from_module(BiasPolicy(1)))  # a TensorDict
        batch = next(it)
        assert (batch["action"] == 1).all() and (batch[VERSION] == 3).all()


@pytest.mark.parametrize("transport", ["shm", "broadcast", "rpc"])
def test_update_a_subset_of_workers(transport):
    policy = BiasPolicy(0)
    with rpc(policy, total_frames=-1, weight_transport=transport, cat_results="stack", track_policy_version=True) as c:
        it = iter(c)
        next(it)
        policy.set_action(1)
        c.update_policy_weights_(worker_ids=[1])
        batch = next(it)
    assert (batch[0][VERSION] == 0).all() and (batch[0]["action"] == 0).all()
    assert (batch[1][VERSION] == 1).all() and (batch[1]["action"] == 1).all()


@pytest.mark.parametrize("launcher", ["debug", "local"])
def test_update_reads_parameters_replaced_after_construction(launcher):
    """No argument: the policy's tensors at the call, also after ``to_module`` swapped them for new ones."""
    policy = BiasPolicy(0)
    with rpc(policy, total_frames=-1, launcher=launcher, track_policy_version=True) as c:
        it = iter(c)
        next(it)
        TensorDict.from_module(BiasPolicy(1)).data.to_module(policy)
        c.update_policy_weights_()
        batch = next(it)
        policy.linear.weight = nn.Parameter(torch.zeros(3, 4))  # a new shape cannot reach the workers
        with pytest.raises(ValueError, match=r"'linear', 'weight'.*\[3, 4\].*\[2, 4\]"):
            c.update_policy_weights_()
    assert (batch[VERSION] == 1).all() and (batch["action"] == 1).all()


def test_non_blocking_update_lands_before_next_batch():
    policy = BiasPolicy(0)
    with rpc(policy, total_frames=-1, weight_transport="broadcast", track_policy_version=True) as c:
        it = iter(c)
        next(it)
        policy.set_action(1)
        c.update_policy_weights_(non_blocking=True)
        policy.set_action(0)  # the weights were staged already: this change is not pushed
        batch = next(it)
    assert (batch[VERSION] == 1).all() and (batch["action"] == 1).all()


def test_update_after_each_batch_sync():
    policy = BiasPolicy(0)
    with rpc(policy, total_frames=400, update_after_each_batch=True, track_policy_version=True) as c:
        versions = [b[VERSION].unique().tolist() for b in c]
    assert versions == [[0], [1], [2], [3]]


def test_update_after_each_batch_async_updates_the_worker_just_yielded():
    with rpc(BiasPolicy(0), sync=False, total_frames=800, update_after_each_batch=True, track_policy_version=True) as c:
        seen = [(int(b[WORKER][0]), b[VERSION].unique().tolist()) for b in c]
    for _, versions in seen:
        assert len(versions) == 1, "an async batch mixed two policy versions"
    last_version = {}
    for worker_id, (version,) in seen:  # each later batch of a worker carries a newer version
        assert version > last_version.get(worker_id, -1)
        last_version[worker_id] = version


def test_max_weight_update_interval():
    policy = BiasPolicy(0)
    with rpc(policy, sync=False, total_frames=1000, max_weight_update_interval=1, track_policy_version=True) as c:
        versions = [(int(b[WORKER][0]), int(b[VERSION][0])) for b in c]
    by_worker: dict[int, list[int]] = {}
    for w, v in versions:
        by_worker.setdefault(w, []).append(v)
    for seq in by_worker.values():  # never more than 2 batches in a row with the same version
        runs = [len(list(g)) for _, g in itertools.groupby(seq)]
        assert max(runs) <= 2, by_worker
    assert len({v for _, v in versions}) > 1, by_worker  # the weights were pushed (a worker may have had only 2 batches)


def test_trainer_keeps_its_default_process_group_and_environment():
    import torch.distributed as dist

    from rpc_collectors.transport.rendezvous import free_port

    env_before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    model = work = None
    try:
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
        policy = BiasPolicy(0)
        with rpc(policy, total_frames=400, weight_transport="broadcast") as c:
            for batch in c:
                loss = model(batch["observation"]).sum()
                loss.backward()  # DDP all-reduces on the default group while the collector runs
                c.update_policy_weights_()
        t = torch.ones(1)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        assert t.item() == 1.0 and dist.is_initialized()
    finally:
        dist.destroy_process_group()
        # Free DDP (and with it the group, whose destructor joins gloo's threads) while `work` still
        # holds the all-reduce's tensors: a gloo thread releasing them then would need the GIL
        # that this thread holds while it joins (a deadlock inside torch).
        del model
        del work
    assert {k: os.environ.get(k) for k in env_before} == env_before


# ------------------------------------------------------------------ state
def test_set_seed_reproducible_and_distinct_per_worker():
    def run(seed):
        with rpc(None, total_frames=200, cat_results="stack") as c:
            next_seed = c.set_seed(seed)
            return next_seed, list(c)

    seed_a, a = run(7)
    seed_b, b = run(7)
    assert seed_a == seed_b == 9
    for x, y in zip(a, b):
        assert torch.equal(x["action"], y["action"]) and torch.equal(x["observation"], y["observation"])
    assert not torch.equal(a[0]["observation"][0], a[0]["observation"][1])


def test_state_dict_resume_keeps_ids_increasing():
    policy = BiasPolicy(0)
    with rpc(policy, total_frames=-1, cat_results="stack", track_policy_version=True) as c:
        it = iter(c)
        before = [next(it) for _ in range(2)]
        policy.set_action(1)
        c.update_policy_weights_()
        state = c.state_dict()
    for w in (0, 1):  # TorchRL's keys too: each worker's state with the weights it runs
        assert state[f"worker{w}"] is state["workers"][w]
        assert torch.equal(state[f"worker{w}"]["policy_state_dict"]["linear.bias"], policy.linear.bias.detach())
    with rpc(BiasPolicy(0), total_frames=-1, cat_results="stack", track_policy_version=True) as c:
        c.load_state_dict(state)
        assert c.frames == 200 and c.policy_version == 1
        after = next(iter(c))
    for w in (0, 1):  # each worker's ids keep increasing; no id of the first run comes back
        assert after[w][TRAJ].min() > max(b[w][TRAJ].max() for b in before)
    assert not set(after[TRAJ].flatten().tolist()) & set(torch.cat([b[TRAJ].flatten() for b in before]).tolist())
    assert (after["action"] == 1).all() and (after[VERSION] == 1).all()


def test_start_fills_replay_buffer_until_async_shutdown():
    class Buffer:
        def __init__(self):
            self.batches = []

        def extend(self, td):
            self.batches.append(td)

    buffer = Buffer()
    c = rpc(BiasPolicy(), sync=False, total_frames=-1, replay_buffer=buffer)
    c.start()
    import time

    deadline = time.monotonic() + 30
    while len(buffer.batches) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    c.async_shutdown(timeout=10)
    assert len(buffer.batches) >= 3 and all(b.shape == torch.Size([100]) for b in buffer.batches)
    c.shutdown()  # idempotent


# ------------------------------------------------------------------ debug launcher
def test_debug_launcher_matches_local_for_same_seed():
    def run(launcher):
        with rpc(None, total_frames=300, launcher=launcher, frames_per_batch=100, track_policy_version=True) as c:
            c.set_seed(3)
            return list(c)

    for x, y in zip(run("debug"), run("local")):
        for key in ("observation", "action", ("next", "reward"), TRAJ, VERSION):
            assert torch.equal(x[key], y[key])


def test_debug_launcher_runs_in_process():
    before = descendants()
    with rpc(BiasPolicy(1), launcher="debug", total_frames=200) as c:
        assert descendants() == before
        assert all((b["action"] == 1).all() for b in c)


# ------------------------------------------------------------------ network
def test_local_workers_listen_on_no_port_and_the_trainer_on_loopback_only():
    """Local workers are driven over pipes: they open no port; the broadcast weight group's store is on loopback."""
    for transport in ("shm", "broadcast"):
        with rpc(BiasPolicy(), total_frames=-1, weight_transport=transport) as c:
            next(iter(c))
            c.update_policy_weights_()
            for info in c.infos:
                assert not listening_addresses(info["pid"]) - LOOPBACK, f"worker {info['pid']} listens outside loopback"
            if transport == "shm":
                assert all(not listening_addresses(info["pid"]) for info in c.infos), "a local worker opened a port"
            trainer = listening_addresses(os.getpid())
            assert trainer <= LOOPBACK, f"the trainer listens on {trainer}"


def test_two_collectors_in_two_processes_do_not_clash(tmp_path):
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "..", "..", "launch", "collect.py")
    procs = [
        subprocess.Popen([sys.executable, script, "--workers", "2", "--frames", "800", "--launcher", "local"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for _ in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0]
    assert all('"frames": 800' in out for out in outputs)


@pytest.mark.parametrize("transport", ["broadcast", "rpc"])
def test_debug_launcher_refuses_transports_of_worker_processes(transport):
    with pytest.raises(ValueError, match=f"weight_transport='{transport}' needs worker processes; the debug launcher uses 'shm'"):
        rpc(BiasPolicy(0), total_frames=-1, launcher="debug", weight_transport=transport)
