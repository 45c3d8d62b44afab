"""rpc_collectors as a drop-in for TorchRL 0.14.1's collectors, tested against the real torchrl.

TorchRL's envs (Pendulum-v1: no MuJoCo needed), transforms, batched envs, modules, losses and
replay buffers on our batches; TorchRL's own collectors where a shape is compared. Runs in an
environment with ``torchrl`` installed (``.ci/run`` makes one); elsewhere the module is skipped,
unless ``RPC_COLLECTORS_REQUIRE_TORCHRL=1`` says it must run, which turns the skip into a failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from functools import partial
from pathlib import Path

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from torch import nn

if os.environ.get("RPC_COLLECTORS_REQUIRE_TORCHRL"):
    import torchrl  # noqa: F401  (must be importable: CI runs this module for real)
else:
    pytest.importorskip("torchrl")

from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential  # noqa: E402

with warnings.catch_warnings():  # torchrl 0.14.1 deprecates some of its own classes as it imports them
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl import collectors as trl_collectors
    from torchrl.collectors import distributed as trl_distributed
    from torchrl.data import LazyTensorStorage, ReplayBuffer, SliceSampler
    from torchrl.envs import Compose, InitTracker, ParallelEnv, SerialEnv, StepCounter, TransformedEnv
    from torchrl.envs.libs.gym import GymEnv
    from torchrl.envs.utils import ExplorationType, RandomPolicy, set_exploration_type
    from torchrl.modules import Actor, OrnsteinUhlenbeckProcessModule, ProbabilisticActor, TanhNormal, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE
    from torchrl.testing import mocking_classes as mocks

import rpc_collectors  # noqa: E402
from procs import run_in_session  # noqa: E402
from rpc_collectors import Collector, MultiAsyncCollector, MultiSyncCollector, RPCCollector  # noqa: E402

pytestmark = [
    pytest.mark.multiprocess, pytest.mark.timeout(180),
    # TorchRL 0.14's auto_register_policy_transforms=None warns that an actor lacks InitTracker, as ours does
    pytest.mark.filterwarnings("ignore:the env lacks transforms the policy needs:FutureWarning"),
]

ROOT = Path(__file__).resolve().parents[2]
TRAJ, VERSION, STEP = ("collector", "traj_ids"), ("collector", "policy_version"), ("next", "step_count")


# ------------------------------------------------------------------ envs and policies (module level: they travel by pickle)
def pendulum():
    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter())


def serial_pendulum():
    return SerialEnv(2, pendulum)


def plain_pendulum():
    """No StepCounter: for ``max_frames_per_traj``, which TorchRL refuses on an env that counts steps."""
    return GymEnv("Pendulum-v1")


def serial_plain_pendulum():
    return SerialEnv(2, plain_pendulum)


def parallel_capped_pendulum():
    return ParallelEnv(2, lambda: TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=30)))


def env_maker():
    """The env of TorchRL's collector docs."""
    return GymEnv("Pendulum-v1", device="cpu")


def tanh_actor() -> ProbabilisticActor:
    """TorchRL's usual stochastic actor, built without ``default_interaction_type``."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 2), NormalParamExtractor())
    return ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]), in_keys=["loc", "scale"],
        distribution_class=TanhNormal, distribution_kwargs={"low": -2.0, "high": 2.0}, return_log_prob=True,
    )


def constant_actor(value: float) -> Actor:
    """A TorchRL ``Actor`` whose action is ``value`` whatever the observation."""
    actor = Actor(nn.Linear(3, 1), in_keys=["observation"])
    set_constant(actor, value)
    return actor


def set_constant(actor: nn.Module, value: float) -> None:
    with torch.no_grad():
        actor.module.weight.zero_()
        actor.module.bias.fill_(value)


def deterministic_actions(actor: ProbabilisticActor, batch) -> torch.Tensor:
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        return actor(batch.select("observation").clone())["action"]


def multi_sync(**kwargs) -> MultiSyncCollector:
    kwargs.setdefault("frames_per_batch", 100)
    return MultiSyncCollector([pendulum] * 2, kwargs.pop("policy", None), **kwargs)


# ------------------------------------------------------------------ 1. exploration
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "RPCCollector"])
def test_probabilistic_actor_samples_by_default_and_follows_exploration_type(kind):
    """Default RANDOM (as TorchRL): sampled actions. DETERMINISTIC: the distribution's deterministic action."""
    actor = tanh_actor()

    def collect(**kwargs):
        if kind == "Collector":
            c = Collector(pendulum, actor, frames_per_batch=100, **kwargs)
        elif kind == "RPCCollector":  # the keyword through collector_kwargs, as TorchRL's RPCCollector takes it
            kwargs = {"collector_kwargs": kwargs} if kwargs else {}
            c = RPCCollector(pendulum, actor, num_collectors=2, frames_per_batch=100, launcher="local", **kwargs)
        else:
            c = getattr(rpc_collectors, kind)([pendulum] * 2, actor, frames_per_batch=100, **kwargs)
        with c:
            return c.next()

    sampled = collect()
    assert torch.isclose(sampled["action"], deterministic_actions(actor, sampled), atol=1e-4).float().mean() < 0.05
    det = collect(exploration_type=ExplorationType.DETERMINISTIC)
    assert torch.allclose(det["action"], deterministic_actions(actor, det), atol=1e-5)


# ------------------------------------------------------------------ 2. dict in_keys
class Difference(nn.Module):
    def forward(self, observation: torch.Tensor, step_count: torch.Tensor) -> torch.Tensor:
        return step_count.float() / 100 - observation[..., :1] * 0  # depends on which tensor is which


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("multi", [False, True])
def test_dict_in_keys_go_to_their_keywords(multi):
    """``in_keys={kwarg: key}`` in another order than forward's arguments: each tensor reaches its keyword."""
    policy = TensorDictModule(Difference(), in_keys={"step_count": "step_count", "observation": "observation"},
                              out_keys=["action"])
    c = multi_sync(policy=policy) if multi else Collector(pendulum, policy, frames_per_batch=100)
    with c:
        batch = c.next()
    assert torch.equal(batch["action"], batch["step_count"].float() / 100)


# ------------------------------------------------------------------ 3. weights replaced, not written in place
def replace_by_to_module(actor: nn.Module, value: float) -> None:
    TensorDict.from_module(constant_actor(value)).data.to_module(actor)


