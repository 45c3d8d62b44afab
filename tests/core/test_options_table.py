"""The options table (``rpc_collectors.core.options``) against every public constructor's signature.

Each option a constructor takes that the table holds has the table's name and default (TorchRL's,
per class where TorchRL's classes differ); no constructor forwards ``**kwargs``: the classes on the
collector front spell out every option they take, and every parameter is documented, by the table or by its class.
"""
from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

import rpc_collectors
from rpc_collectors import Collector
from rpc_collectors.collectors.ray import RayCollector
from rpc_collectors.core import options

PUBLIC = [
    Collector, rpc_collectors.RPCCollector, rpc_collectors.MultiCollector, rpc_collectors.MultiSyncCollector,
    rpc_collectors.MultiAsyncCollector, rpc_collectors.AsyncCollector, rpc_collectors.DistributedCollector,
    rpc_collectors.DistributedSyncCollector, RayCollector, rpc_collectors.AsyncBatchedCollector,
]


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls.__init__).parameters)


def _default(parameter: inspect.Parameter) -> object:
    """The parameter's default as the table writes it: required is ``MISSING``, TorchRL's ``Collector`` class "single"."""
    if parameter.default is inspect.Parameter.empty:
        return dataclasses.MISSING
    return "single" if parameter.name == "collector_class" and parameter.default is Collector else parameter.default


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda cls: cls.__name__)
def test_every_option_of_a_constructor_has_the_tables_name_and_default(cls):
    parameters = _parameters(cls)
    held = [name for name in parameters if name in options.TABLE and name not in options.OTHER_MEANING.get(cls.__name__, ())]
    assert len(held) >= 6, held
    wrong = {name: (_default(parameters[name]), options.default(name, cls.__name__)) for name in held
             if _default(parameters[name]) != options.default(name, cls.__name__)}
    assert wrong == {}


def test_each_class_default_and_other_meaning_names_an_option_the_class_takes():
    for table in (options.CLASS_DEFAULTS, options.OTHER_MEANING):
        for class_name, names in table.items():
            cls = next(cls for cls in PUBLIC if cls.__name__ == class_name)
            assert set(names) <= set(_parameters(cls)) & set(options.TABLE), class_name


RPC_ONLY = {"visible_devices", "tensorpipe_options"}  # TorchRL's RPC keywords, taken by the classes of its RPC path


# each class's parameters beyond its front's options (TorchRL's own), and those it leaves out
SPELLED_OUT = {
    rpc_collectors.MultiCollector: ({"num_workers"}, RPC_ONLY),
    rpc_collectors.MultiSyncCollector: ({"num_workers"}, RPC_ONLY | {"sync"}),  # the class is the choice
    rpc_collectors.MultiAsyncCollector: ({"num_workers"}, RPC_ONLY | {"sync"}),
    rpc_collectors.AsyncCollector: ({"num_sub_threads"}, RPC_ONLY | {"sync", "num_collectors"}),  # one worker
    rpc_collectors.DistributedCollector: ({"update_interval"}, set()),
    rpc_collectors.DistributedSyncCollector: ({"update_interval"}, {"sync"}),
}


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda cls: cls.__name__)
def test_no_constructor_forwards_keywords(cls):
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in _parameters(cls).values())


@pytest.mark.parametrize("cls", list(SPELLED_OUT), ids=lambda cls: cls.__name__)
def test_classes_on_the_front_spell_out_every_option_they_take(cls):
    """Every parameter of ``RPCCollector`` (the local classes: but its RPC-only ones), with TorchRL's own of the class."""
    added, left_out = SPELLED_OUT[cls]
    assert set(_parameters(cls)) == set(_parameters(rpc_collectors.RPCCollector)) - left_out | added
    assert list(_parameters(cls))[:3] == ["self", "create_env_fn", "policy"]


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda cls: cls.__name__)
def test_every_parameter_is_documented_by_the_table_or_its_class(cls):
    """An option of the table has its doc there; any other parameter is named in the class's docstring."""
    doc = inspect.getdoc(cls)
    undocumented = [name for name in _parameters(cls) if name != "self" and name not in options.TABLE
                    and not re.search(rf"\b{name}\b", doc)]
    assert undocumented == []


def test_every_option_has_a_one_line_doc_and_one_group():
    names = [f.name for group in options.GROUPS for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)) == len(options.TABLE)
    for name in names:
        assert options.doc(name) and "\n" not in options.doc(name), name


class _Buffer:
    """A replay buffer that takes batches and steps."""

    def extend(self, batch: object) -> None: ...

    def add(self, step: object) -> None: ...


