"""The trainer<->worker protocol (:mod:`rpc_collectors.core.protocol`), without processes: the
calls it declares are the worker's, each typed call sends its own name, a worker serves no other
name, and the worker spec travels as the dataclass it is."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from tensordict import TensorDict

from conftest import CountEnv
from rpc_collectors import Collector
from rpc_collectors.core import pickling, protocol, worker_warnings
from rpc_collectors.core.protocol import CALLS, WorkerCalls, WorkerSpec
from rpc_collectors.pools.debug import DebugPool
from rpc_collectors.worker.server import WorkerState

pytestmark = pytest.mark.timeout(60)
KEYS = ("observation", "action", ("next", "observation"), ("next", "done"), ("collector", "traj_ids"))


def spec(**options) -> WorkerSpec:
    filters = worker_warnings.for_workers()
    return WorkerSpec(CountEnv, None, {"frames_per_batch": 10, worker_warnings.KEY: filters, **options})


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_call_is_a_worker_method_of_the_same_signature(name):
    declared = list(inspect.signature(getattr(WorkerCalls, name)).parameters.values())
    served = list(inspect.signature(getattr(WorkerState, name)).parameters.values())
    assert [p.name for p in declared[:2]] == ["self", "worker_id"]
    shape = lambda params: [(p.name, p.kind, p.default) for p in params]  # noqa: E731
    assert shape(declared[2:]) == shape(served[1:])


def test_each_typed_call_sends_its_own_name_and_arguments():
    sent = []
    calls = WorkerCalls(lambda *message: sent.append(message) or len(sent))
    for name in sorted(CALLS):
        params = list(inspect.signature(getattr(WorkerCalls, name)).parameters)[2:]
        args = [f"{name}.{p}" for p in params]
        assert getattr(calls, name)(7, *args) == len(sent)
        assert sent[-1] == (7, name, *args)


def test_the_spec_round_trips_through_pickle_as_its_dataclass():
    hook = lambda td: td.set("seen", torch.ones(td.shape))  # noqa: E731 (cloudpickle carries it)
    original = spec(post_collect_hook=hook)
    loaded = WorkerSpec.loads(original.dumps())
    assert loaded.create_env_fn is CountEnv and loaded.policy is None and loaded.node is None
    assert loaded.options.keys() == original.options.keys()
    assert loaded.options["frames_per_batch"] == 10
    assert loaded.options["post_collect_hook"](TensorDict({}, [3]))["seen"].sum() == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.policy = object()


def test_a_spec_that_is_not_a_worker_spec_is_refused():
    with pytest.raises(TypeError, match="must be a pickled WorkerSpec, got a pickled tuple"):
        WorkerSpec.loads(pickling.dumps((CountEnv, None, {"frames_per_batch": 10}, None)))


def test_a_worker_serves_its_declared_calls_as_a_collector_would():
    """Through the typed calls, a worker built from a spec collects what a single-process
    ``Collector`` does."""
    pool = DebugPool(1)
    try:
        info = pool.create(0, spec().dumps()).wait()
        assert info["envs"] == 1
        reference = Collector(CountEnv(), None, frames_per_batch=10)
        assert pool.calls.set_seed(0, 3).wait() == reference.set_seed(3)
        for _ in range(2):
            got, want = pool.calls.collect(0, 0).wait(), reference.next()
            for key in KEYS:
                assert torch.equal(got[key], want[key]), key
        reference.shutdown()
    finally:
        pool.close()


@pytest.mark.parametrize("name", ["close", "interrupt", "info", "__init__", "no_such_call"])
def test_a_name_the_protocol_does_not_declare_is_refused_and_runs_nothing(name):
    pool = DebugPool(1)
    try:
        pool.create(0, spec().dumps()).wait()
        ran = []
        for method in ("close", "interrupt", "info"):  # the worker's own methods, not protocol calls
            setattr(pool.states[0], method, lambda *args, method=method: ran.append(method))
        refused = f"ValueError: a worker serves no call '{name}'; accepted: .*'collect'"
        with pytest.raises(RuntimeError, match=refused):
            pool.call(0, name).wait()
        assert ran == []
        for method in ("close", "interrupt", "info"):
            delattr(pool.states[0], method)
        assert pool.calls.collect(0, 0).wait().numel() == 10  # the worker still serves
    finally:
        pool.close()


def test_serve_refuses_an_undeclared_name_before_touching_the_state():
    class State:
        touched = False

        def __getattr__(self, name):
            State.touched = True
            raise AssertionError(name)

    with pytest.raises(ValueError, match="a worker serves no call 'close'"):
        protocol.serve(State(), "close", ())
    assert not State.touched