def replace_by_assign(actor: nn.Module, value: float) -> None:
    actor.load_state_dict(constant_actor(value).state_dict(), assign=True)


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("replace", [replace_by_to_module, replace_by_assign])
@pytest.mark.parametrize("kind", ["MultiSyncCollector", "MultiAsyncCollector", "RPCCollector"])
def test_update_without_argument_pushes_replaced_parameters(kind, replace):
    actor = constant_actor(0.5)
    if kind == "RPCCollector":
        c = RPCCollector(pendulum, actor, num_collectors=2, frames_per_batch=100, launcher="local",
                         track_policy_version=True)
    else:
        c = getattr(rpc_collectors, kind)([pendulum] * 2, actor, frames_per_batch=100, track_policy_version=True)
    with c:
        it = iter(c)
        assert (next(it)["action"] == 0.5).all()
        replace(actor, 1.5)
        c.update_policy_weights_()
        deadline = time.monotonic() + 60
        while True:  # async: batches already on their way may hold version 0
            batch = next(it)
            if (batch[VERSION] == 1).all() or time.monotonic() > deadline:
                break
    assert (batch[VERSION] == 1).all() and (batch["action"] == 1.5).all()


# ------------------------------------------------------------------ 4. default layouts, against TorchRL's own
def torchrl_batch(cls_name: str, make_env, **kwargs):
    c = getattr(trl_collectors, cls_name)([make_env] * 2, None, frames_per_batch=100, total_frames=100, **kwargs)
    try:
        return next(iter(c))
    finally:
        c.shutdown()


def torchrl_shape(cls_name: str, make_env, **kwargs) -> torch.Size:
    return torchrl_batch(cls_name, make_env, **kwargs).shape


@pytest.mark.parametrize("cls_name", ["MultiSyncCollector", "MultiAsyncCollector"])
@pytest.mark.parametrize("track", [False, True])
def test_multi_worker_key_sets_are_torchrls(cls_name, track):
    """TorchRL's test_collector_output_keys compares key sets exactly; with track_policy_version=True
    TorchRL adds its "policy_version" keys, and ours keep ("collector", "policy_version"/"worker_id")."""
    with getattr(rpc_collectors, cls_name)([pendulum] * 2, None, frames_per_batch=100, total_frames=100,
                                           track_policy_version=track) as c:
        ours = set(c.next().keys(True, True))
    theirs = set(torchrl_batch(cls_name, pendulum, track_policy_version=track).keys(True, True))
    extra = {("collector", "policy_version"), ("collector", "worker_id")} if track else set()
    assert ours == theirs | extra


@pytest.mark.parametrize("make_env", [pendulum, serial_pendulum])
def test_multi_sync_default_layout_is_torchrls(make_env):
    with MultiSyncCollector([make_env] * 2, None, frames_per_batch=100, total_frames=100) as c:
        ours = c.next().shape
    assert ours == torchrl_shape("MultiSyncCollector", make_env)
    assert ours[0] == 2 and ours.numel() == 100


def test_multi_async_layout_is_torchrls():
    with MultiAsyncCollector([pendulum] * 2, None, frames_per_batch=100, total_frames=100) as c:
        ours = c.next().shape
    assert ours == torchrl_shape("MultiAsyncCollector", pendulum) == torch.Size([100])


@pytest.mark.usefixtures("no_leftover_processes")
def test_rpc_collector_default_is_one_flat_batch_as_torchrls():
    """TorchRL 0.14.1's RPCCollector (sync) ``torch.cat``s its workers' [T] batches into [N*T]
    (read from its source; starting one takes 6-25 s, so the shape is not compared live)."""
    with RPCCollector(pendulum, None, num_collectors=2, frames_per_batch=100, launcher="local",
                      track_policy_version=True) as c:
        batch = c.next()
    assert batch.shape == torch.Size([100]) and batch.names == ["time"]
    assert batch["collector", "worker_id"].tolist() == [0] * 50 + [1] * 50
    rb = ReplayBuffer(storage=LazyTensorStorage(1000))
    rb.extend(batch)  # TorchRL code extending a 1-d buffer stores frames, not rows
    assert len(rb) == 100 and rb.storage._storage.shape == torch.Size([1000])


def _linear_actor():
    return TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])


@pytest.mark.usefixtures("no_leftover_processes")
def test_distributed_collector_sync_layout_is_torchrls_live():
    """TorchRL's DistributedCollector (launcher="mp", sync=True) stacks its nodes' batches: [N, T]."""
    from rpc_collectors.transport.rendezvous import free_port

    with warnings.catch_warnings():  # its own deprecations, and a notice about InitTracker for v0.15
        warnings.simplefilter("ignore")
        theirs = trl_distributed.DistributedCollector([pendulum] * 2, _linear_actor(), frames_per_batch=20,
                                                      total_frames=20, sync=True, launcher="mp", tcp_port=free_port())
        try:
            expected = next(iter(theirs))
        finally:
            theirs.shutdown()
    for cls, kwargs in [(rpc_collectors.DistributedCollector, {"sync": True}), (rpc_collectors.DistributedSyncCollector, {})]:
        with cls([pendulum] * 2, _linear_actor(), frames_per_batch=20, total_frames=20, launcher="mp", **kwargs) as c:
            ours = c.next()
        assert ours.shape == expected.shape == torch.Size([2, 10]) and ours.names == expected.names


@pytest.mark.parametrize("name", ["DistributedCollector", "DistributedSyncCollector", "RPCCollector"])
def test_distributed_classes_take_torchrls_arguments_and_defaults(name):
    """Every argument of TorchRL's class exists here with TorchRL's default (its own Collector
    class as ``collector_class`` maps to ours); ours is importable from ``rpc_collectors.distributed``."""
    import inspect

    from rpc_collectors import distributed

    theirs = inspect.signature(getattr(trl_distributed, name).__init__).parameters
    ours = inspect.signature(getattr(distributed, name).__init__).parameters
    if name == "RPCCollector":  # ours takes its own launchers; the defaults it shares: test_torchrl_parity.py
        assert set(theirs) <= set(ours), set(theirs) - set(ours)
        for arg in ("visible_devices", "tensorpipe_options", "weight_updater", "weight_recv_schemes"):
            assert ours[arg].default is theirs[arg].default is None, arg
        assert {"launcher", "tcp_port", "slurm_kwargs"} <= set(ours)
        return
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    for arg, parameter in theirs.items():
        default = parameter.default
        if arg == "collector_class":
            assert ours[arg].default is Collector and default.__name__ == "Collector"
        else:
            assert ours[arg].default == default, (arg, ours[arg].default, default)
        assert ours[arg].kind == parameter.kind, arg


def test_class_relations_are_torchrls():
    """``isinstance`` between collector classes holds here exactly where it holds in TorchRL
    (``AsyncCollector`` < ``MultiAsyncCollector`` < ``MultiCollector`` < ``BaseCollector``, ...)."""
    from rpc_collectors.collectors.ray import RayCollector

    names = ["BaseCollector", "Collector", "MultiCollector", "MultiSyncCollector", "MultiAsyncCollector",
             "AsyncCollector", "AsyncBatchedCollector", "RPCCollector", "RayCollector", "DistributedCollector",
             "DistributedSyncCollector"]
    theirs = {name: getattr(trl_collectors, name, None) or getattr(trl_distributed, name) for name in names}
    ours = {name: getattr(rpc_collectors, name, RayCollector) for name in names}
    assert ours["RayCollector"] is RayCollector
    relations = {(a, b): issubclass(theirs[a], theirs[b]) for a in names for b in names}
    assert {pair: issubclass(ours[pair[0]], ours[pair[1]]) for pair in relations} == relations


