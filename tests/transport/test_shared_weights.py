"""``weight_transport="shared"`` (what TorchRL's ``SharedMemWeightSyncScheme`` maps onto): the
trainer's policy and every worker's are one memory. An in-place change of the trainer's policy
(an optimizer step, ``p.data += ...``) reaches the workers without a push; a push raises the
version, copies given weights into that memory (the trainer's policy gets them too), shares
replaced parameters again, and goes to every worker or none; a replaced worker process shares it
too; where it cannot hold, the collector refuses before any process starts."""
from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from conftest import CountEnv
from procs import descendants
from rpc_collectors import GymEnv, MultiAsyncCollector, MultiSyncCollector, WorkerRestartWarning
from rpc_collectors.core import worker_checks
from rpc_collectors.trainer.weight_pushes import SHARED_BY_ALL
from rpc_collectors.transport.weights import FlatWeights
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.timeout(180)]

VERSION = ("collector", "policy_version")


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def batches_until(c, action: int, tries: int = 8):
    """The first batch whose every action is ``action`` (batches begun before a change may hold the
    old one); fails after ``tries``."""
    for _ in range(tries):
        batch = c.next()
        if (batch["action"] == action).all():
            return batch
    raise AssertionError(f"no batch of action {action} in {tries}")


def test_shared_tensors_keep_their_objects_and_alias_the_buffer():
    policy = BiasPolicy(1, size=3)
    weight, flat = policy.linear.weight, FlatWeights(policy)
    buffer = flat.new_buffer()
    flat.pack(buffer)
    assert not flat.shares(buffer)
    flat.share(buffer)
    assert flat.shares(buffer) and policy.linear.weight is weight  # an optimizer's references stay valid
    with torch.no_grad():
        policy.linear.bias.copy_(torch.tensor([5.0, 6.0]))
    assert torch.equal(flat.views(buffer)[0], torch.tensor([5.0, 6.0]))  # ("linear", "bias") first by key
    policy.load_state_dict({"linear.weight": torch.ones(2, 3), "linear.bias": torch.zeros(2)}, assign=True)
    assert not flat.shares(buffer)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls", [MultiSyncCollector, MultiAsyncCollector])
def test_the_trainers_policy_is_the_workers_memory(cls):
    policy = BiasPolicy(0, size=3)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    with cls([count_env] * 2, policy, frames_per_batch=20, total_frames=-1, weight_transport="shared",
             track_policy_version=True) as c:
        assert c.weights.spec.kind == "shared" and (c.next()["action"] == 0).all()
        # an optimizer step on the trainer reaches the workers, with no push
        optimizer.zero_grad()
        policy.linear.bias.grad = torch.tensor([1.0, -1.0])
        optimizer.step()
        batch = batches_until(c, 1)
        assert c.policy_version == 0 and (batch[VERSION] == 0).all()
        for i in range(2):
            held = c.state_dict()[f"worker{i}"]["policy_state_dict"]
            assert all(torch.equal(held[k], v) for k, v in policy.state_dict().items())
        # given weights go into that memory: the trainer's policy holds them too
        c.update_policy_weights_(BiasPolicy(0, size=3).state_dict())
        assert torch.equal(policy.linear.bias.detach(), torch.tensor([1.0, 0.0])) and c.policy_version == 1
        batch = batches_until(c, 0)
        assert (batch[VERSION] <= 1).all()
        # replaced parameters are shared again by the next push
        policy.load_state_dict(BiasPolicy(1, size=3).state_dict(), assign=True)
        c.update_policy_weights_()
        batches_until(c, 1)
        policy.set_action(0)
        batches_until(c, 0)
        assert c.policy_version == 2
        # one memory: a push goes to every worker or none
        for kwargs in ({"worker_ids": [0]}, {"policy_or_weights": {0: BiasPolicy(1, size=3).state_dict()}}):
            with pytest.raises(ValueError, match=SHARED_BY_ALL.replace("(", r"\(").replace(")", r"\)")):
                c.update_policy_weights_(**kwargs)
        # a refused push changes no worker's weights (an async worker's batch begun before
        # ``set_action(0)`` may still hold action 1: the next whole batch of 0 is the check)
        assert c.policy_version == 2
        for i in range(2):
            held = c.state_dict()[f"worker{i}"]["policy_state_dict"]
            assert all(torch.equal(held[k], v) for k, v in policy.state_dict().items())
        batches_until(c, 0)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_replaced_worker_shares_the_trainers_policy_too():
    policy = BiasPolicy(0, size=3)
    with MultiSyncCollector([count_env] * 2, policy, frames_per_batch=20, total_frames=-1, weight_transport="shared",
                            max_worker_restarts=1, rpc_timeout=30) as c:
        c.next()
        pid = c.infos[1]["pid"]
        os.kill(pid, 9)
        deadline = time.monotonic() + 120  # a loaded machine replaces it slowly
        with pytest.warns(WorkerRestartWarning):
            while c.worker_restarts != [0, 1] and time.monotonic() < deadline:
                c.next()
        assert c.worker_restarts == [0, 1] and c.infos[1]["pid"] != pid
        policy.set_action(1)
        batch = batches_until(c, 1)
        assert batch.shape[0] == 2  # both workers, the new one too


def test_node_collectors_are_refused_before_any_process_starts():
    before = descendants()
    words = "weight_transport='shared' (SharedMemWeightSyncScheme) does not work with node collectors (collector_class='sync')"
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        MultiSyncCollector([count_env] * 2, nn.Linear(3, 2), frames_per_batch=20, weight_transport="shared",
                           collector_class="sync", num_workers_per_collector=2)
    assert descendants() == before


def test_policies_off_the_cpu_are_refused():
    """Checked with the other options (this machine refuses CUDA devices before it)."""
    listed = r"\[device\(type='cpu'\), device\(type='cuda'"
    with pytest.raises(ValueError, match=r"needs the workers' policies on the CPU, not " + listed):
        worker_checks.shared_weights("shared", "single", False, [torch.device("cpu"), torch.device("cuda", 0)])
    worker_checks.shared_weights("shared", "single", False, [torch.device("cpu"), None])
    policy = BiasPolicy(0, size=3).to("meta")
    with pytest.raises(ValueError, match="a policy on meta cannot share its memory"):
        FlatWeights(policy).share(torch.empty(0, dtype=torch.uint8))
