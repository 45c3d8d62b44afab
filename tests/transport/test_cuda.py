"""CUDA paths: only on machines with CUDA (the CPU machines that run CI have none).

With ``storing_device="cuda"`` the workers still write their batches into shared memory; the
trainer page-locks those slots and copies each batch from them into GPU memory. Slots that
receive batches from other hosts are pinned allocations of the trainer's own. Workers' policies
may live on the GPU (``policy_device="cuda"``), and their weights may come by NCCL
(``backend="nccl"``). tests/worker/test_cuda_nodes.py and tests/collectors/test_cuda_batched.py
hold the GPU policies of node inference and of ``AsyncBatchedCollector``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from conftest import FixedAction
from folders import PYTHONPATH
from procs import run_in_session
from rpc_collectors import MultiCollector
from test_data_plane import Checker, collector
from test_weight_updates import batch_at, count_env

pytestmark = [
    pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class WhereAction(FixedAction):
    """``FixedAction`` that also says where it ran: ``on_gpu`` is 1 for each action chosen on a GPU."""

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action = super().forward(observation)
        return action, torch.full_like(action, int(action.is_cuda))


def where_policy(action: int = 0, obs_size: int = 3) -> TensorDictModule:
    """A policy taking ``action`` whatever it observes (CountEnv: 3 floats), writing ``on_gpu`` too."""
    return TensorDictModule(WhereAction(action, obs_size), in_keys=["observation"], out_keys=["action", "on_gpu"])


def set_action(policy: TensorDictModule, action: int) -> None:
    """Train ``policy`` in place so that it takes ``action``."""
    with torch.no_grad():
        policy.module.linear.bias.copy_(torch.eye(2)[action])


def ran_on_gpu(batch) -> bool:
    return bool((batch["on_gpu"] == 1).all())


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_batches_land_on_the_gpu_from_pinned_shared_memory(sync):
    with collector(None, sync, storing_device="cuda") as c:
        checker = Checker()
        for i, batch in enumerate(c):
            assert all(v.device.type == "cuda" for v in batch.values(True, True))
            checker.check(batch.cpu())
            if i == 8:
                break
        pools = c.slots.plane.buffers
        assert pools and all(slot.is_pinned() for pool in pools for slot in pool.slots)


def test_batches_from_another_host_are_received_into_pinned_slots_and_land_on_the_gpu():
    """The path of a worker on another host, on loopback: its bytes arrive in a pinned slot of the
    trainer's own memory, and the batch is copied from there to the GPU."""
    from rpc_collectors.transport.data import BatchPlane, SlotPool
    from rpc_collectors.transport.doorbell import Ready, answer
    from rpc_collectors.transport.layouts import BatchLayout
    from rpc_collectors.transport.socket_doorbell import SocketDoorbell
    from rpc_collectors.worker.single import SlotWriter

    def batch(mark: int) -> TensorDict:
        obs = torch.full((50, 3, 32, 32), mark, dtype=torch.uint8)
        return TensorDict({"observation": obs, "reward": torch.full((50, 1), float(mark))}, [50])

    pool = SlotPool(BatchLayout.of(batch(0)), 1, pinned=True, shared=False)
    plane = BatchPlane([False], lambda *_: True, sync=False, device=torch.device("cuda"))
    bell = SocketDoorbell("127.0.0.1", pool.memory, 5.0)
    writer = SlotWriter(pool.spec(0, bell.ends))

    def collect(min_version: int, slot: int) -> Ready:
        assert writer.write(slot, batch(min_version))
        return Ready(slot)

    answer(bell.ends, collect, writer.memory)
    bell.opened()
    try:
        assert all(slot.is_pinned() for slot in pool.slots)
        for i in range(1, 6):
            slot = pool.slot_for(0)
            assert bell.ring(slot, i).wait() == Ready(slot)
            placed = plane.to_storing_device(pool.hand_out(slot))
            assert all(v.device.type == "cuda" for v in placed.values(True, True))
            assert (placed.cpu() == batch(i)).all(), f"batch {i} differs from what the worker sent"
    finally:
        bell.close()
        pool.close()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_workers_policies_on_the_gpu_act_as_the_pushed_weights_say(sync):
    """``policy_device="cuda"``: each worker runs its copy of the policy on the GPU; the batches come
    back in host memory, and the weights pushed from the trainer's CPU policy choose the next actions."""
    policy = where_policy(0)
    with MultiCollector([count_env] * 2, policy, sync=sync, frames_per_batch=20 if sync else 10, total_frames=-1,
                        policy_device="cuda", track_policy_version=True) as c:
        batch_at(c, 0, 0)
        batch = c.next()
        assert ran_on_gpu(batch) and batch["action"].device.type == "cpu"
        set_action(policy, 1)
        c.update_policy_weights_()
        batch_at(c, 1, 1)
        set_action(policy, 0)
        c.update_policy_weights_()
        batch_at(c, 2, 0)
        assert ran_on_gpu(c.next())


NCCL_TRAINER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = {tests!r}
    from rpc_collectors import MultiSyncCollector
    from test_cuda import where_policy, set_action
    from test_weight_updates import VERSION, count_env

    policy = where_policy(0)
    c = MultiSyncCollector([count_env] * 2, policy, frames_per_batch=20, total_frames=-1, backend="nccl",
                           policy_device="cuda", track_policy_version=True)
    with c:
        seen = []
        for action in (0, 1, 0):
            if seen:
                set_action(policy, action)
                c.update_policy_weights_()
            batch = c.next()
            seen.append({{"actions": batch["action"].unique().tolist(), "versions": batch[VERSION].unique().tolist(),
                          "on_gpu": batch["on_gpu"].unique().tolist()}})
        spec = c.weights.spec
        print(json.dumps({{"kind": spec.kind, "backend": spec.backend, "buffer": c.weights.sender.buffer.device.type,
                           "batches": seen}}), flush=True)
""")


def test_nccl_weights_reach_workers_whose_policies_are_on_the_gpu(tmp_path):
    """``backend="nccl"``: the trainer's weights go to the workers' GPU policies by one NCCL broadcast
    from a GPU buffer; each push's weights choose the next batch's actions. The trainer runs as a
    program of its own, so that a hang in NCCL's C++ (where no Python timeout reaches) ends at the
    timeout here."""
    script = tmp_path / "trainer.py"
    script.write_text(NCCL_TRAINER.format(tests=PYTHONPATH.split(os.pathsep)))
    try:
        out = run_in_session([sys.executable, str(script)], 60, dict(os.environ, PYTHONPATH=PYTHONPATH))
    except subprocess.TimeoutExpired:
        pytest.fail("the NCCL trainer did not finish within 60 s (NCCL's set-up or a push hangs)")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["kind"], result["backend"], result["buffer"]) == ("broadcast", "nccl", "cuda"), result
    assert result["batches"] == [{"actions": [a], "versions": [v], "on_gpu": [1]} for v, a in enumerate((0, 1, 0))]
