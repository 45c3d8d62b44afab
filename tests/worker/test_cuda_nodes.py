"""Node inference on a node's GPU (``inference="node"``, ``policy_device="cuda"``): only on machines with CUDA.

Each node runs the one policy of its local workers on the GPU; the trainer's weights land in it,
and its actions reach every local worker's batch in host memory.
"""
from __future__ import annotations

import pytest
import torch

from rpc_collectors import RPCCollector
from test_cuda import ran_on_gpu, set_action, where_policy
from test_weight_updates import VERSION, count_env

pytestmark = [
    pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_sync_nodes_policies_on_the_gpu_act_with_each_pushed_version():
    policy = where_policy(0)
    with RPCCollector(count_env, policy, num_collectors=2, frames_per_batch=2 * 2 * 10, launcher="local",
                      collector_class="sync", num_workers_per_collector=2, track_policy_version=True,
                      inference="node", policy_device="cuda") as c:
        assert [info["inference"] for info in c.infos] == ["node", "node"]
        batches = [c.next()]
        for action in (1, 0):
            set_action(policy, action)
            c.update_policy_weights_()
            batches.append(c.next())
    for version, (batch, action) in enumerate(zip(batches, (0, 1, 0))):
        assert batch[VERSION].unique().tolist() == [version], f"batch {version} holds other weights' frames"
        assert (batch["action"] == action).all() and ran_on_gpu(batch)


def test_async_nodes_policies_on_the_gpu_act_with_the_pushed_weights_from_their_next_batch():
    policy = where_policy(0)
    with RPCCollector(count_env, policy, num_collectors=2, frames_per_batch=20, launcher="local", sync=False,
                      collector_class="async", num_workers_per_collector=2, track_policy_version=True,
                      inference="node", policy_device="cuda") as c:
        first = c.next()
        set_action(policy, 1)
        c.update_policy_weights_()
        later = [c.next() for _ in range(8)]
    assert (first["action"] == 0).all() and ran_on_gpu(first)
    whole = torch.cat(later)
    # a node's answer already on its way may hold the old weights; every frame chosen by the new ones takes action 1
    assert torch.equal(whole["action"], whole[VERSION]) and ran_on_gpu(whole) and (whole[VERSION] == 1).any()
