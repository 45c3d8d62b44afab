"""What a TorchRL user's code observes of our collectors, beside TorchRL 0.14.1's own: its
``service_backend`` context and class paths in ``Collector(backend=...)``, the defaults its
classes share, the TensorDict a policy without a device is given, a plain module's numbered
outputs. Runs where torchrl is installed (``.ci/run``'s TorchRL venv); skipped elsewhere unless
``RPC_COLLECTORS_REQUIRE_TORCHRL=1`` says it must run."""
from __future__ import annotations

import inspect
import os
import warnings
from unittest.mock import patch

import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

if os.environ.get("RPC_COLLECTORS_REQUIRE_TORCHRL"):
    import torchrl  # noqa: F401  (must be importable: CI runs this module for real)
else:
    pytest.importorskip("torchrl")

with warnings.catch_warnings():  # torchrl 0.14.1 deprecates some of its own classes as it imports them
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl import collectors as trl_collectors
    from torchrl import service_backend
    from torchrl.collectors import distributed as trl_distributed
    from torchrl.envs.libs.gym import GymEnv

from rpc_collectors import Collector, DistributedCollector, MultiSyncCollector, RPCCollector  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    # TorchRL 0.14's auto_register_policy_transforms=None warns that an actor lacks InitTracker, as ours does
    pytest.mark.filterwarnings("ignore:The env passed to Collector is missing transforms:FutureWarning"),
    pytest.mark.filterwarnings("ignore:the env lacks transforms the policy needs:FutureWarning"),
]


def pendulum():
    return GymEnv("Pendulum-v1")


def _both(**kwargs):
    """One batch of TorchRL's Collector and one of ours, with the same arguments."""
    out = []
    for cls in (trl_collectors.Collector, Collector):
        c = cls(**kwargs)
        try:
            out.append(next(iter(c)))
        finally:
            c.shutdown()
    return out


# ------------------------------------------------------------------ Collector(backend=...)
@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_torchrls_service_backend_context_chooses_the_backend():
    with service_backend("process"):
        with Collector(pendulum, num_collectors=2, sync=True, frames_per_batch=20, total_frames=20) as c:
            assert type(c) is MultiSyncCollector and c.next().numel() == 20
        with Collector(pendulum, backend="direct", frames_per_batch=20, total_frames=20) as c:
            assert type(c) is Collector
    with service_backend("thread"):
        with pytest.raises(ValueError, match=r"backend='thread' \(selected by an enclosing torchrl.service_backend "
                                             r"context\) is not supported by Collector"):
            Collector(pendulum, frames_per_batch=20)


@pytest.mark.parametrize("backend, path", [
    ("process", "torchrl.collectors._multi_base.MultiCollector"),
    ("rpc", "torchrl.collectors.distributed.rpc.RPCCollector"),
    ("ray", "torchrl.collectors.distributed.ray.RayCollector"),
    ("submitit", "torchrl.collectors.distributed.generic.DistributedCollector"),
])
def test_a_class_patched_at_torchrls_path_is_what_the_backend_builds(backend, path):
    built = object()
    with patch(path) as target:
        target.return_value = built
        got = Collector(pendulum, backend=backend, backend_options={"option": 1}, num_collectors=2, frames_per_batch=20)
    assert got is built
    args, kwargs = target.call_args
    assert args[0] == [pendulum, pendulum] and kwargs["sync"] is False and kwargs["option"] == 1
    assert kwargs.get("num_collectors") == (2 if backend == "ray" else None)
    assert kwargs.get("launcher") == ("submitit" if backend == "submitit" else None)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_torchrls_own_classes_at_their_paths_are_not_used():
    with Collector(pendulum, backend="distributed", backend_options={"launcher": "mp"}, num_collectors=2,
                   sync=True, frames_per_batch=20, total_frames=20) as c:
        assert type(c) is DistributedCollector and c.next().numel() == 20


def test_defaults_are_torchrls_where_the_classes_share_them():
    """Our Collector's defaults are TorchRL's Collector's, our RPCCollector's its RPCCollector's, for
    the arguments where TorchRL's classes differ from one another."""
    names = ("init_random_frames", "max_frames_per_traj", "split_trajs", "exploration_type", "no_cuda_sync")
    for ours, theirs in ((Collector, trl_collectors.Collector), (RPCCollector, trl_distributed.RPCCollector)):
        mine, other = inspect.signature(ours.__init__).parameters, inspect.signature(theirs.__init__).parameters
        shared = [name for name in names if name in mine and name in other]
        assert len(shared) >= 4
        assert [mine[name].default for name in shared] == [other[name].default for name in shared]


# ------------------------------------------------------------------ the step a policy sees
class DeviceRecorder(nn.Module):
    """A trusted policy: writes a zero action and records the device of the TensorDict it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set = set()

    def forward(self, td):
        self.seen.add(td.device)
        return td.set("action", torch.zeros(*td.batch_size, 1))


@pytest.mark.parametrize("devices", [{"env_device": "cpu"}, {"policy_device": "cpu"}, {"device": "cpu"}, {}])
def test_a_policy_without_a_device_is_given_the_step_without_one(devices):
    recorders = [DeviceRecorder(), DeviceRecorder()]
    batches = []
    for cls, policy in zip((trl_collectors.Collector, Collector), recorders):
        c = cls(GymEnv("Pendulum-v1", device="cpu"), policy, frames_per_batch=5, total_frames=5, trust_policy=True,
                **devices)
        try:
            batches.append(next(iter(c)))
        finally:
            c.shutdown()
    assert recorders[1].seen == recorders[0].seen
    assert batches[1].device == batches[0].device


class TwoOutputs(nn.Module):
    """A plain module returning the action and one more output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, observation):
        action = self.linear(observation)
        return action, action.sum(-1)


