"""TorchRL's ``trust_policy``, ``cudagraph_policy`` and ``weight_sync_schemes`` without torchrl
installed (TorchRL's scheme objects themselves: tests/collectors/test_torchrl_interop.py), and what TorchRL's
collector tests read of a collector: ``stats()``, ``trajs_per_write``, ``_exclude_private_keys``,
``_use_buffers``, its errors for ``traj_format`` and for a module it cannot call."""
from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv, MultiAsyncCollector, MultiSyncCollector
from rpc_collectors.core.torchrl_args import scheme_objects, weight_sync_schemes
from rpc_collectors.single_process.base_collector import drop_private_keys
from test_rpc_collector import BiasPolicy

pytestmark = pytest.mark.timeout(120)


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


class TensorDictPolicy(nn.Module):
    """A plain module whose forward takes the step's TensorDict (TorchRL's trusted policies)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.ones(()))

    def forward(self, td):
        td.set("action", torch.ones(td.batch_size, dtype=torch.int64))
        td.set("saw_keys", torch.full(td.batch_size, len(td.keys())))
        return td


def test_trust_policy_calls_a_plain_module_on_the_tensordict():
    batch = Collector(count_env, TensorDictPolicy(), frames_per_batch=4, trust_policy=True).next()
    assert (batch["action"] == 1).all() and (batch["saw_keys"] > 1).all()
    with pytest.raises(AttributeError, match="Tensor.* has no attribute .set."):  # untrusted: given the observation
        Collector(count_env, TensorDictPolicy(), frames_per_batch=4).next()
    with pytest.raises(TypeError, match="trust_policy='yes' is invalid"):
        Collector(count_env, TensorDictPolicy(), frames_per_batch=4, trust_policy="yes")


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_trust_policy_in_workers():
    with MultiSyncCollector([count_env] * 2, TensorDictPolicy(), frames_per_batch=8, trust_policy=True) as c:
        batch = c.next()
    assert (batch["action"] == 1).all() and (batch["saw_keys"] > 1).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="without CUDA only")
def test_cudagraph_policy_without_cuda_runs_the_policy_as_it_is_with_a_warning():
    with pytest.warns(UserWarning, match="no CUDA device, so the policy runs as it is"):
        c = Collector(count_env, BiasPolicy(1, size=3), frames_per_batch=4, cudagraph_policy=True)
    assert (c.next()["action"] == 1).all()
    Collector(count_env, None, frames_per_batch=4, cudagraph_policy=False)
    with pytest.raises(TypeError, match="cudagraph_policy='x' is invalid"):
        Collector(count_env, None, frames_per_batch=4, cudagraph_policy="x")


class SharedMemWeightSyncScheme:  # the name of TorchRL's class, from another package
    pass


@pytest.mark.parametrize("value, words", [
    ({"policy": object()}, ["{'policy': object}", "cannot map"]),
    ({"policy": SharedMemWeightSyncScheme()}, ["SharedMemWeightSyncScheme", "cannot map"]),
    ({"value_net": object()}, ["['value_net']", "accepted keys: 'policy'"]),
])
def test_schemes_that_cannot_map_are_refused_naming_them(value, words):
    with pytest.raises(ValueError) as info:
        weight_sync_schemes(value, "auto")
    assert all(w in str(info.value) for w in words), str(info.value)
    with pytest.raises(TypeError, match="weight_sync_schemes=3 is invalid"):
        weight_sync_schemes(3, "auto")
    assert weight_sync_schemes(None, "rpc") == weight_sync_schemes({}, "rpc") == "rpc"


def test_importing_the_package_does_not_import_torchrl():
    code = "import sys, rpc_collectors, rpc_collectors.core.torchrl_args; assert 'torchrl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif(importlib.util.find_spec("torchrl") is not None, reason="without torchrl only")
def test_weight_sync_schemes_view_is_empty_without_torchrl():
    given = {"policy": SharedMemWeightSyncScheme()}
    assert scheme_objects(None, "shm") == {} and scheme_objects(given, "shm") == given


# ------------------------------------------------------------------ stats()
def vector_count_env() -> GymEnv:
    return GymEnv("CountEnv-v0", num_envs=2)


def test_stats_as_torchrl():
    with pytest.warns(UserWarning, match="each batch holds 6 frames"):
        c = Collector(vector_count_env, None, frames_per_batch=5, total_frames=12)
    assert c.stats() == {"frames": 0, "batches": 0, "total_frames": 12, "completed": False,
                         "requested_frames_per_batch": 5, "stepped_frames": 0, "trajectory_completed_frames": 0,
                         "trajectory_pending_frames": 0, "replay_written_frames": 0, "completed_trajectories": 0}
    seen = [(c.stats()["frames"], c.stats()["batches"]) for _ in c]
    assert seen == [(6, 1), (12, 2)] and c.stats()["completed"]
    assert json.loads(json.dumps(c.stats())) == c.stats()
    versioned = Collector(count_env, BiasPolicy(1, size=3), frames_per_batch=4, track_policy_version=True)
    versioned.update_policy_weights_()
    assert versioned.stats()["policy_version"] == 1 and "total_frames" not in versioned.stats()  # endless


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_stats_of_a_multi_worker_collector_by_worker():
    c = MultiAsyncCollector([count_env] * 2, None, frames_per_batch=4, total_frames=40)
    try:
        with pytest.raises(ValueError, match="workers='bogus' is invalid: workers must be one of"):
            c.stats(workers="bogus")
        assert c._use_buffers is None  # not known before a batch, as TorchRL's
        batches = list(c)
        stats = c.stats(workers="both")
        assert stats["workers"] == 2 and stats["workers_alive"] == 2 and stats["frames"] == 40
        assert stats["worker_0/frames"] + stats["worker_1/frames"] == 40
        assert stats["worker_0/batches"] + stats["worker_1/batches"] == len(batches) == stats["batches"]
        per_worker = c.stats(workers="per_worker")
        assert "frames" not in per_worker and per_worker["worker_1/frames"] == stats["worker_1/frames"]
        assert c._use_buffers is True  # dense batches
    finally:
        c.shutdown()
    assert c.stats()["workers_alive"] == 0


# ------------------------------------------------------------------ trajs_per_write, a replay buffer's device
class DeviceBuffer:
    """A replay buffer whose storage is on the CPU; records each write's shape, device and episodes."""

    def __init__(self) -> None:
        self.storage = type("Storage", (), {"device": torch.device("cpu")})()
        self.writes: list[tuple] = []

    def extend(self, td) -> None:
        self.writes.append((tuple(td.shape), td.device, int(td.get(("next", "done")).sum())))


