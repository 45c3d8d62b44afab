"""``AsyncCollector``, TorchRL 0.14's one collector in a background process."""
from __future__ import annotations

import os

import pytest
import torch

from conftest import CountEnv
from rpc_collectors import AsyncCollector, GymEnv, MultiAsyncCollector
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120)]


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def test_one_worker_process_yields_its_batches():
    with AsyncCollector(count_env, BiasPolicy(1, size=3), frames_per_batch=10, total_frames=30) as c:
        assert isinstance(c, MultiAsyncCollector) and c.num_workers == 1 and not c.sync
        assert c.infos[0]["pid"] != os.getpid()
        batches = list(c)
        assert c.last_batch.worker_frames == {0: 10}
    assert [b.shape for b in batches] == [(10,)] * 3
    assert all((b["action"] == 1).all() for b in batches)
    # one env stepped on from batch to batch: its episode counter never jumps or goes back
    episodes = torch.cat([b["observation"][:, 1] for b in batches]).diff()
    assert ((episodes == 0) | (episodes == 1)).all() and episodes.sum() > 0


def test_update_at_each_batch_pushes_the_trainers_weights_without_a_call():
    policy = BiasPolicy(0, size=3)
    with AsyncCollector(count_env, policy, frames_per_batch=10, total_frames=-1, update_at_each_batch=True) as c:
        assert (c.next()["action"] == 0).all()
        policy.set_action(1)  # no update_policy_weights_: the worker is asked again only after a push
        batch = c.next()
    assert (batch["action"] == 1).all() and c.policy_version == 1


def test_policy_factory_and_pushed_weights():
    from tensordict import TensorDict

    with AsyncCollector(count_env, policy_factory=lambda: BiasPolicy(0, size=3), frames_per_batch=10,
                        total_frames=-1) as c:
        assert (c.next()["action"] == 0).all()
        c.update_policy_weights_(TensorDict.from_module(BiasPolicy(1, size=3)).lock_())
        batches = [c.next() for _ in range(3)]  # the one in flight at the push may hold the old weights
    assert (batches[-1]["action"] == 1).all()


def test_torchrl_arguments_it_refuses_name_themselves():
    with pytest.raises(ValueError, match="num_sub_threads=2 is not supported"):
        AsyncCollector(count_env, None, frames_per_batch=10, num_sub_threads=2)
