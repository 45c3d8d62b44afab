"""The front's parts own their state and are given what they use: none holds the front, none of the
trainer's protocols names a private member, and the front itself keeps few attributes."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import rpc_collectors.trainer
from conftest import CountEnv
from rpc_collectors import MultiAsyncCollector
from rpc_collectors.core import options
from rpc_collectors.single_process.base_collector import BaseCollector
from rpc_collectors.trainer.batch_slots import BatchSlots
from rpc_collectors.trainer.continuity import Continuity
from rpc_collectors.trainer.recovery import Recovery
from rpc_collectors.trainer.saved_state import SavedState
from rpc_collectors.trainer.schedule import Schedule
from rpc_collectors.trainer.waits import Waits

pytestmark = pytest.mark.timeout(60)

PARTS = (Schedule, Recovery, Continuity, SavedState, BatchSlots, Waits)
# what a part tells the front: the only bound methods of the front a part may hold
CALLBACKS = {"fail", "admitted", "left", "delivered_frames", "require_running", "recover"}
MOST_ATTRIBUTES = 25


@pytest.fixture
def front():
    collector = MultiAsyncCollector([CountEnv] * 2, None, frames_per_batch=4, total_frames=16, launcher="debug",
                                    max_policy_lag=1)
    try:
        yield collector
    finally:
        collector.shutdown()


def _base_attributes() -> set[str]:
    """The attributes :class:`BaseCollector` sets on every collector, the front's included."""
    base = BaseCollector.__new__(BaseCollector)
    BaseCollector.__init__(base, options.Batches.given({"frames_per_batch": 4, "total_frames": 16}))
    return set(vars(base))


def test_the_front_keeps_at_most_25_attributes_of_its_own(front):
    own = set(vars(front)) - _base_attributes()
    assert len(own) <= MOST_ATTRIBUTES, sorted(own)
    assert {"plan", "roster", "schedule", "recovery", "continuity", "pusher", "waits", "slots"} <= own


def test_no_part_holds_the_front_only_the_callbacks_it_tells_it_with(front):
    parts = [value for value in vars(front).values() if isinstance(value, PARTS)]
    assert {type(part) for part in parts} == set(PARTS)
    for part in parts:
        for name, value in vars(part).items():
            assert value is not front, f"{type(part).__name__}.{name} is the front"
            if getattr(value, "__self__", None) is front:
                assert name in CALLBACKS, f"{type(part).__name__}.{name} is the front's {value.__name__}"


def test_the_parts_run_the_front_batches_drops_and_state(front):
    batches = list(front)
    assert sum(batch.numel() for batch in batches) == 16
    state = front.state_dict()
    front.load_state_dict(state)
    assert front.schedule.plan is front.plan and front.continuity.max_policy_lag == 1


def test_no_protocol_of_the_trainer_names_a_private_member():
    named = []
    for path in Path(inspect.getfile(rpc_collectors.trainer)).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(getattr(base, "id", "") == "Protocol" for base in node.bases):
                for item in node.body:
                    target = getattr(item, "target", None)
                    name = getattr(target, "id", None) or getattr(item, "name", "")
                    if name.startswith("_") and not name.startswith("__"):
                        named.append(f"{path.name}:{node.name}.{name}")
    assert named == []