@pytest.mark.parametrize(("group", "arguments", "error", "words"), [
    (options.Run, {"sync": "yes"}, TypeError, "sync='yes' is invalid; accepted: True or False"),
    (options.Run, {"cat_results": 1}, ValueError, "cat_results=1 is invalid; accepted: 'stack', 0, -1"),
    (options.Weights, {"max_weight_update_interval": -2}, ValueError, "max_weight_update_interval=-2 is invalid; accepted: -1"),
    (options.Launch, {"rpc_timeout": 0}, ValueError, "rpc_timeout=0 is invalid"),
    (options.Launch, {"num_collectors": 0}, ValueError, "num_collectors=0 is invalid; accepted: an int > 0"),
    (options.Batches, {"frames_per_batch": 0}, ValueError, "frames_per_batch=0 is invalid; accepted: an int > 0"),
    (options.Batches, {"frames_per_batch": [5, 0]}, ValueError, "frames_per_batch[1]=0 is invalid"),
    (options.Batches, {"frames_per_batch": 5, "total_frames": 0}, ValueError, "total_frames=0 is invalid"),
    (options.Batches, {"frames_per_batch": 5, "split_trajs": "yes"}, TypeError, "split_trajs='yes' is invalid"),
    (options.Batches, {"frames_per_batch": 5, "postproc": 3}, TypeError, "postproc=3 is not callable"),
    (options.Batches, {"frames_per_batch": 5, "replay_buffer": 3}, TypeError, "replay_buffer=3 has no extend()"),
    (options.Batches, {"frames_per_batch": 5, "extend_buffer": False, "replay_buffer": _Buffer(), "postproc": len},
     ValueError, "extend_buffer=False adds each step"),
    (options.Batches, {"frames_per_batch": 5, "trajs_per_batch": 0}, ValueError, "trajs_per_batch=0 is invalid"),
    (options.Batches, {"frames_per_batch": 5, "traj_format": "cat"}, ValueError, "traj_format='cat' needs trajs_per_batch"),
    (options.Batches, {"frames_per_batch": 5, "replay_write_mode": "trajectory"}, ValueError, "which needs a replay_buffer"),
    (options.Batches, {"frames_per_batch": 5, "trajs_per_write": 2}, ValueError, "trajs_per_write=2 sets how many"),
])
def test_a_group_checks_its_options_when_built(group, arguments, error, words):
    with pytest.raises(error, match=re.escape(words)):
        group.given(arguments)


@pytest.mark.parametrize("name", sorted(options.TABLE))
def test_every_option_but_those_checked_elsewhere_is_refused_by_its_group_when_nonsense(name):
    """A value no option takes (an ``object()``) is refused, naming the option, when its group is
    built: before the collector reads the envs or a worker starts. At most 8 options wait for what
    only the collector knows (:data:`~rpc_collectors.core.options.CHECKED_ELSEWHERE`)."""
    group = next(group for group in options.GROUPS if name in {f.name for f in dataclasses.fields(group)})
    arguments = {"frames_per_batch": 5} if group is options.Batches else {}
    arguments[name] = object()
    if name in options.CHECKED_ELSEWHERE:
        group.given(arguments)
        return
    with pytest.raises((TypeError, ValueError), match=re.escape(name)):
        group.given(arguments)


def test_few_options_are_checked_outside_the_table():
    assert len(options.CHECKED_ELSEWHERE) <= 8 and set(options.CHECKED_ELSEWHERE) <= set(options.TABLE)


@pytest.mark.parametrize(("arguments", "words"), [
    ({"sync": True, "max_policy_lag": 1}, "max_policy_lag=1 applies to async collection"),
    ({"sync": False, "preemptive_threshold": 0.5}, "accepted with sync=False: None"),
    ({"max_policy_lag": -1, "sync": False}, "max_policy_lag=-1 is invalid"),
])
def test_a_run_checks_the_options_that_read_sync(arguments, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        options.Run.given(arguments)


def test_batches_read_torchrl_spellings_as_the_collectors_do():
    batches = options.Batches(frames_per_batch=(3, 4), split_trajs=None)
    assert batches.frames_per_batch == [3, 4] and batches.split_trajs is False
    assert batches.replay_write_mode == "rollout" and batches.traj_format == "padded"


def test_a_groups_warning_points_at_the_users_line():
    with pytest.warns(FutureWarning, match="traj_format is not") as record:
        options.Batches(frames_per_batch=5, trajs_per_batch=2)
    assert [w.filename for w in record] == [__file__]


def test_groups_are_frozen_and_keep_what_they_were_given():
    built = options.Options.given({"frames_per_batch": [10, 20], "sync": False, "rpc_timeout": 5, "unrelated": 1})
    assert built.batches.frames_per_batch == [10, 20] and built.run.sync is False and built.launch.rpc_timeout == 5.0
    assert built.collect.exploration_type is options.TABLE["exploration_type"].default
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.run.sync = True  # type: ignore[misc]
