"""The options table (``rpc_collectors.core.options``) against every public constructor's signature.

Each option a constructor takes that the table holds has the table's name and default (TorchRL's,
per class where TorchRL's classes differ); the ``Multi*`` classes spell out every option they take.
"""
from __future__ import annotations

import dataclasses
import inspect

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
MULTI = [rpc_collectors.MultiCollector, rpc_collectors.MultiSyncCollector, rpc_collectors.MultiAsyncCollector]


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


@pytest.mark.parametrize("cls", MULTI, ids=lambda cls: cls.__name__)
def test_multi_collectors_spell_out_every_option_they_take(cls):
    """No ``**kwargs``: every option of ``RPCCollector`` but its RPC-only ones, and TorchRL's ``num_workers``."""
    parameters = _parameters(cls)
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    expected = set(_parameters(rpc_collectors.RPCCollector)) - {"visible_devices", "tensorpipe_options"} | {"num_workers"}
    if cls is not rpc_collectors.MultiCollector:
        expected -= {"sync"}  # the class is the choice
    assert set(parameters) == expected
    assert list(parameters)[:4] == ["self", "create_env_fn", "policy", "num_workers"]


def test_every_option_has_a_one_line_doc_and_one_group():
    names = [f.name for group in options.GROUPS for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)) == len(options.TABLE)
    for name in names:
        assert options.doc(name) and "\n" not in options.doc(name), name


@pytest.mark.parametrize(("group", "arguments", "error", "words"), [
    (options.Run, {"sync": "yes"}, TypeError, "sync='yes' is invalid; accepted: True or False"),
    (options.Run, {"cat_results": 1}, ValueError, "cat_results=1 is invalid; accepted: 'stack', 0, -1"),
    (options.Weights, {"max_weight_update_interval": -2}, ValueError, "max_weight_update_interval=-2 is invalid; accepted: -1"),
    (options.Launch, {"rpc_timeout": 0}, ValueError, "rpc_timeout=0 is invalid"),
    (options.Launch, {"num_collectors": 0}, ValueError, "num_collectors=0 is invalid; accepted: an int > 0"),
])
def test_a_group_checks_its_options_when_built(group, arguments, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(")):
        group.given(arguments)


def test_groups_are_frozen_and_keep_what_they_were_given():
    built = options.Options.given({"frames_per_batch": [10, 20], "sync": False, "rpc_timeout": 5, "unrelated": 1})
    assert built.batches.frames_per_batch == [10, 20] and built.run.sync is False and built.launch.rpc_timeout == 5.0
    assert built.collect.exploration_type is options.TABLE["exploration_type"].default
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.run.sync = True  # type: ignore[misc]