def test_trajs_per_write_sets_the_trajectories_per_replay_buffer_write():
    one, all_ = DeviceBuffer(), DeviceBuffer()
    for rb, per_write in ((one, 1), (all_, None)):
        list(Collector(vector_count_env, None, frames_per_batch=8, total_frames=48, trajs_per_batch=2,
                       replay_buffer=rb, trajs_per_write=per_write))
    assert one.writes and all(done == 1 for _, _, done in one.writes)  # one whole trajectory a write
    assert max(done for _, _, done in all_.writes) > 1  # every trajectory that ended with a batch
    assert sum(done for _, _, done in one.writes) == sum(done for _, _, done in all_.writes)
    with pytest.raises(ValueError, match="trajs_per_write=2 .*needs trajs_per_batch and a replay_buffer"):
        Collector(count_env, None, frames_per_batch=4, trajs_per_batch=2, traj_format="cat", trajs_per_write=2)
    with pytest.raises(ValueError, match="trajs_per_write=0 is invalid"):
        Collector(count_env, None, frames_per_batch=4, trajs_per_batch=2, replay_buffer=DeviceBuffer(), trajs_per_write=0)


def test_batches_without_a_device_take_the_replay_buffers():
    """A postproc that clears the batch's device: it is written with the storage's, as TorchRL does."""
    for kwargs in ({}, {"trajs_per_batch": 2}):
        rb = DeviceBuffer()
        list(Collector(vector_count_env, None, frames_per_batch=8, total_frames=24, replay_buffer=rb,
                       postproc=lambda td: td.clear_device_(), **kwargs))
        assert rb.writes and all(device == torch.device("cpu") for _, device, _ in rb.writes), kwargs


