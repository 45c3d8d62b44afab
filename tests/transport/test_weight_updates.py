"""A weight update is all or nothing: every form of ``update_policy_weights_`` (a module, a
TensorDict, a state dict, the trainer's policy, TorchRL's per-worker ``{worker_id: weights}``,
``worker_ids=``) is checked whole first, on every collector kind. A bad one (a good entry next to
a wrong one, a bad second worker entry, an unknown worker id) raises and leaves every policy,
``policy_version``, each worker's version and the versions stamped on the next frames as they
were; a good one after it applies whole."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from conftest import CountEnv
from rpc_collectors import AsyncBatchedCollector, Collector, GymEnv, MultiSyncCollector
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leftover_processes")]

VERSION = ("collector", "policy_version")


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def bias_weights(action: int) -> dict:
    """A state dict of ``BiasPolicy(action, size=3)``: every action it takes is ``action``."""
    return {key: value.detach().clone() for key, value in BiasPolicy(action, size=3).state_dict().items()}


OLD, GOOD = bias_weights(0), bias_weights(1)
# each holds one entry that would change the policy (its weight, or its bias) next to a wrong one
BAD = {
    "shape": {"linear.weight": torch.tensor([[-1.0] * 3, [1.0] * 3]), "linear.bias": torch.zeros(3)},
    "dtype": {"linear.weight": torch.zeros(2, 3, dtype=torch.float64), "linear.bias": GOOD["linear.bias"]},
    "extra": {**GOOD, "linear.scale": torch.ones(2)},
}
MESSAGES = {"shape": r"'linear', 'bias'\) is torch.float32 \[3\]", "dtype": r"'linear', 'weight'\) is torch.float64",
            "extra": r"'linear', 'scale'\) is torch.float32 \[2\], the policy has absent"}


def module_of(state: dict) -> nn.Module:
    """A module holding exactly the tensors of ``state``."""
    root = nn.Module()
    for key, value in state.items():
        *path, name = key.split(".")
        owner = root
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(name, nn.Parameter(value.clone(), requires_grad=False))
    return root


FORMS = {
    "module": module_of,
    "tensordict": lambda state: TensorDict.from_module(module_of(state)).lock_(),
    "state_dict": dict,
}


def version_key(c) -> object:
    return c.policy_version_key if isinstance(c, AsyncBatchedCollector) else VERSION


def state(c, policy: nn.Module | None) -> dict:
    """What a failed update must leave alone: the trainer-side policy's tensors, the versions."""
    weights = getattr(c, "weights", None)
    return {
        "params": None if policy is None else {k: v.clone() for k, v in policy.state_dict().items()},
        "policy_version": c.policy_version,
        "worker_versions": None if weights is None else [record.weights_version for record in c.roster],
    }


def batch_at(c, version: int, action: int) -> None:
    """The next batch's frames: every one stamped ``version`` was chosen by weights taking ``action``
    (an AsyncBatchedCollector's batch may still hold frames chosen just before; a few batches at most)."""
    key = version_key(c)
    for _ in range(5):
        batch = c.next()
        versions = batch.get(key)
        assert versions.max() <= version
        assert (batch["action"][versions == version] == action).all()
        if (versions == version).all():
            return
        assert not isinstance(c, (Collector, MultiSyncCollector)), f"a frame of {c} is older than {version}"
    raise AssertionError(f"no batch all at version {version} after 5")


def refused_then_whole(c, policy: nn.Module | None, bad, good, match: str) -> None:
    """``bad()`` raises and changes nothing; ``good()`` afterwards takes the version one up, whole."""
    batch_at(c, 0, 0)
    before = state(c, policy)
    with pytest.raises((ValueError, TypeError), match=match):
        bad()
    assert _same(state(c, policy), before)
    batch_at(c, before["policy_version"], 0)  # the frames after it: the old weights, the old version
    good()
    assert c.policy_version == before["policy_version"] + 1
    if before["worker_versions"] is not None:
        assert [record.weights_version for record in c.roster] == [before["policy_version"] + 1] * len(before["worker_versions"])
    batch_at(c, before["policy_version"] + 1, 1)
    if policy is not None:
        assert all(torch.equal(policy.state_dict()[k], GOOD[k]) for k in GOOD)


def _same(now: dict, before: dict) -> bool:
    if now["policy_version"] != before["policy_version"] or now["worker_versions"] != before["worker_versions"]:
        return False
    if before["params"] is None:
        return now["params"] is None
    return now["params"].keys() == before["params"].keys() and all(
        torch.equal(now["params"][k], before["params"][k]) for k in before["params"])


def collector(kind: str) -> tuple:
    """A collector of ``kind`` on CountEnv taking action 0, and the trainer-side policy it changes (or None)."""
    if kind == "collector":
        policy = BiasPolicy(0, size=3)
        return Collector(count_env, policy, frames_per_batch=10, track_policy_version=True), policy
    if kind == "async_batched":
        policy = BiasPolicy(0, size=3)
        return AsyncBatchedCollector([count_env] * 2, policy=policy, frames_per_batch=10), policy
    if kind == "multi":  # the trainer's policy is the weights' layout; the workers hold copies
        return MultiSyncCollector([count_env] * 2, BiasPolicy(0, size=3), frames_per_batch=20,
                                  track_policy_version=True), None
    # the workers build their policies: the first push lays the weights out
    return MultiSyncCollector([count_env] * 2, policy_factory=left_policy, frames_per_batch=20,
                              track_policy_version=True), None


