"""``AsyncBatchedCollector`` against TorchRL 0.14.1's class of that name, on the same envs.

Runs where ``torchrl`` is installed (``.ci/run`` runs it in its TorchRL venv, as
``tests/collectors/test_torchrl_interop.py``); elsewhere the module is skipped, unless
``RPC_COLLECTORS_REQUIRE_TORCHRL=1`` says it must run.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

if os.environ.get("RPC_COLLECTORS_REQUIRE_TORCHRL"):
    import torchrl  # noqa: F401  (must be importable: CI runs this module for real)
else:
    pytest.importorskip("torchrl")

from tensordict.nn import TensorDictModule  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl.collectors import AsyncBatchedCollector as TorchRLAsyncBatchedCollector
    from torchrl.envs import GymWrapper

from conftest import CountEnv  # noqa: E402
from rpc_collectors import AsyncBatchedCollector, GymEnv  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(180)]


class OneHotGreedy(nn.Module):
    """One-hot greedy action over two actions, as TorchRL's ``GymEnv`` encodes Discrete(2)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(self.linear(observation).argmax(-1), 2)


def ours_env() -> GymEnv:
    return GymEnv(CountEnv(), categorical_action_encoding=False)


def torchrl_env():
    return GymWrapper(CountEnv())


def layout(batch) -> dict:
    return {key: (tuple(batch.get(key).shape[1:]), batch.get(key).dtype)
            for key in batch.keys(include_nested=True, leaves_only=True)}


def policy() -> TensorDictModule:
    torch.manual_seed(0)
    return TensorDictModule(OneHotGreedy(), in_keys=["observation"], out_keys=["action"])


KWARGS = {"frames_per_batch": 16, "total_frames": 40}


@pytest.fixture(scope="module")
def theirs() -> list:
    collector = TorchRLAsyncBatchedCollector([torchrl_env] * 3, policy=policy(), env_backend="multiprocessing",
                                             transport="driver", **KWARGS)
    try:
        return [b.clone() for b in collector]
    finally:
        collector.shutdown()


@pytest.mark.parametrize("factory", [torchrl_env, ours_env], ids=["the same TorchRL env", "our GymEnv"])
def test_batches_have_torchrls_layout_keys_and_counts(theirs, factory):
    module = policy()
    with AsyncBatchedCollector([factory] * 3, policy=module, **KWARGS) as collector:
        ours = [b.clone() for b in collector]
    assert [b.batch_size for b in ours] == [b.batch_size for b in theirs] == [torch.Size([16])] * 2 + [torch.Size([8])]
    assert layout(ours[0]) == layout(theirs[0])
    for batches in (ours, theirs):
        whole = torch.cat([b.to_tensordict() if hasattr(b, "to_tensordict") else b for b in batches])
        assert set(whole["env_index"].tolist()) == {0, 1, 2}
        assert (whole["policy_version"] == 0).all()
        assert not whole["done"].any()
        # the same policy on the same env: the one-hot action each observation gets is the same
        with torch.no_grad():
            expected = module.module(whole["observation"])
        assert torch.equal(whole["action"], expected)
    whole = torch.cat(ours)
    for env in range(3):  # each env's own sequence of steps, as the env gave it
        steps = whole[whole["env_index"] == env]
        going_on = ~steps["next", "done"][:-1, 0]
        assert torch.equal(steps["next", "observation"][:-1][going_on], steps["observation"][1:][going_on])
