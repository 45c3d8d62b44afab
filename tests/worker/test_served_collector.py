"""Both collectors a worker serves meet the one interface its server uses
(:class:`~rpc_collectors.worker.served_collector.ServedCollector`): a plain worker's
``SingleCollector`` and a node's ``NodeCollector``, each member defined with the declared
signature. Checked in the trainer's process (debug launcher: no worker processes)."""
from __future__ import annotations

import inspect

import pytest

from conftest import CountEnv
from rpc_collectors import RPCCollector
from rpc_collectors.worker.node import NodeCollector
from rpc_collectors.worker.served_collector import ServedCollector
from rpc_collectors.worker.single import SingleCollector

pytestmark = pytest.mark.timeout(60)
IMPLEMENTATIONS = (SingleCollector, NodeCollector)


def declared() -> set[str]:
    """The members the interface declares: its methods and properties, and its annotated attributes."""
    return {name for name in [*vars(ServedCollector), *ServedCollector.__annotations__] if not name.startswith("_")}


def test_a_node_and_its_local_workers_collectors_are_served_collectors():
    with RPCCollector(CountEnv, None, frames_per_batch=8, launcher="debug", num_collectors=1,
                      collector_class="sync", num_workers_per_collector=2) as c:
        node = c.workers.states[0].collector
        assert type(node) is NodeCollector and isinstance(node, ServedCollector)
        local = [state.collector for state in node.local.workers.states.values()]
        assert [type(x) for x in local] == [SingleCollector] * 2
        assert all(isinstance(x, ServedCollector) for x in local)
        assert next(iter(c)).numel() == 8


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("name", sorted(n for n in declared() if inspect.isfunction(vars(ServedCollector).get(n))))
def test_every_declared_method_is_defined_with_its_declared_parameters(cls, name):
    """The declared parameters come first, as declared; an implementation's own ones have defaults."""
    shape = lambda params: [(p.name, p.kind, p.default) for p in params]  # noqa: E731
    want = list(inspect.signature(getattr(ServedCollector, name)).parameters.values())
    got = list(inspect.signature(getattr(cls, name)).parameters.values())
    assert shape(got[:len(want)]) == shape(want)
    assert all(p.default is not inspect.Parameter.empty for p in got[len(want):])


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda cls: cls.__name__)
def test_every_declared_property_is_one(cls):
    properties = [n for n in declared() if isinstance(vars(ServedCollector).get(n), property)]
    assert properties and all(isinstance(inspect.getattr_static(cls, n), property) for n in properties)