def left_policy() -> BiasPolicy:
    return BiasPolicy(0, size=3)


def kinds(*names: str) -> list:
    """``names``, those with worker processes marked so."""
    return [pytest.param(n, marks=pytest.mark.multiprocess) if n != "collector" else n for n in names]


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("kind", kinds("collector", "async_batched", "multi"))
def test_an_update_with_one_wrong_entry_changes_nothing(kind, form, bad):
    c, policy = collector(kind)
    try:
        refused_then_whole(c, policy, lambda: c.update_policy_weights_(FORMS[form](BAD[bad])),
                           lambda: c.update_policy_weights_(FORMS[form](GOOD)), MESSAGES[bad])
    finally:
        c.shutdown()


PER_WORKER = {  # (bad update, its error) for two workers
    "second entry bad": (lambda c: c.update_policy_weights_({0: GOOD, 1: BAD["shape"]}),
                         r"policy_or_weights\[1\]: weight \('linear', 'bias'\)"),
    "unknown worker id": (lambda c: c.update_policy_weights_({0: GOOD, 2: GOOD}), r"worker_ids=\[0, 2\] is invalid"),
    "unknown worker_ids": (lambda c: c.update_policy_weights_(GOOD, worker_ids=[0, 2]), r"worker_ids=\[0, 2\]"),
    "worker_ids with per-worker weights": (lambda c: c.update_policy_weights_({0: GOOD, 1: GOOD}, worker_ids=[0]),
                                           "with weights per worker"),
}


@pytest.mark.parametrize("case", sorted(PER_WORKER))
@pytest.mark.parametrize("kind", kinds("multi", "multi_factory"))
def test_a_per_worker_update_with_a_bad_entry_changes_no_worker(kind, case):
    c, policy = collector(kind)
    bad, match = PER_WORKER[case]
    try:
        refused_then_whole(c, policy, lambda: bad(c), lambda: c.update_policy_weights_({0: GOOD, 1: GOOD}), match)
    finally:
        c.shutdown()


@pytest.mark.parametrize("kind", kinds("collector", "async_batched"))
def test_one_policy_takes_no_weights_for_a_second_worker(kind):
    """A single-process collector has one policy, worker 0's: ``{0: w, 1: w}`` names a worker it has not."""
    c, policy = collector(kind)
    try:
        refused_then_whole(c, policy, lambda: c.update_policy_weights_({0: GOOD, 1: GOOD}),
                           lambda: c.update_policy_weights_({0: GOOD}), r"worker_ids=\[0, 1\] is invalid")
    finally:
        c.shutdown()


@pytest.mark.multiprocess
def test_the_trainers_policy_of_another_layout_is_not_pushed():
    """``update_policy_weights_()`` pushes the trainer's policy: changed to another dtype, it is refused whole."""
    trainer = BiasPolicy(0, size=3)
    c = MultiSyncCollector([count_env] * 2, trainer, frames_per_batch=20, track_policy_version=True)

    def bad() -> None:
        trainer.linear.bias = nn.Parameter(torch.tensor([0.0, 1.0], dtype=torch.float64))
        c.update_policy_weights_()

    def good() -> None:
        trainer.linear.bias = nn.Parameter(GOOD["linear.bias"].clone())
        c.update_policy_weights_()

    try:
        refused_then_whole(c, None, bad, good, r"weight \('linear', 'bias'\) is torch.float64 \[2\]")
    finally:
        c.shutdown()


@pytest.mark.parametrize("loaded", [True, False])
def test_weights_a_worker_received_before_it_loaded_a_state_are_not_applied_after_it(loaded):
    """An async worker may take a push, then a saved state (older weights and version) before its
    next batch: that batch and the later ones collect with the loaded weights, not the push's."""
    from types import SimpleNamespace

    from rpc_collectors.transport.weight_sync import TransportSpec, WeightReceiver
    from rpc_collectors.transport.weights import FlatWeights

    policy, pushed = nn.Linear(2, 1), nn.Linear(2, 1)
    with torch.no_grad():
        policy.weight.fill_(1.0)
        pushed.weight.fill_(7.0)
    flat = FlatWeights(policy)
    receiver = WeightReceiver(TransportSpec("rpc", flat.nbytes), flat, 1)
    payload = flat.new_buffer()
    FlatWeights(pushed).pack(payload)
    receiver.receive(1, "rpc", payload)
    collector = SimpleNamespace(policy_version=0)  # the state it loads: version 0, weights of 1.0
    if loaded:
        receiver.superseded()
    receiver.apply(collector, 1, timeout=5)
    expected = 1.0 if loaded else 7.0
    assert (policy.weight == expected).all() and collector.policy_version == (0 if loaded else 1)