def test_torchrls_single_machine_rpc_script_call_runs():
    """examples/distributed/collectors/single_machine/rpc.py's call on a machine without CUDA, with
    TorchRL's EnvCreator, RandomPolicy and Collector class: every batch one worker's, on the CPU."""
    from torchrl.envs import EnvCreator

    make_env = EnvCreator(pendulum)
    collector = RPCCollector(
        [make_env] * 2, RandomPolicy(make_env().action_spec), num_workers_per_collector=1, frames_per_batch=20,
        total_frames=100, collector_class=trl_collectors.Collector,
        collector_kwargs={"device": "cpu", "storing_device": "cpu"}, sync=False, storing_device="cpu", launcher="mp",
        visible_devices=None,
    )
    try:
        batches = list(collector)
    finally:
        collector.shutdown()
    assert [(tuple(b.shape), b.device) for b in batches] == [((20,), torch.device("cpu"))] * 5
    assert all(torch.equal(b["next", "step_count"], b["step_count"] + 1) for b in batches)  # each frame a step


def test_rpc_collector_has_no_collector_infos_keyword_as_torchrls():
    """``collector_infos`` is an attribute of TorchRL's RPCCollector (its workers' RPC infos), not a keyword."""
    for cls in (trl_distributed.RPCCollector, RPCCollector):
        with pytest.raises(TypeError, match="unexpected keyword argument 'collector_infos'"):
            cls([pendulum] * 2, None, frames_per_batch=20, launcher="mp", collector_infos=None)


@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector", "MultiCollector"])
def test_multi_collectors_take_num_workers_where_torchrl_has_it(name):
    """TorchRL 0.14.1: ``(create_env_fn, policy=None, *, num_workers=None, ...)``."""
    import inspect

    theirs = list(inspect.signature(trl_collectors.MultiSyncCollector.__init__).parameters.values())[1:4]
    ours = list(inspect.signature(getattr(rpc_collectors, name).__init__).parameters.values())[1:4]
    assert [p.name for p in ours] == [p.name for p in theirs] == ["create_env_fn", "policy", "num_workers"]
    assert [(p.kind, p.default) for p in ours[1:]] == [(p.kind, p.default) for p in theirs[1:]]
    with getattr(rpc_collectors, name)(pendulum, None, num_workers=2, frames_per_batch=20, total_frames=20) as c:
        assert c.num_workers == 2 and c.next().numel() == 20


def test_async_collector_takes_torchrls_arguments_and_pauses_as_its_test_does():
    """TorchRL's AsyncCollector signature (names, kinds, defaults; the keywords its ``**kwargs`` hands
    to MultiAsyncCollector spelled out), and its own test_pause run on ours: CountingEnv, a RandomPolicy,
    a memmap replay buffer, start() and pause()."""
    import inspect

    from torchrl.data import LazyMemmapStorage

    theirs = dict(inspect.signature(trl_collectors.AsyncCollector.__init__).parameters)
    assert theirs.pop("kwargs").kind is inspect.Parameter.VAR_KEYWORD
    ours = inspect.signature(rpc_collectors.AsyncCollector.__init__).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    for name, parameter in theirs.items():
        assert ours[name].kind == parameter.kind and ours[name].default == parameter.default, name
    multi = inspect.signature(rpc_collectors.MultiAsyncCollector.__init__).parameters  # where TorchRL's kwargs go
    rest = list(ours)[len(theirs):]
    assert all(ours[name].kind is inspect.Parameter.KEYWORD_ONLY for name in rest)
    assert set(rest) == set(multi) - set(theirs) - {"num_workers", "num_collectors"}  # one worker
    rb = ReplayBuffer(storage=LazyMemmapStorage(max_size=1000))
    env = mocks.CountingEnv()
    c = rpc_collectors.AsyncCollector(mocks.CountingEnv, RandomPolicy(action_spec=env.action_spec), replay_buffer=rb,
                                      total_frames=-1, frames_per_batch=16)
    try:
        c.start()
        deadline = time.monotonic() + 60
        while len(rb) < 16 and time.monotonic() < deadline:
            time.sleep(0.05)
        with c.pause():
            n = rb.write_count
            time.sleep(0.3)
            assert rb.write_count == n
        while rb.write_count == n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rb.write_count > n
    finally:
        c.async_shutdown(timeout=30)


def constant_policy_state(value: float) -> dict:
    return constant_actor(value).state_dict()


@pytest.mark.parametrize("scheme, transport", [
    ("SharedMemWeightSyncScheme", "shared"), ("MultiProcessWeightSyncScheme", "rpc"),
    ("DistributedWeightSyncScheme", "broadcast"), ("RPCWeightSyncScheme", "rpc"),
])
def test_weight_sync_schemes_map_onto_our_transports(scheme, transport):
    """TorchRL's scheme objects as its tests pass them ({"policy": scheme}): the weights take the
    transport the scheme names, and a push reaches the workers."""
    import torchrl.weight_update as schemes

    actor = constant_actor(0.5)
    with MultiSyncCollector([pendulum] * 2, actor, frames_per_batch=20, total_frames=-1,
                            weight_sync_schemes={"policy": getattr(schemes, scheme)()}) as c:
        assert c.weights.spec.kind == transport and (c.next()["action"] == 0.5).all()
        c.update_policy_weights_(constant_policy_state(1.5))
        assert (c.next()["action"] == 1.5).all()


def test_shared_memory_schemes_with_weights_per_worker_take_copies():
    """TorchRL's ``SharedMemWeightSyncScheme(per_worker_weights=True)``, or distinct policy factories
    (where TorchRL's scheme sets that flag itself): each worker its own weights, so copies ("shm"),
    not the trainer's memory ("shared"); each worker's own update reaches only it."""
    from torchrl.weight_update import SharedMemWeightSyncScheme

    with MultiSyncCollector([pendulum] * 2, constant_actor(0.5), frames_per_batch=20, total_frames=-1,
                            weight_sync_schemes={"policy": SharedMemWeightSyncScheme(per_worker_weights=True)}) as c:
        assert c.weights.spec.kind == "shm"
        c.update_policy_weights_({1: constant_policy_state(1.5)})
        batch = c.next()
        assert (batch["action"][0] == 0.5).all() and (batch["action"][1] == 1.5).all()
    factories = [partial(constant_actor, 0.5), partial(constant_actor, 1.5)]
    with MultiSyncCollector([pendulum] * 2, policy_factory=factories, frames_per_batch=20,
                            weight_sync_schemes={"policy": SharedMemWeightSyncScheme()}) as c:
        c.update_policy_weights_({0: constant_policy_state(2.5)})
        assert c.weights.spec.kind == "shm" and (c.next()["action"][0] == 2.5).all()
    with MultiSyncCollector([pendulum] * 2, policy_factory=factories[0], frames_per_batch=20,
                            weight_sync_schemes={"policy": SharedMemWeightSyncScheme()}) as c:
        c.update_policy_weights_(constant_policy_state(2.5))
        assert c.weights.spec.kind == "shared"


