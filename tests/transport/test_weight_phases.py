"""A weight push's phases in ``metrics().pushes``, with worker processes, over shared memory and
RPC: pause, transfer and acknowledge lie within the blocking ``update_policy_weights_`` calls, and
apply is the workers' own: a policy whose copy into it sleeps in the workers shows in apply, not in
transfer. Only containment and ordering are asserted, no timing ratio."""
from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from conftest import CountEnv
from rpc_collectors import MultiSyncCollector

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180), pytest.mark.usefixtures("no_leftover_processes")]

SLEEP = 0.3
PHASES = ("pause", "transfer", "acknowledge", "apply")


class SlowParameters(dict):
    """A module's parameters whose listing sleeps ``SLEEP`` s outside the process that made them: a worker's
    policy is slow to take new weights (``TensorDict.from_module`` lists them for every copy into it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.owner = os.getpid()

    def items(self):
        if os.getpid() != self.owner:
            time.sleep(SLEEP)
        return super().items()


class SlowPolicy(nn.Module):
    """Action 0 on CountEnv's 4 floats, by a linear layer whose weights are slow to apply in a worker."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.linear._parameters = SlowParameters(self.linear._parameters)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.zeros(observation.shape[:-1], dtype=torch.int64)


@pytest.mark.parametrize("transport", ["shm", "rpc"])
def test_a_pushs_phases_lie_within_it_and_a_slow_apply_shows_in_apply(transport):
    pushes = 3
    with MultiSyncCollector([CountEnv] * 2, SlowPolicy(), frames_per_batch=8, total_frames=-1,
                            weight_transport=transport, rpc_timeout=60) as c:
        it = iter(c)
        next(it)
        blocking, whole = 0.0, time.monotonic()
        for _ in range(pushes):
            start = time.monotonic()
            c.update_policy_weights_()
            blocking += time.monotonic() - start
            next(it)  # each worker applies the push before this batch
        start = time.monotonic()
        c.update_policy_weights_()  # its answers tell the last batch's apply
        blocking += time.monotonic() - start
        whole = time.monotonic() - whole
        m = c.metrics().pushes
    assert m.count == pushes + 1
    values = [getattr(m, f"{phase}_s") for phase in PHASES] + [getattr(m, f"last_{phase}_s") for phase in PHASES]
    assert all(v >= 0 for v in values)
    assert m.pause_s > 0 and m.acknowledge_s >= 0 and m.transfer_s > 0
    # the trainer's three phases lie within the blocking calls, the workers' applies in the batches between
    assert m.pause_s + m.transfer_s + m.acknowledge_s <= blocking + 0.005
    assert sum(values[:4]) <= whole + 0.005  # and all four within the pushes and the batches that applied them
    assert m.apply_s >= pushes * SLEEP and m.last_apply_s >= SLEEP  # every version's apply slept at least once
    assert m.transfer_s < SLEEP  # the sleeps are not in the transfer
