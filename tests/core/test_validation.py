"""Bad input: every wrong argument is refused with a message naming it and its value; env errors surface intact."""
from __future__ import annotations

import re
import traceback

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from conftest import CountEnv, TDCountEnv
from rpc_collectors import Collector, GymEnv


class EnvFactory:
    """Builds a CountEnv and counts how often it was asked to."""

    def __init__(self, num_envs: int | None = None) -> None:
        self.calls, self.num_envs = 0, num_envs

    def __call__(self):
        self.calls += 1
        return GymEnv("CountEnv-v0", num_envs=self.num_envs)


def refused(error: type, argument: str, value: str, **kwargs):
    """Build a Collector from kwargs; check it raises ``error`` naming ``argument`` and ``value``."""
    kwargs.setdefault("frames_per_batch", 10)
    factory = kwargs.pop("create_env_fn", None) or EnvFactory()
    policy = kwargs.pop("policy", None)
    with pytest.raises(error) as info:
        Collector(factory, policy, **kwargs)
    message = str(info.value)
    assert argument in message, message
    assert value in message, message
    return factory, message


@pytest.mark.parametrize("value", [0, -10, 2.5, "10", None, True])
def test_frames_per_batch(value):
    factory, message = refused((ValueError, TypeError), "frames_per_batch", repr(value), frames_per_batch=value)
    assert "accepted" in message
    assert factory.calls == 0  # checked before any env is built


@pytest.mark.parametrize("value", [0, -2, 1.5])
def test_total_frames(value):
    _, message = refused(ValueError, "total_frames", repr(value), total_frames=value)
    assert "-1" in message  # says what is accepted


def test_frames_per_batch_rounded_up_over_envs_with_a_warning():
    """As TorchRL: 10 frames over 3 envs become batches of 12, and the user is told so."""
    with pytest.warns(UserWarning, match=r"frames_per_batch=10 does not divide evenly over 3 envs.*12 frames"):
        collector = Collector(EnvFactory(num_envs=3), None, frames_per_batch=10, total_frames=24)
    assert [b.shape for b in collector] == [torch.Size([3, 4])] * 2
    assert collector.frames_per_batch == 12 and len(collector) == 2


@pytest.mark.parametrize("kind", ["Collector", pytest.param("MultiCollector", marks=pytest.mark.multiprocess)])
def test_a_total_frames_batches_overshoot_is_told_at_the_users_line(kind, request):
    """As TorchRL: 1000 frames in batches of 300 are 4 whole batches, 1200 frames, and the user is
    told so; rounding warnings name the user's own line, not one in the library."""
    from rpc_collectors import MultiCollector

    if kind == "MultiCollector":
        request.getfixturevalue("no_leftover_processes")
    with pytest.warns(UserWarning) as record:
        if kind == "Collector":
            collector = Collector(EnvFactory(num_envs=3), None, frames_per_batch=299, total_frames=1000)
        else:
            collector = MultiCollector([EnvFactory()] * 2, None, frames_per_batch=299, total_frames=1000)
    with collector:
        frames = sum(batch.numel() for batch in collector)
    overshoot = [w for w in record if "total_frames=1000" in str(w.message)]
    assert len(overshoot) == 1 and f"collects {frames} frames in 4 batches" in str(overshoot[0].message), \
        [str(w.message) for w in record]
    assert frames == 1200
    assert {w.filename for w in record} == {__file__}, [(w.filename, w.lineno) for w in record]


@pytest.mark.parametrize("value", ["sample", 3])
def test_exploration_type(value):
    refused(ValueError, "exploration_type", repr(value), exploration_type=value)


def test_exploration_type_by_name():
    from tensordict.nn import InteractionType

    assert Collector(EnvFactory(), None, frames_per_batch=10, exploration_type="mode").exploration_type is InteractionType.MODE
    assert Collector(EnvFactory(), None, frames_per_batch=10).exploration_type is InteractionType.RANDOM