def test_weight_sync_schemes_attribute_shows_the_scheme_of_the_transport_used():
    """TorchRL's tests read ``_weight_sync_schemes["policy"]``: the scheme given, or TorchRL's scheme
    for the transport the weights take (shared memory by default on one host, as TorchRL's default)."""
    from torchrl.weight_update import MultiProcessWeightSyncScheme, NoWeightSyncScheme, SharedMemWeightSyncScheme

    given = MultiProcessWeightSyncScheme()
    with MultiSyncCollector([pendulum] * 2, constant_actor(0.5), frames_per_batch=20,
                            weight_sync_schemes={"policy": given}) as c:
        assert c._weight_sync_schemes == {"policy": given} and c.weights.spec.kind == "rpc"
    for kwargs, scheme in [({}, SharedMemWeightSyncScheme), ({"weight_transport": "rpc"}, MultiProcessWeightSyncScheme),
                           ({"weight_sync_schemes": {"policy": NoWeightSyncScheme()}}, NoWeightSyncScheme)]:
        with MultiAsyncCollector([pendulum] * 2, constant_actor(0.5), frames_per_batch=20, **kwargs) as c:
            assert type(c._weight_sync_schemes["policy"]) is scheme, kwargs


@pytest.mark.parametrize("cls", ["Collector", "MultiSyncCollector"])
def test_no_weight_sync_scheme_makes_updates_do_nothing(cls):
    from torchrl.weight_update import NoWeightSyncScheme, RayWeightSyncScheme

    env = pendulum if cls == "Collector" else [pendulum] * 2
    with getattr(rpc_collectors, cls)(env, constant_actor(0.5), frames_per_batch=20, total_frames=-1,
                                      weight_sync_schemes={"policy": NoWeightSyncScheme()}) as c:
        c.next()
        c.update_policy_weights_(constant_policy_state(1.5))
        assert (c.next()["action"] == 0.5).all() and c.policy_version == 0
    with pytest.raises(ValueError, match="RayWeightSyncScheme} is for RayCollector"):
        getattr(rpc_collectors, cls)(env, None, frames_per_batch=20, weight_sync_schemes={"policy": RayWeightSyncScheme()})


def test_trust_policy_as_torchrls_test_set_truncated_uses_it():
    """TorchRL's test_set_truncated: a CloudpickleWrapper of env.rand_action, trusted, and set_truncated."""
    from torchrl.data.utils import CloudpickleWrapper

    def env_fn():
        return TransformedEnv(mocks.NestedCountingEnv(), InitTracker()).add_truncated_keys()

    policy = CloudpickleWrapper(env_fn().rand_action)
    with Collector(env_fn(), policy, frames_per_batch=20, total_frames=-1, set_truncated=True, trust_policy=True) as c:
        assert c.next()[..., -1]["next", "data", "truncated"].all()
    with MultiSyncCollector([env_fn, env_fn], policy, frames_per_batch=20, total_frames=-1, cat_results="stack",
                            set_truncated=True, trust_policy=True) as c:
        assert c.next()[..., -1]["next", "data", "truncated"].all()


def serial_mock_env():
    return SerialEnv(2, mocks.ContinuousActionVecMockEnv)


