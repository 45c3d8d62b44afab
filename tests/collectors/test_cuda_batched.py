"""``AsyncBatchedCollector`` with its policy on a GPU (``device="cuda"``): only on machines with CUDA.

The env workers step on the CPU; the one policy runs in the trainer's process on the GPU, and its
actions and other outputs come back to the envs and the batches in host memory.
"""
from __future__ import annotations

import pytest
import torch

from rpc_collectors import AsyncBatchedCollector
from test_cuda import ran_on_gpu, set_action, where_policy
from test_weight_updates import count_env

pytestmark = [
    pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("envs", [1, 4])
def test_a_policy_on_the_gpu_acts_for_every_env_with_the_weights_of_its_version(envs):
    """Each frame's action is the one its stamped weights version chooses: version 0 and 2 take
    action 0, version 1 action 1 (given as a module, then the policy passed in trained in place)."""
    policy = where_policy(0)
    with AsyncBatchedCollector([count_env] * envs, policy=policy, device="cuda", frames_per_batch=16,
                               total_frames=-1) as c:
        assert all(p.device.type == "cuda" for p in c.policy.module.parameters())
        first = c.next()
        assert (first["action"] == 0).all() and ran_on_gpu(first) and first["action"].device.type == "cpu"
        c.update_policy_weights_(where_policy(1))
        after = [c.next() for _ in range(3)]
        set_action(policy, 0)  # the trainer's policy, trained in place: re-read into the one on the GPU
        c.update_policy_weights_()
        after += [c.next() for _ in range(3)]
        assert c.policy_version == 2
    whole = torch.cat(after)
    assert torch.equal(whole["action"], whole["policy_version"] % 2) and ran_on_gpu(whole)
    assert (after[2]["policy_version"] == 1).any() and (after[-1]["policy_version"] == 2).any()