# ------------------------------------------------------------------ private keys, use_buffers, errors
def private_key_policy(td):
    td.set("action", torch.zeros(td.batch_size, dtype=torch.int64))
    td.set("_noise", torch.ones(td.batch_size))
    return td


def test_exclude_private_keys_false_keeps_private_entries():
    c = Collector(count_env, private_key_policy, frames_per_batch=4)
    assert "_noise" not in c.next().keys()
    c._exclude_private_keys = False  # TorchRL's attribute, which its tests set
    assert "_noise" in c.next().keys()



def test_private_entries_are_dropped_from_a_lazy_stack_of_different_shapes():
    """Heterogeneous parts (agents, envs whose shapes change) cannot be stacked: their private entries go all the same."""
    parts = [TensorDict({"obs": torch.zeros(size), "agent": {"x": torch.zeros(size + 1)}, "_noise": torch.zeros(1)})
             for size in (3, 2)]
    batch = drop_private_keys(LazyStackedTensorDict.lazy_stack(parts))
    assert set(batch.keys(True)) == {"obs", "agent", ("agent", "x")}


def add_private_entry(batch):
    batch.set("_trainer_note", torch.zeros(batch.batch_size))
    return batch


@pytest.mark.multiprocess
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_multi_worker_batches_have_no_private_entries(sync):
    """Private entries a policy writes in the workers, and those a trainer-side ``postproc`` adds, are dropped."""
    for postproc in (None, add_private_entry):
        with (MultiSyncCollector if sync else MultiAsyncCollector)(
                [count_env, count_env], private_key_policy, frames_per_batch=8, total_frames=24, postproc=postproc) as c:
            for batch in c:
                assert "action" in batch.keys() and not {"_noise", "_trainer_note"} & set(batch.keys())
def test_use_buffers_says_whether_batches_are_dense():
    assert Collector(count_env, None, frames_per_batch=4)._use_buffers is True
    assert Collector(count_env, None, frames_per_batch=4, use_buffers=False)._use_buffers is False


def test_traj_format_error_has_torchrls_words():
    with pytest.raises(ValueError, match="traj_format='flat' is invalid: it must be 'padded' or 'cat'"):
        Collector(count_env, None, frames_per_batch=4, trajs_per_batch=2, traj_format="flat")


class TwoInputPolicy(nn.Module):
    def forward(self, observation, other_stuff):
        return observation.sum(-1).long() + other_stuff


@pytest.mark.parametrize("cls", [Collector, MultiSyncCollector])
def test_a_module_that_needs_more_than_the_observation_is_refused_before_workers_start(cls):
    env = count_env if cls is Collector else [count_env] * 2
    with pytest.raises(TypeError, match=r"Arguments to policy.forward are incompatible .*\['observation', 'other_stuff'\]"):
        cls(env, TwoInputPolicy(), frames_per_batch=4)


# ------------------------------------------------------------------ per-worker weights
def bias_factory(action: int):
    return functools.partial(BiasPolicy, action, 3)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("transport", ["shm", "rpc"])
def test_weights_per_worker_reach_only_their_worker(transport):
    """TorchRL's ``update_policy_weights_({worker_id: weights})``: workers built by their own
    factories, each pushed its own weights, as one new version."""
    with MultiSyncCollector([count_env] * 3, policy_factory=[bias_factory(0), bias_factory(1), bias_factory(0)],
                            frames_per_batch=12, weight_transport=transport, track_policy_version=True) as c:
        first = c.next()
        assert [int(first["action"][i].unique()) for i in range(3)] == [0, 1, 0]
        c.update_policy_weights_({2: BiasPolicy(1, 3).state_dict()})
        second = c.next()
        assert [int(second["action"][i].unique()) for i in range(3)] == [0, 1, 1]
        assert c.policy_version is None and c.worker_policy_versions() == [0, 0, 1]  # not every worker has version 1
        assert second.get(("collector", "policy_version"))[:, -1].tolist() == [0, 0, 1]
        with pytest.raises(ValueError, match=r"worker_ids=0 with weights per worker \(\[2\]\)"):
            c.update_policy_weights_({2: BiasPolicy(1, 3).state_dict()}, worker_ids=0)
        with pytest.raises(ValueError, match="worker_ids=.*is invalid"):
            c.update_policy_weights_({5: BiasPolicy(1, 3).state_dict()})