@pytest.mark.parametrize("frames", [[10, 10], [15, 5]])
def test_frames_per_batch_lists_with_batched_envs_as_torchrls_test(frames):
    """TorchRL's test_collector_frames_per_batch_worker, SerialEnv of 2 in each worker: async batches
    hold the list's sum rounded up to the env batch; sync rounds of an int split over the workers."""
    total = sum(frames)
    with MultiAsyncCollector([serial_mock_env] * 2, None, frames_per_batch=frames, max_frames_per_traj=1000,
                             total_frames=total * 100) as c:
        c.set_seed(100)
        for _, batch in zip(range(6), c):
            assert batch.numel() == -(-total // 2) * 2
        assert batch.names[-1] == "time"
    with MultiSyncCollector([serial_mock_env] * 2, None, frames_per_batch=total, max_frames_per_traj=1000,
                            total_frames=total * 100, cat_results="stack") as c:
        c.set_seed(100)
        for _, batch in zip(range(6), c):
            assert batch.numel() == -(-total // 2 // 2) * 2 * 2
    with pytest.raises(ValueError, match="frames_per_batch has 3 entries for 2 workers"):
        MultiSyncCollector([serial_mock_env] * 2, None, frames_per_batch=[5, 5, 5])


def test_collector_backends_are_torchrls():
    from torchrl.collectors._single import _CollectorMeta

    from rpc_collectors.collectors import dispatch

    assert set(dispatch.BACKENDS) == set(_CollectorMeta._BACKENDS)
    assert dispatch.RESERVED_OPTIONS == set(_CollectorMeta._RESERVED_OPTIONS)


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_torchrls_collector_class_runs_nodes_of_local_workers(name):
    """``collector_class=torchrl.collectors.MultiSyncCollector`` (what a TorchRL script passes) makes
    each worker a node of ``num_workers_per_collector`` local workers; TorchRL's RPCCollector
    ``torch.cat``s its nodes' batches (read from its source), so sync batches are ``[N*W, T]``."""
    with RPCCollector(pendulum, None, num_collectors=2, frames_per_batch=100, launcher="local",
                      sync=name == "MultiSyncCollector", collector_class=getattr(trl_collectors, name),
                      num_workers_per_collector=2) as c:
        batch = c.next()
        assert [len(info["local_pids"]) for info in c.infos] == [2, 2]
    assert batch.shape == (torch.Size([4, 25]) if name == "MultiSyncCollector" else torch.Size([100]))


@pytest.mark.usefixtures("no_leftover_processes")
def test_other_layouts_by_argument():
    with RPCCollector(pendulum, None, num_collectors=2, frames_per_batch=100, launcher="local", cat_results="stack") as c:
        assert c.next().shape == torch.Size([2, 50])
    with multi_sync(cat_results=0) as c:
        assert c.next().shape == torch.Size([100])


# ------------------------------------------------------------------ 5. smaller gaps
@pytest.mark.usefixtures("no_leftover_processes")
def test_split_trajs_on_batched_envs_in_workers():
    """MultiSync of SerialEnv: [N, B, T]; split_trajs gives [n_traj, T_max] as TorchRL does."""
    with MultiSyncCollector([serial_plain_pendulum] * 2, None, frames_per_batch=1000, total_frames=1000,
                            max_frames_per_traj=60, split_trajs=True) as c:
        batch = c.next()
    mask = batch["collector", "mask"]
    assert batch.batch_dims == 2 and mask.sum() == 1000
    for row, valid in zip(batch[TRAJ], mask):
        assert row[valid].unique().numel() == 1  # one trajectory per row
    assert batch["step_count"][mask].max() <= 59


@pytest.mark.usefixtures("no_leftover_processes")
def test_update_policy_weights_in_torchrls_forms_and_init_updater_arguments():
    actor = constant_actor(0.5)
    with multi_sync(policy=actor) as c:
        c.init_updater("ignored", option=1)  # TorchRL: a no-op without a weight updater
        set_constant(actor, 1.0)
        c.update_policy_weights_(worker_ids=torch.device("cpu"))
        assert (c.next()["action"] == 1.0).all()
        c.update_policy_weights_(actor, worker_ids=[torch.device("cpu")])
        set_constant(actor, -1.0)
        c.update_policy_weights_(weights=TensorDict.from_module(actor))  # TorchRL's keyword spellings
        assert (c.next()["action"] == -1.0).all()
        c.update_policy_weights_(policy=actor)
        with pytest.raises(TypeError, match="once"):
            c.update_policy_weights_(actor, policy=actor)
        with pytest.raises(ValueError, match="worker_ids"):
            c.update_policy_weights_(worker_ids=torch.device("meta"))
    single = Collector(pendulum, actor, frames_per_batch=10)
    single.update_policy_weights_(worker_ids=torch.device("cpu"))
    single.update_policy_weights_(policy=constant_actor(0.25))
    assert (single.next()["action"] == 0.25).all()
    single.init_updater(1, 2, x=3)


@pytest.mark.usefixtures("no_leftover_processes")
def test_frames_per_batch_rounded_up_over_workers_with_a_warning():
    with pytest.warns(UserWarning, match="does not divide evenly over 3 workers"):
        c = MultiSyncCollector([pendulum] * 3, None, frames_per_batch=100, total_frames=102)
    with c:
        batches = list(c)
    assert [b.shape for b in batches] == [torch.Size([3, 34])]  # TorchRL: 34 per worker


@pytest.mark.usefixtures("no_leftover_processes")
def test_trainer_threads_lowered_while_workers_run():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        with multi_sync() as c:
            assert torch.get_num_threads() == 2  # as TorchRL: its threads less one per local worker
            c.next()
        assert torch.get_num_threads() == 4
        with multi_sync(num_threads=3):
            assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 4
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------ 6. issue 18: TorchRL's own collector tests
def tracked_pendulum():
    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(StepCounter(), InitTracker()))


def ou_actor() -> TensorDictSequential:
    """An actor with TorchRL's Ornstein-Uhlenbeck exploration, which writes ``_ou_prev_noise`` and ``_ou_steps``."""
    return TensorDictSequential(constant_actor(0.0), OrnsteinUhlenbeckProcessModule(spec=tracked_pendulum().action_spec))


@pytest.mark.usefixtures("no_leftover_processes")
def test_private_keys_are_dropped_from_batches_and_replay_buffers():
    """As TorchRL's collectors: entries named ``_...`` stay out of batches and replay buffers."""
    private = ("_ou_prev_noise", "_ou_steps")
    with Collector(tracked_pendulum, ou_actor(), frames_per_batch=20) as c:
        batch = c.next()
    assert "action" in batch.keys() and not set(private) & set(batch.keys(True, True))
    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    with MultiSyncCollector([tracked_pendulum] * 2, ou_actor(), frames_per_batch=20, total_frames=20,
                            replay_buffer=rb) as c:
        list(c)
    assert len(rb) > 0 and not set(private) & set(rb.sample(4).keys(True, True))


def test_torchrls_checkpoint_saves_and_restores_our_collector(tmp_path):
    """TorchRL's ``Checkpoint`` (what its ``RunCheckpointer`` saves) takes our collector as a component:
    frames, batches and the ``stats()`` progress counters come back."""
    from torchrl.checkpoint import Checkpoint

    c = Collector(plain_pendulum, None, frames_per_batch=20, total_frames=100)
    for _ in range(2):
        c.next()
    Checkpoint(collector=c).save(tmp_path / "run")
    resumed = Collector(plain_pendulum, None, frames_per_batch=20, total_frames=100)
    Checkpoint(collector=resumed).load(tmp_path / "run")
    assert resumed.stats() == c.stats() and resumed.stats()["trajectory_pending_frames"] == 40


def test_max_frames_per_traj_on_an_env_with_a_step_counter_is_refused():
    """As TorchRL: the env counts its steps already, so max_frames_per_traj is a ValueError."""
    with pytest.raises(ValueError, match="max_frames_per_traj=30 conflicts with the env's own step counter"):
        Collector(pendulum, None, frames_per_batch=20, max_frames_per_traj=30)
    with pytest.raises(ValueError, match="step_count"):
        trl_collectors.Collector(pendulum, None, frames_per_batch=20, total_frames=20, max_frames_per_traj=30)
    Collector(lambda: GymEnv("Pendulum-v1"), None, frames_per_batch=20, max_frames_per_traj=30).shutdown()


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("ndim", [1, 2])
def test_replay_buffer_filled_as_torchrls_workers_fill_it(ndim):
    """A 1-d storage gets frames (TorchRL's workers each extend their [T] batch: len grows by
    frames_per_batch); a 2-d one the [N, T] batch as it is, a lane per worker."""
    rb = ReplayBuffer(storage=LazyTensorStorage(256, ndim=ndim))
    with MultiSyncCollector([plain_pendulum] * 2, None, frames_per_batch=32, total_frames=64, replay_buffer=rb) as c:
        list(c)
    assert rb.storage._storage.shape == ((256,) if ndim == 1 else (128, 2))
    assert len(rb) == 64


@pytest.mark.usefixtures("no_leftover_processes")
def test_extend_buffer_false_adds_each_workers_steps_to_a_torchrl_buffer():
    """TorchRL's workers add() each step they collect: a 1-d storage grows by one frame per add."""
    rb = ReplayBuffer(storage=LazyTensorStorage(256))
    with MultiSyncCollector([plain_pendulum] * 2, None, frames_per_batch=32, total_frames=64, replay_buffer=rb,
                            extend_buffer=False, track_policy_version=True) as c:  # steps keep their worker id
        list(c)
    assert len(rb) == 64 and rb.storage._storage.shape == (256,)
    assert rb[:64]["collector", "worker_id"].tolist() == ([0] * 16 + [1] * 16) * 2


def capped_pendulum(max_steps: int):
    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(max_steps=max_steps))


@pytest.mark.parametrize("device", [None, "cpu"])
def test_batched_env_of_individual_tds_resets_part_of_its_envs(device):
    """SerialEnv(share_individual_td=True): the "_reset" TensorDict is on the env's device, and
    the envs that ended get new trajectory ids although the env's TensorDicts are a lazy stack."""
    make = partial(SerialEnv, 2, [partial(capped_pendulum, 3), partial(capped_pendulum, 5)],
                   share_individual_td=True, device=device)
    with Collector(make, None, frames_per_batch=2 * 15) as c:
        batch = c.next()
    assert batch[TRAJ].tolist() == [[0, 0, 0, 2, 2, 2, 4, 4, 4, 5, 5, 5, 7, 7, 7],
                                    [1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 6, 6, 6, 6, 6]]


