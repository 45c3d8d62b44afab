"""``AsyncBatchedCollector``'s ``policy_version_key`` names a key of its own: one the collector,
the env or the policy writes is refused before a batch is collected (the collector's keys and
TorchRL's env step names before any process starts), where it used to overwrite actions, env
indices or versions, or fail at the first batch with an index error."""
from __future__ import annotations

import re

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from conftest import CountEnv
from rpc_collectors import AsyncBatchedCollector, GymEnv
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.timeout(120)]


class Marked:
    """An env factory that leaves a file where it ran: if the file is there, a process started."""

    def __init__(self, path) -> None:
        self.path = path

    def __call__(self) -> GymEnv:
        self.path.touch()
        return GymEnv(CountEnv())


@pytest.mark.parametrize("key", ["action", "env_index", "observation", "reward", "done", "truncated", "next",
                                 ("next", "observation"), ("next", "policy_version"), ("action", "version"),
                                 "collector", ("collector", "policy_version")], ids=str)
def test_a_key_the_batch_has_is_refused_before_any_process_starts(key, tmp_path):
    marker = tmp_path / "env-started"
    with pytest.raises(ValueError, match=re.escape(f"policy_version_key={key!r} is a key of the batch already")
                       + ".*accepted: None, or a key of its own"):
        AsyncBatchedCollector([Marked(marker)] * 2, policy=BiasPolicy(0, size=3), frames_per_batch=10,
                              policy_version_key=key)
    assert not marker.exists()


@pytest.mark.parametrize("key", [3, "", (), ("collector", 1), ["collector", "v"]], ids=str)
def test_a_key_that_is_not_one_is_refused(key, tmp_path):
    marker = tmp_path / "env-started"
    with pytest.raises(TypeError, match=r"policy_version_key=.* is not a key; accepted: None, or a str or a tuple of str"):
        AsyncBatchedCollector([Marked(marker)] * 2, policy=BiasPolicy(0, size=3), frames_per_batch=10,
                              policy_version_key=key)
    assert not marker.exists()


@pytest.mark.parametrize("key", ["_version", ("versions", "_policy")], ids=str)
def test_a_private_key_which_batches_drop_is_refused(key, tmp_path):
    marker = tmp_path / "env-started"
    with pytest.raises(ValueError, match="is private"):
        AsyncBatchedCollector([Marked(marker)] * 2, policy=BiasPolicy(0, size=3), frames_per_batch=10,
                              policy_version_key=key)
    assert not marker.exists()


class Logits(nn.Module):
    """BiasPolicy's action and its logits, as two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = BiasPolicy(0, size=3)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.policy.linear(observation)
        return logits.argmax(-1), logits


def logits_policy() -> TensorDictModule:
    return TensorDictModule(Logits(), in_keys=["observation"], out_keys=["action", "logits"])


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_key_the_policy_writes_is_refused_before_a_batch():
    with pytest.raises(ValueError, match="policy_version_key='logits' is a key of the batch already"):
        AsyncBatchedCollector([lambda: GymEnv(CountEnv())] * 2, policy=logits_policy(),
                              frames_per_batch=10, policy_version_key="logits")


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("key", ["version", ("versions", "policy")])
def test_a_key_of_its_own_leaves_every_other_key_as_without_it(key):
    """The same envs and policy with and without the key: the frames of each env agree key for key."""
    batches = {}
    for version_key in (key, None):
        with AsyncBatchedCollector([lambda: GymEnv(CountEnv())] * 2, policy=logits_policy(), frames_per_batch=10,
                                   total_frames=40, policy_version_key=version_key, max_batch_size=1) as c:
            batches[version_key] = torch.cat(list(c))
    keyed, plain = batches[key], batches[None]
    assert (keyed.get(key) == 0).all() and c.last_batch.newest_version == 0
    for env in (0, 1):
        mine, theirs = keyed[keyed["env_index"] == env], plain[plain["env_index"] == env]
        steps = min(len(mine), len(theirs))
        assert steps > 0
        assert set(mine.keys(True, True)) - {key} == set(theirs.keys(True, True))
        for name in theirs.keys(True, True):
            assert torch.equal(mine[:steps].get(name), theirs[:steps].get(name)), name
