"""A policy reaches every worker as it is: buffers of every dtype (float8 and unsigned ones too, which torch's own
pickling cannot carry), tied weights, views of one storage; and a push brings what changed. Checked by the frames
themselves: each action is read from the policy's tables, and each frame carries a digest of every byte the policy
holds."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import Collector, RPCCollector

pytestmark = pytest.mark.timeout(120)
TABLE_DTYPES = (torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16,
                torch.bool, torch.complex64)


class TablePolicy(nn.Module):
    """Action = bit ``t`` of a uint16 table; ``"digest"`` = the sum of every byte of its parameters and buffers, each
    weighted by its place, so a byte changed, lost or moved changes it."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.first = nn.Linear(3, 3)
        self.second = nn.Linear(3, 3)
        self.second.weight = self.first.weight  # tied
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=gen))
        raw = torch.randint(0, 256, (64 * len(TABLE_DTYPES),), generator=gen, dtype=torch.uint8)
        for i, dtype in enumerate(TABLE_DTYPES):
            part = raw[64 * i:64 * (i + 1)].clone()
            self.register_buffer(f"table{i}", (part % 2).bool() if dtype == torch.bool else part.view(dtype))
        self.register_buffer("bits", torch.randint(0, 2**16, (1,), generator=gen, dtype=torch.int32).to(torch.uint16))
        self.register_buffer("window", self.table0[2:6])  # a view of another buffer's storage

    def digest(self) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64)
        for tensor in (*self.parameters(), *self.buffers()):
            data = tensor.detach().contiguous().view(-1).view(torch.uint8).to(torch.float64)
            total += (data * torch.arange(1, data.numel() + 1, dtype=torch.float64)).sum()
        return total

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = observation[..., 0].long() % 16
        action = (self.bits.to(torch.int64) >> t) & 1
        return action.reshape(observation.shape[:-1]), self.digest().expand(observation.shape[:-1])


def td_policy(seed: int):
    from tensordict.nn import TensorDictModule
    return TensorDictModule(TablePolicy(seed), in_keys=["observation"], out_keys=["action", "digest"])


def frames(collector, batches: int) -> list:
    out = []
    for i, batch in enumerate(collector):
        out.append(batch.select("action", "digest", "observation").clone())
        if i + 1 == batches:
            break
    return out


def reference(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a single-process ``Collector`` records with ``TablePolicy(seed)``: the actions and the digest."""
    collector = Collector(CountEnv, td_policy(seed), frames_per_batch=8, total_frames=8)
    batch = next(iter(collector))
    collector.shutdown()
    return batch["action"], batch["digest"]


@pytest.mark.parametrize("layout", ["workers", "node"])
def test_a_policy_torch_cannot_pickle_reaches_the_workers_whole_and_a_push_replaces_every_byte(layout):
    nodes = {"collector_class": "sync", "num_workers_per_collector": 2} if layout == "node" else {}
    policy = td_policy(1)
    assert policy.module.second.weight is policy.module.first.weight
    collector = RPCCollector(CountEnv, policy, num_collectors=2, launcher="local", sync=True,
                             frames_per_batch=16 * (2 if nodes else 1), total_frames=-1, **nodes)
    try:
        first = frames(collector, 1)[0].reshape(-1, 8)
        actions, digest = reference(1)
        for row in first:  # each worker's (or local worker's) 8 frames
            assert torch.equal(row["action"], actions)
            assert torch.equal(row["digest"], digest)
        policy.load_state_dict(td_policy(2).state_dict())
        collector.update_policy_weights_()
        pushed = frames(collector, 1)[0].reshape(-1, 8)
        assert torch.equal(pushed["digest"], reference(2)[1].expand(pushed.shape))
    finally:
        collector.shutdown()