# ------------------------------------------------------------------ what already works and must keep working
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls", ["Collector", "MultiSyncCollector", "MultiAsyncCollector"])
def test_docs_examples_with_the_import_swapped(cls):
    """The Examples of TorchRL's Collector / MultiSyncCollector / MultiAsyncCollector docstrings."""
    policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
    kwargs = dict(policy=policy, total_frames=2000, max_frames_per_traj=50, frames_per_batch=200,
                  init_random_frames=-1, reset_at_each_iter=False, device="cpu", storing_device="cpu")
    if cls == "Collector":
        collector = Collector(create_env_fn=env_maker, **kwargs)
    else:
        collector = getattr(rpc_collectors, cls)(create_env_fn=[env_maker, env_maker], cat_results="stack", **kwargs)
    for i, data in enumerate(collector):  # noqa: B007 (data: the third batch, read below)
        if i == 2:
            break
    collector.shutdown()
    del collector
    assert data.names[-1] == "time"
    assert data.numel() == 200 and data["action"].shape[-1] == 1
    assert data["next", "step_count"].max() <= 50


@pytest.mark.usefixtures("no_leftover_processes")
def test_multicollector_docs_example():
    """TorchRL's MultiCollector example: CartPole-v1, 4 workers, sync and async."""
    def make_env():
        return GymEnv("CartPole-v1")

    for sync in (True, False):
        collector = rpc_collectors.MultiCollector(create_env_fn=[make_env] * 4, policy=None, frames_per_batch=1000,
                                                  total_frames=2000, sync=sync)
        frames = sum(data.numel() for data in collector)
        collector.shutdown()
        assert frames == 2000


def slices(sample, slice_len: int):
    return sample[TRAJ].reshape(-1, slice_len), sample[STEP].reshape(-1, slice_len)


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_slice_sampler_never_crosses_trajectories(ndim):
    """SliceSampler on ("collector", "traj_ids") over 1-, 2- and 3-d storages of our batches
    (0.14.1 names the argument ``traj_key``; its docs say ``trajectory_key``)."""
    make_env = serial_plain_pendulum if ndim == 3 else plain_pendulum
    with MultiSyncCollector([make_env] * 2, None, frames_per_batch=800, total_frames=3200, max_frames_per_traj=37,
                            cat_results=0 if ndim == 1 else "stack") as c:
        rb = ReplayBuffer(storage=LazyTensorStorage(6400, ndim=ndim),
                          sampler=SliceSampler(slice_len=8, traj_key=TRAJ), batch_size=1000)
        for batch in c:
            assert batch.batch_dims == ndim
            rb.extend(batch)
    for _ in range(5):
        ids, steps = slices(rb.sample(), 8)
        assert (ids == ids[:, :1]).all(), "a slice mixes trajectories"
        assert (steps.diff(dim=-1) == 1).all(), "a slice is not consecutive in time"


@pytest.mark.usefixtures("no_leftover_processes")
def test_gae_and_clip_ppo_loss_on_our_batches():
    actor, value = tanh_actor(), ValueOperator(nn.Linear(3, 1), in_keys=["observation"])
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=value)
    loss = ClipPPOLoss(actor, value)
    for cat_results in ("stack", 0):
        with MultiSyncCollector([pendulum] * 2, actor, frames_per_batch=200, cat_results=cat_results) as c:
            batch = c.next()
        with torch.no_grad():
            gae(batch)
        assert batch["advantage"].shape == (*batch.shape, 1) and batch["advantage"].isfinite().all()
        out = loss(batch.reshape(-1))
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        total.backward()
        assert all(p.grad is not None and p.grad.isfinite().all() for p in actor.parameters())


@pytest.mark.usefixtures("no_leftover_processes")
def test_parallel_env_and_transformed_env_inside_workers():
    """TorchRL's ParallelEnv in each worker; at shutdown each worker closes it in its own time (up to
    TorchRL's 10 s), not killed midway."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with MultiSyncCollector([parallel_capped_pendulum] * 2, None, frames_per_batch=400, total_frames=400) as c:
            batch = c.next()
    killed = [str(w.message) for w in caught if "killed" in str(w.message)]
    assert not killed, killed
    assert batch.shape == torch.Size([2, 2, 100])
    assert batch[STEP].max() <= 30 and (batch["step_count"] + 1 == batch[STEP]).all()  # the StepCounter transform ran
    ids = batch[TRAJ]
    assert not set(ids[0].flatten().tolist()) & set(ids[1].flatten().tolist())


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("sync", [True, False])
def test_start_into_a_torchrl_replay_buffer(sync):
    """``start()`` into a TorchRL ReplayBuffer (TorchRL's own MultiSync start() into an ndim=2 buffer fails)."""
    rb = ReplayBuffer(storage=LazyTensorStorage(10_000, ndim=2 if sync else 1))
    c = MultiSyncCollector([pendulum] * 2, None, frames_per_batch=200, replay_buffer=rb) if sync else \
        MultiAsyncCollector([pendulum] * 2, None, frames_per_batch=100, replay_buffer=rb)
    c.start()
    deadline = time.monotonic() + 60
    while len(rb) < 1000 and time.monotonic() < deadline:
        time.sleep(0.05)
    c.async_shutdown(timeout=30, close_env=True)
    sample = rb.sample(64)
    assert len(rb) >= 1000 and sample[TRAJ].shape[0] == 64


# ------------------------------------------------------------------ the PPO example
@pytest.mark.usefixtures("no_leftover_processes")
def test_torchrl_ppo_example_short_mode():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torchrl_ppo.py"), "--env", "Pendulum-v1", "--total-frames", "2000",
         "--frames-per-batch", "1000", "--workers", "2", "--epochs", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("frames")]
    assert len(lines) == 2, proc.stdout
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ 7. issue 18, point 11: TorchRL's nested and unusual envs
def hetero_env_and_policy():
    env = mocks.HeterogeneousCountingEnv()
    return env, mocks.HeterogeneousCountingEnvPolicy(env.input_spec["full_action_spec"])


def multikey_env_and_policy():
    env = mocks.MultiKeyCountingEnv()
    return env, mocks.MultiKeyCountingEnvPolicy(full_action_spec=env.full_action_spec)


def multiagent_env_and_policy():
    env = mocks.MultiAgentCountingEnv(n_agents=3)
    return env, RandomPolicy(env.full_action_spec)


def nested_env_and_policy():
    env = mocks.NestedCountingEnv(nest_obs_action=True, nest_done=True, batch_size=(2,), nested_dim=3)
    return env, RandomPolicy(env.full_action_spec)