def test_numpy_ints_accepted():
    import numpy as np

    collector = Collector(EnvFactory(), None, frames_per_batch=np.int64(10), total_frames=np.int64(20))
    assert len(list(collector)) == 2


@pytest.mark.parametrize("value", [0, -3, 2.0])
def test_max_frames_per_traj(value):
    refused(ValueError, "max_frames_per_traj", repr(value), max_frames_per_traj=value)


@pytest.mark.parametrize("value", [-2, 1.5])
def test_init_random_frames(value):
    refused(ValueError, "init_random_frames", repr(value), init_random_frames=value)


@pytest.mark.parametrize("argument, value", [(argument, value) for argument in ("split_trajs", "reset_at_each_iter")
                                              for value in (1, "yes", None) if (argument, value) != ("split_trajs", None)])
def test_booleans(argument, value):
    refused(TypeError, argument, repr(value), **{argument: value})


def test_split_trajs_none_is_torchrls_default_false():
    collector = Collector(EnvFactory(), None, frames_per_batch=10, split_trajs=None)
    assert collector.split_trajs is False
    collector.shutdown()


def test_postproc_not_callable():
    refused(TypeError, "postproc", "42", postproc=42)


def test_replay_buffer_without_extend():
    refused(TypeError, "replay_buffer", "{}", replay_buffer={})


@pytest.mark.parametrize("argument", ["device", "storing_device", "env_device", "policy_device"])
def test_unknown_device(argument):
    factory, _ = refused(ValueError, argument, "'foo'", **{argument: "foo"})
    assert factory.calls == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("value", ["cuda", "cuda:0", torch.device("cuda")])
def test_cuda_on_a_cpu_machine(value):
    _, message = refused(ValueError, "device", repr(value), device=value)
    assert "CUDA" in message


@pytest.mark.parametrize("made", [object(), 42, "not an env id"])
def test_env_fn_returning_no_env(made):
    if isinstance(made, str):  # a gymnasium id that does not exist: gymnasium's own error
        with pytest.raises(Exception, match="not an env id"):
            Collector(made, None, frames_per_batch=10)
        return
    _, message = refused(TypeError, "create_env_fn", repr(made)[:20], create_env_fn=lambda: made)
    assert "reset" in message and "step" in message


def test_env_without_rand_action_needs_a_policy():
    class NoRandom(TDCountEnv):
        rand_action = None

    refused(TypeError, "rand_action", "policy=None", create_env_fn=NoRandom())
    Collector(NoRandom(), lambda td: td.set("action", torch.zeros((), dtype=torch.int64)), frames_per_batch=4).next()


@pytest.mark.parametrize("policy", [5, "policy", [nn.Linear(3, 2)]])
def test_policy_not_callable(policy):
    factory, _ = refused(TypeError, "policy", repr(policy)[:20], policy=policy)
    assert factory.calls == 0


def test_tensordict_module_without_action():
    policy = TensorDictModule(nn.Linear(3, 2), in_keys=["observation"], out_keys=["logits"])
    _, message = refused(ValueError, "policy", "'action'", policy=policy)
    assert "logits" in message


@pytest.mark.parametrize("kind", ["gym", "td"])
def test_callable_policy_without_action(kind):
    def policy(td):
        td["logits"] = torch.zeros(*td.batch_size, 2)
        return td

    """Refused at the first batch, as TorchRL's first step refuses it (env transforms may add it)."""
    env = GymEnv(CountEnv()) if kind == "gym" else TDCountEnv()
    collector = Collector(env, policy, frames_per_batch=10)
    with pytest.raises(ValueError, match=re.escape("policy=") + ".*'action'"):
        collector.next()
    collector.shutdown()


# ---------------------------------------------------------------- env errors
class EnvBroke(RuntimeError):
    pass


class FailingCountEnv(CountEnv):
    """Fails on its 25th step."""

    def __init__(self) -> None:
        super().__init__(lengths=(4, 7))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 25:
            raise EnvBroke("step 25 failed")
        return super().step(action)


