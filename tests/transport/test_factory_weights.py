"""Weight pushes to policies the workers build themselves (TorchRL's ``policy_factory``):
``update_policy_weights_(weights)`` with a TensorDict, a state dict or a module, on every
collector class, over every weight transport, with the usual version counting."""
from __future__ import annotations

import pytest
from tensordict import TensorDict
from torch import nn

from conftest import CountEnv
from rpc_collectors import (
    Collector,
    DistributedCollector,
    DistributedSyncCollector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RPCCollector,
)
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]

VERSION = ("collector", "policy_version")


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def left_policy() -> BiasPolicy:
    return BiasPolicy(0, size=3)


def lock_of(module: nn.Module) -> TensorDict:
    """What TorchRL users push: the module's weights as a locked TensorDict."""
    return TensorDict.from_module(module).lock_()


WEIGHTS = {
    "tensordict": lambda action: lock_of(BiasPolicy(action, size=3)),
    "state_dict": lambda action: BiasPolicy(action, size=3).state_dict(),
    "module": lambda action: BiasPolicy(action, size=3),
}


def pushes_reach_the_workers(c, form: str, sync: bool | None = None) -> None:
    """Action 0 as built; each push flips the action and bumps the version, frame by frame."""
    batch = c.next()
    assert (batch["action"] == 0).all() and (batch[VERSION] == 0).all()
    for version, action in [(1, 1), (2, 0), (3, 1)]:
        c.update_policy_weights_(WEIGHTS[form](action))
        assert c.policy_version == version
        if c.sync if sync is None else sync:
            batch = c.next()
        else:  # batches asked for before the push may still come in
            for _ in range(6):
                batch = c.next()
                if (batch[VERSION] == version).all():
                    break
        assert (batch[VERSION] == version).all() and (batch["action"] == action).all()


@pytest.mark.parametrize("form", sorted(WEIGHTS))
def test_single_process_collector(form):
    c = Collector(count_env, policy_factory=left_policy, frames_per_batch=10, track_policy_version=True)
    pushes_reach_the_workers(c, form, sync=True)


@pytest.mark.parametrize("form", sorted(WEIGHTS))
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_multi_collectors(cls, form):
    with cls([count_env] * 2, policy_factory=left_policy, frames_per_batch=20, track_policy_version=True) as c:
        pushes_reach_the_workers(c, form)


@pytest.mark.parametrize("transport", ["shm", "broadcast", "rpc"])
def test_every_transport(transport):
    with RPCCollector(count_env, policy_factory=left_policy, num_collectors=2, frames_per_batch=20, launcher="local",
                      weight_transport=transport, track_policy_version=True) as c:
        pushes_reach_the_workers(c, "tensordict")
        assert c.weights.spec.kind == transport


@pytest.mark.parametrize("cls, sync", [(DistributedCollector, False), (DistributedSyncCollector, True)])
def test_distributed_collectors(cls, sync):
    with cls([count_env] * 2, policy_factory=left_policy, frames_per_batch=20, launcher="mp",
             track_policy_version=True) as c:
        assert c.sync == sync
        pushes_reach_the_workers(c, "tensordict")


def test_node_collectors_pass_the_pushed_weights_to_their_local_workers():
    with RPCCollector(count_env, policy_factory=left_policy, num_collectors=2, frames_per_batch=40, launcher="local",
                      collector_class="sync", num_workers_per_collector=2, cat_results="stack",
                      track_policy_version=True) as c:
        pushes_reach_the_workers(c, "state_dict")


def test_a_subset_of_workers_and_a_push_without_weights_sends_the_last_given():
    with MultiSyncCollector([count_env] * 2, policy_factory=left_policy, frames_per_batch=20,
                            track_policy_version=True) as c:
        c.next()
        c.update_policy_weights_(lock_of(BiasPolicy(1, size=3)), worker_ids=[1])
        batch = c.next()
        assert (batch[0]["action"] == 0).all() and (batch[1]["action"] == 1).all()
        c.update_policy_weights_()  # the weights given last, to every worker
        batch = c.next()
    assert (batch["action"] == 1).all() and (batch[VERSION] == 2).all()


def test_a_push_without_weights_before_any_was_given_is_a_clear_error():
    with MultiSyncCollector([count_env] * 2, policy_factory=left_policy, frames_per_batch=20) as c:
        with pytest.raises(TypeError, match="policy_factory.*no weights were pushed yet"):
            c.update_policy_weights_()
        assert (c.next()["action"] == 0).all()  # the run goes on


def test_weights_of_another_architecture_are_refused_naming_the_tensor():
    with MultiSyncCollector([count_env] * 2, policy_factory=left_policy, frames_per_batch=20) as c:
        with pytest.raises(ValueError, match=r"worker 0: weight \('linear', 'weight'\) is torch.float32 \[2, 4\], "
                                             r"the worker's policy has torch.float32 \[2, 3\]"):
            c.update_policy_weights_(BiasPolicy(1, size=4))
        c.update_policy_weights_(BiasPolicy(1, size=3))  # the right ones still work after
        assert (c.next()["action"] == 1).all() and c.policy_version == 1


def test_a_factory_policy_without_weights_cannot_take_any():
    from test_collector_options import PidPolicy

    with MultiSyncCollector([count_env] * 2, policy_factory=PidPolicy, frames_per_batch=20) as c:
        with pytest.raises(TypeError, match="worker 0's policy has no weights to update"):
            c.update_policy_weights_(lock_of(BiasPolicy(1, size=3)))


def test_policy_and_factory_together_push_the_trainers_policy():
    """As TorchRL's distributed collectors: the workers build theirs, ``policy`` is the weight source."""
    trainer = BiasPolicy(0, size=3)
    with MultiSyncCollector([count_env] * 2, trainer, policy_factory=left_policy, frames_per_batch=20) as c:
        assert (c.next()["action"] == 0).all()
        trainer.set_action(1)
        c.update_policy_weights_()  # no argument: the trainer's policy as it is now
        assert (c.next()["action"] == 1).all()
    with pytest.raises(ValueError, match=r"worker 0: weight \('linear', 'weight'\) is torch.float32 \[2, 4\]"):
        MultiSyncCollector([count_env] * 2, BiasPolicy(0, size=4), policy_factory=left_policy, frames_per_batch=20)