@pytest.mark.parametrize("make", [hetero_env_and_policy, multikey_env_and_policy, multiagent_env_and_policy,
                                  nested_env_and_policy])
def test_nested_action_and_done_keys_give_torchrls_batches(make):
    """Policies that write nested actions (per agent, heterogeneous lazy stacks) and envs whose done
    keys are only nested: the same keys and values as TorchRL's Collector, resets and ids included."""
    batches = []
    for cls in (trl_collectors.Collector, Collector):
        torch.manual_seed(0)
        env, policy = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            collector = cls(env, policy, frames_per_batch=20, total_frames=40)
        batches.append(list(collector))
        collector.shutdown()
    for theirs, ours in zip(*batches):
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
        assert (ours == theirs).all()
    assert ours.get(TRAJ).unique().numel() > 1  # trajectories ended within the batch, and were counted


def agents_env():
    return mocks.MultiAgentCountingEnv(n_agents=2)


@pytest.mark.usefixtures("no_leftover_processes")
def test_multi_agent_env_in_workers():
    with MultiSyncCollector([agents_env] * 2, RandomPolicy(agents_env().full_action_spec), frames_per_batch=20,
                            total_frames=20) as c:
        batch = c.next()
    assert batch.shape == (2, 10) and batch.get(("agents", "agent_1", "action")).shape[:2] == (2, 10)


def test_dynamic_observation_shape_gives_a_lazy_stack_as_torchrls():
    batches = [cls(mocks.EnvWithDynamicSpec(), None, frames_per_batch=8, total_frames=8).next()
               for cls in (trl_collectors.Collector, Collector)]
    shapes = [[step.get("observation").shape for step in b.unbind(0)] for b in batches]
    assert shapes[0] == shapes[1] and len(set(shapes[1])) > 1
    assert isinstance(batches[1], type(batches[0]))


def dynamic_env():
    return mocks.EnvWithDynamicSpec()


def hetero_env():
    return TransformedEnv(mocks.HeterogeneousCountingEnv(max_steps=3, batch_size=(4,)), InitTracker())


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_lazy_stacked_batches_come_from_workers_as_torchrls(cls):
    """Observations whose shape changes between steps, and heterogeneous agents: the workers' lazy
    stacks reach the trainer (not through shared memory), with the dim name "time", as TorchRL's."""
    policy = RandomPolicy(mocks.EnvWithDynamicSpec().action_spec)
    with cls([dynamic_env] * 2, policy, frames_per_batch=16, total_frames=32) as c:
        batches = list(c)
    assert len(batches) == 2 and all(b.names[-1] == "time" for b in batches)
    shapes = {step.get("observation").shape for b in batches for step in b.reshape(-1).unbind(0)}
    assert len(shapes) > 1  # the steps keep their own shapes
    hetero_policy = mocks.HeterogeneousCountingEnvPolicy(hetero_env().input_spec["full_action_spec"])
    with cls([hetero_env], hetero_policy, frames_per_batch=8, total_frames=16) as c:
        first, second = list(c)
    assert first.names[-1] == "time" and isinstance(first.get("lazy"), LazyStackedTensorDict)
    cameras = [b.get("lazy")[..., 0].get("camera") for b in (first, second)]  # agent 0's, as TorchRL indexes it
    assert not (cameras[0] == cameras[1]).all()  # the env counted on from one batch to the next


def test_a_single_process_lazy_stack_has_the_time_dim_name_as_torchrls():
    batch = Collector(mocks.EnvWithDynamicSpec(), None, frames_per_batch=8, total_frames=8).next()
    assert isinstance(batch, LazyStackedTensorDict) and batch.names[-1] == "time"


def test_non_tensor_entries_of_reset_and_step_follow_the_steps():
    """A non-tensor state written by reset() and step() reaches the next step's root, as in TorchRL."""
    for cls in (trl_collectors.Collector, Collector):
        batch = cls(mocks.EnvWithMetadata(), None, frames_per_batch=6, total_frames=6).next()
        assert batch.get("non_tensor").tolist() == [0, 1, 2, 3, 4, 5]
        assert batch.get(("next", "non_tensor")).tolist() == [1, 2, 3, 4, 5, 6]


def test_torchrl_random_policy_without_a_spec_gets_the_envs():
    env = mocks.ContinuousActionVecMockEnv()
    batch = Collector(env, RandomPolicy(), frames_per_batch=50, total_frames=50).next()
    action = batch.get("action")
    assert action.shape == (50, *env.action_spec.shape) and env.action_spec.is_in(action)
    assert action.std() > 0