class FailingTDEnv(TDCountEnv):
    def step(self, td):
        if self.steps == 24:
            raise EnvBroke("step 25 failed")
        return super().step(td)


@pytest.mark.parametrize("env_cls", [lambda: GymEnv(FailingCountEnv()), lambda: FailingTDEnv(3)])
def test_env_error_surfaces_and_earlier_batches_stay_valid(env_cls):
    env = env_cls()
    n = int(torch.Size(env.batch_size).numel())
    collector = Collector(env, lambda td: td.set("action", torch.ones(td.batch_size, dtype=torch.int64)),
                          frames_per_batch=10 * n)
    batches = [collector.next(), collector.next()]  # steps 1..20
    copies = [b.clone() for b in batches]
    with pytest.raises(EnvBroke, match="step 25 failed") as info:
        collector.next()
    raised_in = traceback.extract_tb(info.tb)[-1]  # the innermost frame: the env's own step
    assert raised_in.name == "step" and raised_in.filename == __file__
    assert "raise EnvBroke" in raised_in.line
    for batch, copy in zip(batches, copies):
        assert (batch == copy).all()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("kind, argument", [
    ("AsyncBatchedCollector", "rpc_timeout"), ("AsyncBatchedCollector", "server_timeout"),
    ("RPCCollector", "rpc_timeout"), ("RPCCollector", "join_timeout"),
])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused_before_any_process_starts(kind, argument, value):
    import rpc_collectors
    from procs import descendants

    before = descendants()
    with pytest.raises(ValueError, match=f"{argument}={value!r} is invalid; accepted: a number of seconds"):
        getattr(rpc_collectors, kind)([EnvFactory()] * 2, policy=nn.Linear(3, 2), frames_per_batch=8, **{argument: value})
    assert not descendants() - before


def build(kind: str, **kwargs):
    """A collector of ``kind`` over CountEnv factories (two workers; one env for ``Collector``)."""
    import rpc_collectors

    if kind == "Collector":
        return Collector(EnvFactory(), None, frames_per_batch=8, **kwargs)
    if kind == "AsyncBatchedCollector":
        return rpc_collectors.AsyncBatchedCollector([EnvFactory()] * 2, policy=nn.Linear(3, 2), frames_per_batch=8, **kwargs)
    launcher = {"launcher": "debug"} if kind == "RPCCollector" else {}  # debug: no process, even were the check missing
    return getattr(rpc_collectors, kind)([EnvFactory()] * 2, None, frames_per_batch=8, **launcher, **kwargs)


def refused_before_any_process(error: type, kind: str, words: list[str], **kwargs) -> None:
    """Building ``kind`` from ``kwargs`` raises ``error`` naming ``words`` and starts no process (one
    built in error is shut down at once)."""
    from procs import descendants

    before = descendants()
    with pytest.raises(error) as info:
        with build(kind, **kwargs):
            pass
    for word in words:
        assert word in str(info.value), str(info.value)
    assert "accepted" in str(info.value)
    assert not descendants() - before


@pytest.mark.parametrize("value", [5, "x", {1: "a"}, [{}, 5]], ids=repr)
@pytest.mark.parametrize("kind", ["Collector", "MultiSyncCollector", "MultiAsyncCollector", "RPCCollector",
                                  "AsyncBatchedCollector"])
def test_create_env_kwargs_not_dicts_of_keywords_are_refused_before_any_process_starts(kind, value):
    refused_before_any_process(TypeError, kind, [f"create_env_kwargs={value!r}"], create_env_kwargs=value)


@pytest.mark.parametrize("key, value", [("trust_policy", 5), ("cudagraph_policy", "x"), ("no_cuda_sync", 5),
                                        ("interruptor", object())])
@pytest.mark.parametrize("kind", ["MultiSyncCollector", "MultiAsyncCollector", "RPCCollector"])
def test_collector_kwargs_checked_by_the_collector_are_refused_before_any_process_starts(kind, key, value):
    refused_before_any_process(TypeError, kind, [f"collector_kwargs[{key!r}]={value!r}"], collector_kwargs={key: value})
