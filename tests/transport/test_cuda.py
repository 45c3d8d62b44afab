"""Batches stored on a GPU: only on machines with CUDA (the CPU machines that run CI have none).

With ``storing_device="cuda"`` the workers still write their batches into shared memory; the
trainer page-locks those slots and copies each batch from them into GPU memory.
"""
from __future__ import annotations

import pytest
import torch

from test_data_plane import Checker, collector

pytestmark = [
    pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_batches_land_on_the_gpu_from_pinned_shared_memory(sync):
    with collector(None, sync, storing_device="cuda") as c:
        checker = Checker()
        for i, batch in enumerate(c):
            assert all(v.device.type == "cuda" for v in batch.values(True, True))
            checker.check(batch.cpu())
            if i == 8:
                break
        pools = c._batches.buffers
        assert pools and all(slot.is_pinned() for pool in pools for slot in pool.slots)