@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("devices", [{}, {"device": "cpu"}, {"storing_device": "cpu"}], ids=["none", "device", "storing"])
@pytest.mark.parametrize("name", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_multi_worker_batches_report_device_as_torchrls(name, devices):
    """Every batch reports TorchRL's device: None unless a device was given, else that device
    (ours: the first batches and those from shared memory alike)."""
    reported = []
    for cls in (getattr(trl_collectors, name), getattr(rpc_collectors, name)):
        c = cls([pendulum] * 2, None, frames_per_batch=20, total_frames=100, **devices)
        try:
            reported.append([batch.device for batch in c])
        finally:
            c.shutdown()
    expected = torch.device("cpu") if devices else None
    assert reported[1] == reported[0] == [expected] * 5, reported


# ------------------------------------------------------------------ 8. issue 18: TorchRL's arguments, compared with its Collector
def torchrl_and_our_keys(make_env, **kwargs) -> list[set]:
    keys = []
    for cls in (trl_collectors.Collector, Collector):
        batch = cls(make_env, None, frames_per_batch=8, total_frames=8, **kwargs).next()
        keys.append(set(batch.keys(True, True)))
    return keys


@pytest.mark.parametrize("kwargs", [dict(compact_obs=True), dict(track_traj_ids=False), dict(set_truncated=True)])
def test_batch_options_give_torchrls_keys(kwargs):
    theirs, ours = torchrl_and_our_keys(tracked_pendulum, **kwargs)
    assert ours == theirs


def test_set_truncated_on_a_torchrl_env_as_torchrl():
    for cls in (trl_collectors.Collector, Collector):
        batch = cls(plain_pendulum, None, frames_per_batch=8, total_frames=8, set_truncated=True).next()
        assert batch.get(("next", "truncated"))[-1].all() and batch.get(("next", "done"))[-1].all()
        assert not batch.get(("next", "truncated"))[:-1].any()
    with pytest.raises(ValueError, match="set_truncated=True needs a 'truncated' done key"):
        Collector(mocks.CountingEnv, None, frames_per_batch=8, set_truncated=True)


def test_create_env_kwargs_of_a_torchrl_env_class():
    for cls in (trl_collectors.Collector, Collector):
        collector = cls(mocks.CountingEnv, None, frames_per_batch=12, total_frames=12, create_env_kwargs={"batch_size": (3,)})
        assert collector.next().shape == (3, 4)


# ------------------------------------------------------------------ 9. issue 18, point 12: EnvPool (NEXT_STEP autoreset)
def envpool_env(name: str, num_envs: int) -> rpc_collectors.GymEnv:
    import envpool

    with warnings.catch_warnings():  # EnvPool's CartPole space has float64 bounds, which gymnasium warns about
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
        return rpc_collectors.GymEnv(envpool.make_gymnasium(name, num_envs=num_envs))


def test_envpool_env_never_records_a_reset_as_a_transition():
    """EnvPool autoresets a finished env on its next step; the collector resets it first (by env_id),
    so every CartPole transition has reward 1 and each new trajectory starts from a reset."""
    env = envpool_env("CartPole-v1", 3)
    with Collector(env, None, frames_per_batch=300, total_frames=300) as c:
        batch = c.next()
    assert (batch.get(("next", "reward")) == 1).all()
    done = batch.get(("next", "done")).squeeze(-1)
    assert done.sum() >= 3
    after_done = batch.get("observation")[:, 1:][done[:, :-1]]
    assert after_done.abs().max() <= 0.05  # CartPole's reset state
    cont = ~done[:, :-1]
    assert torch.equal(batch.get("observation")[:, 1:][cont], batch.get(("next", "observation"))[:, :-1][cont])


def envpool_pong():
    return envpool_env("Pong-v5", 2)


@pytest.mark.usefixtures("no_leftover_processes")
def test_envpool_atari_in_workers():
    with MultiSyncCollector([envpool_pong] * 2, None, frames_per_batch=64, total_frames=64) as c:
        batch = c.next()
    assert batch.shape == (2, 2, 16) and batch.get("observation").shape[-3:] == (4, 84, 84)


def lstm_policy() -> TensorDictSequential:
    from torchrl.modules import LSTMModule

    lstm = LSTMModule(input_size=3, hidden_size=8, in_key="observation", out_key="embed")
    return TensorDictSequential(lstm, TensorDictModule(nn.Linear(8, 1), ["embed"], ["action"]))


@pytest.mark.usefixtures("no_leftover_processes")
def test_auto_register_policy_transforms_gives_a_recurrent_policy_its_env_transforms():
    """True appends InitTracker and the LSTM's TensorDictPrimer to the env, as TorchRL's collector does."""
    keys = []
    for cls in (trl_collectors.Collector, Collector):
        batch = cls(plain_pendulum, lstm_policy(), frames_per_batch=8, total_frames=8,
                    auto_register_policy_transforms=True).next()
        keys.append(set(batch.keys(True, True)))
    assert keys[0] == keys[1] and {"is_init", "recurrent_state_h", ("next", "recurrent_state_c")} <= keys[1]
    with pytest.raises(KeyError, match="is_init"):  # without them the LSTM fails, in TorchRL's collector too
        Collector(plain_pendulum, lstm_policy(), frames_per_batch=8, auto_register_policy_transforms=False)
    with pytest.warns(FutureWarning, match="lacks transforms the policy needs"), pytest.raises(KeyError):
        Collector(plain_pendulum, lstm_policy(), frames_per_batch=8)  # None: TorchRL 0.14's warning
    with MultiSyncCollector([plain_pendulum] * 2, lstm_policy(), frames_per_batch=8, total_frames=8,
                            auto_register_policy_transforms=True) as c:
        assert "recurrent_state_h" in c.next().keys()


INIT_TRACKER_SCRIPT = """
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs.libs.gym import GymEnv
from rpc_collectors import Collector, MultiSyncCollector
policy = TensorDictModule(nn.Linear(3, 1), in_keys=["observation"], out_keys=["action"])
with MultiSyncCollector([lambda: GymEnv("Pendulum-v1")] * 2, policy, frames_per_batch=8, total_frames=16) as c:
    frames = sum(b.numel() for b in c)
print("workers done", frames, flush=True)
Collector(GymEnv("Pendulum-v1"), policy, frames_per_batch=8)  # line 10: TorchRL 0.14's warning, in this process
"""


def test_init_tracker_warning_of_torchrls_default_only_in_the_trainer(tmp_path):
    """TorchRL's multi-process workers say nothing of what the env lacks (its workers ignore warnings):
    neither do ours; a single-process ``Collector`` warns as TorchRL's does, at the user's line."""
    script = tmp_path / "user_script.py"
    script.write_text(INIT_TRACKER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("PYTHONWARNINGS", None)
    proc = run_in_session([sys.executable, str(script)], 150, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["workers", "done", "16"]
    warned = [line for line in proc.stderr.splitlines() if "Warning" in line]
    assert warned == [f"{script}:10: FutureWarning: the env lacks transforms the policy needs (InitTracker); pass "
                      "auto_register_policy_transforms=True to append them (TorchRL 0.15's default), or False to "
                      "silence this"], proc.stderr


def test_use_buffers_true_stacks_densely_as_torchrl():
    """use_buffers=True: an env whose observation shape changes cannot be stacked (TorchRL's error too);
    with a replay buffer it is refused."""
    for cls in (trl_collectors.Collector, Collector):
        with pytest.raises(RuntimeError, match="stack"):  # TorchRL: "stack expects each tensor to be equal size"
            cls(mocks.EnvWithDynamicSpec(), None, frames_per_batch=8, total_frames=8, use_buffers=True).next()
    with pytest.raises(TypeError, match="use_buffers=True and a replay_buffer"):
        Collector(plain_pendulum, None, frames_per_batch=8, use_buffers=True,
                  replay_buffer=ReplayBuffer(storage=LazyTensorStorage(8)))
    assert Collector(plain_pendulum, None, frames_per_batch=8, total_frames=8, use_buffers=True).next().shape == (8,)


def seeded_vec_mock_env(seed: int):
    env = mocks.ContinuousActionVecMockEnv()
    env.set_seed(seed)
    return env


@pytest.mark.usefixtures("no_leftover_processes")
def test_preemptive_threshold_zero_as_torchrls_interruptor_test():
    """TorchRL's test_multisync_collector_interruptor_mechanism: with preemptive_threshold=0.0 no
    round holds all its frames; the frames not collected have trajectory id -1 and a False mask."""
    frames_per_batch = 800
    with MultiSyncCollector([seeded_vec_mock_env] * 2, Actor(nn.Linear(7, 7)), create_env_kwargs=[{"seed": 100}] * 2,
                            total_frames=800, max_frames_per_traj=50, frames_per_batch=frames_per_batch,
                            init_random_frames=-1, reset_at_each_iter=False, split_trajs=False,
                            preemptive_threshold=0.0, cat_results="stack") as c:
        batches = list(c)
    assert len(batches) > 1  # each round counts only what it collected
    for batch in batches:
        ids = batch["collector", "traj_ids"]
        assert ids[ids != -1].numel() < frames_per_batch
        assert torch.equal(batch["collector", "mask"], ids != -1)
