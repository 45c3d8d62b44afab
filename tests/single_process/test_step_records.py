"""A worker's batch written straight into its slot (shared memory that held an earlier batch)
holds what the same batch built in fresh tensors holds."""
from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector, GymEnv
from rpc_collectors.transport.data import tensors_by_key


class ActionAndLogits(nn.Module):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 2)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.linear(observation)
        return logits.argmax(-1), logits


def _collector(num_envs: int | None) -> Collector:
    torch.manual_seed(0)
    policy = TensorDictModule(ActionAndLogits(4 if num_envs else 3), in_keys=["observation"],
                              out_keys=["action", "logits"])
    env = GymEnv("CartPole-v1", num_envs=num_envs) if num_envs else GymEnv(CountEnv())
    env.set_seed(3)
    steps = 6
    return Collector(env, policy, frames_per_batch=steps * (num_envs or 1), total_frames=-1, max_frames_per_traj=4,
                     track_policy_version=True)


@pytest.mark.parametrize("num_envs", [None, 3])
def test_a_batch_written_into_a_used_slot_equals_the_batch_built_apart(num_envs):
    apart, into_slot = _collector(num_envs), _collector(num_envs)
    try:
        first = apart.next()
        into_slot.next()
        slot = first.clone().apply(lambda t: torch.ones_like(t))  # what an earlier batch left there
        into_slot.rollout.out = tensors_by_key(slot)
        for _ in range(3):  # episodes end inside these batches (step limit 4 for 6 steps a batch)
            apart.update_policy_weights_()  # the weight versions differ between a batch's first step and the others
            into_slot.update_policy_weights_()
            expected, got = apart.next(), into_slot.next()
            keys = set(expected.keys(True, True))
            assert set(got.keys(True, True)) == keys
            for key in keys:
                assert torch.equal(got[key], expected[key]), key
            # the entries the rollout makes lie in the slot (the worker then copies none of them)
            for key in ["observation", ("next", "observation"), ("next", "reward"), ("next", "done"),
                        ("next", "step_count"), "done", "action", "logits", ("collector", "traj_ids"),
                        ("collector", "policy_version"), "policy_version", ("next", "policy_version")]:
                assert got[key].data_ptr() == slot[key].data_ptr(), key
        assert expected["next", "truncated"].any() or expected["next", "terminated"].any()
        assert expected["policy_version"][..., 0].max() < expected["policy_version"][..., 1].min()
    finally:
        apart.shutdown()
        into_slot.shutdown()


def test_a_vector_envs_steps_of_other_dtypes_are_cast_into_the_slot_as_into_a_fresh_batch():
    import numpy as np

    from rpc_collectors.single_process.step_records import StepRecords

    def records(targets: dict) -> StepRecords:
        rec = StepRecords(targets)
        for t in range(4):  # 2 envs: int flags (0/1), float64 rewards, int64 observations
            rec.obs.append({"observation": np.full((2, 3), t, np.int64)})
            rec.next_obs.append({"observation": np.full((2, 3), t + 1, np.int64)})
            rec.add_outputs({"action": torch.tensor([t % 2, 1 - t % 2])})
            rec.rewards.append(np.array([0.5 * t, -0.5 * t]))
            rec.terminated.append(np.array([t == 3, 0], dtype=np.int64))
            rec.truncated.append(np.array([0, t == 2], dtype=np.int64))
            rec.traj_ids.append(np.array([0, 1]))
        return rec

    shape = torch.Size([2])
    expected = records({}).to_tensordict(shape, True, {}, None, {})
    slot = expected.clone().apply(lambda t: torch.ones_like(t))
    got = records(tensors_by_key(slot)).to_tensordict(shape, True, {}, None, {})
    for key in expected.keys(True, True):
        assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key
        assert got[key].data_ptr() == slot[key].data_ptr(), key
    assert got["next", "done"][:, :, 0].tolist() == [[False, False, False, True], [False, False, True, False]]


def test_a_policy_output_numpy_cannot_hold_goes_through_a_slot_as_torch():
    """A bfloat16 output has no numpy view in the slot: it is stacked with torch and copied there."""
    import numpy as np

    from rpc_collectors.single_process.step_records import StepRecords

    def records(targets: dict) -> StepRecords:
        rec = StepRecords(targets)
        for t in range(3):
            rec.obs.append({"observation": np.full(2, t, np.float32)})
            rec.next_obs.append({"observation": np.full(2, t + 1, np.float32)})
            rec.add_outputs({"action": torch.tensor(t % 2), "logits": torch.full((2,), t / 4, dtype=torch.bfloat16)})
            rec.rewards.append(1.0)
            rec.terminated.append(False)
            rec.truncated.append(t == 2)
            rec.traj_ids.append(0)
        return rec

    expected = records({}).to_tensordict(torch.Size([]), False, {}, None, {})
    slot = expected.clone().apply(lambda t: torch.ones_like(t))
    got = records(tensors_by_key(slot)).to_tensordict(torch.Size([]), False, {}, None, {})
    for key in expected.keys(True, True):
        assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key
    assert got["logits"].data_ptr() != slot["logits"].data_ptr()  # the slot writer copies it there
    assert got["action"].data_ptr() == slot["action"].data_ptr()