def test_a_plain_modules_further_outputs_are_numbered_as_torchrl_names_them():
    policy = TwoOutputs()
    theirs, ours = _both(create_env_fn=pendulum, policy=policy, frames_per_batch=5, total_frames=5)
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    assert torch.equal(ours["output1"], ours["action"].sum(-1))
    c = Collector(pendulum, policy, frames_per_batch=5, total_frames=5)
    assert c._wrapped_policy.out_keys == ["action", "output1"]
    c.shutdown()


def test_a_recurrent_policy_that_writes_no_action_gets_its_env_transforms():
    """TorchRL's recurrent feature extractor (it writes no action): the collector is built and its
    env gets ``InitTracker`` and the recurrent state's primer, as TorchRL's does."""
    from torchrl.modules import GRUModule

    def policy():
        return TensorDictSequential(GRUModule(input_size=3, hidden_size=8, num_layers=1,
                                              in_keys=["observation", "recurrent_state", "is_init"],
                                              out_keys=["features", ("next", "recurrent_state")]))

    keys = []
    for cls in (trl_collectors.Collector, Collector):
        c = cls(pendulum(), policy(), frames_per_batch=10, total_frames=10, auto_register_policy_transforms=True)
        keys.append(set(c.env.full_observation_spec.keys(True, True)))
        c.shutdown()
    assert keys[1] == keys[0] and {"is_init", "recurrent_state"} <= keys[1]


@pytest.mark.parametrize("kwargs", [{}, {"use_buffers": False}, {"compact_obs": True, "track_policy_version": True}])
def test_fake_tensordict_is_a_zeroed_batch_with_the_real_ones_layout(kwargs):
    from torchrl.envs import InitTracker, TransformedEnv

    def env():
        return TransformedEnv(GymEnv("Pendulum-v1"), InitTracker())

    def policy():
        return TensorDictModule(TwoOutputs(), in_keys=["observation"], out_keys=["action", "extra"])

    c = Collector(env, policy(), frames_per_batch=10, total_frames=10, **kwargs)
    fake, real = c.fake_tensordict(), c.next()
    c.shutdown()
    assert fake.batch_size == real.batch_size and fake.names == real.names
    assert sorted(map(str, fake.keys(True, True))) == sorted(map(str, real.keys(True, True)))
    assert all(fake.get(key).dtype == real.get(key).dtype and not fake.get(key).any() for key in fake.keys(True, True))
    if not kwargs:  # TorchRL's own, for the same collector
        theirs = trl_collectors.Collector(env, policy(), frames_per_batch=10, total_frames=10)
        assert sorted(map(str, theirs.fake_tensordict().keys(True, True))) == sorted(map(str, fake.keys(True, True)))
        theirs.shutdown()


# ------------------------------------------------------------------ TorchRL's legacy weight_updater
def _pipe_updater():
    class PipeUpdater(trl_collectors.WeightUpdaterBase):
        """A user's updater as TorchRL's docs write one: weights down each worker's pipe."""

        def __init__(self, num_workers):
            self.num_workers = num_workers

        def _sync_weights_with_worker(self, worker_id, server_weights):
            self.collector.pipes[worker_id].send((server_weights, "update"))
            assert self.collector.pipes[worker_id].recv()[1] == "updated"

        def all_worker_ids(self):
            return list(range(self.num_workers))

    return PipeUpdater


def _linear():
    return TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_legacy_weight_updater_pushes_through_the_workers_pipes():
    from tensordict import TensorDict

    with warnings.catch_warnings():  # TorchRL deprecates subclassing WeightUpdaterBase
        warnings.simplefilter("ignore", DeprecationWarning)
        updater = _pipe_updater()(2)
    weights = TensorDict.from_module(_linear())
    c = MultiSyncCollector([pendulum] * 2, policy_factory=_linear, frames_per_batch=40, total_frames=-1,
                           weight_updater=updater, track_policy_version=True)
    try:
        assert c._legacy_weight_updater and updater.collector is c
        c.update_policy_weights_(weights)
        assert c.worker_policy_versions() == [1, 2]  # one send per worker, each its own version
        assert (next(iter(c))["action"] != 0).any()
        weights.data.zero_()
        c.update_policy_weights_(weights)
        for batch in c:
            if (batch["policy_version"] >= 3).all():
                break
        assert (batch["action"] == 0).all() and c.worker_policy_versions() == [3, 4]
        with pytest.raises(ValueError, match=r"pipes\[0\].send\(\(None, 'seed'\)\) is not supported"):
            c.pipes[0].send((None, "seed"))
        with pytest.raises(RuntimeError, match=r"pipes\[1\].recv\(\): nothing was sent"):
            c.pipes[1].recv()
    finally:
        c.shutdown()


def test_weight_updaters_that_cannot_work_here_are_refused_before_any_worker_starts():
    from procs import descendants

    before = descendants()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchrl.collectors import MultiProcessedWeightUpdater
    with pytest.raises(ValueError, match=r"weight_updater=MultiProcessedWeightUpdater\(...\) is not supported"):
        MultiSyncCollector([pendulum] * 2, _linear(), frames_per_batch=40,
                           weight_updater=MultiProcessedWeightUpdater(get_server_weights=None, policy_weights={}))
    with pytest.raises(TypeError, match="weight_updater='updater' is invalid; accepted: None, a torchrl WeightUpdaterBase"):
        MultiSyncCollector([pendulum] * 2, _linear(), frames_per_batch=40, weight_updater="updater")
    assert descendants() == before
