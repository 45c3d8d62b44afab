"""TorchRL's ``preemptive_threshold``: a sync round ends once that fraction of the workers handed in
their batches; the others stop at their next step, and what they did not collect is padded and
masked (``"stack"``) or dropped (``cat_results=-1``)."""
from __future__ import annotations

import itertools
import json
import sys
import time

import pytest
import torch
from tensordict import TensorDict

from conftest import slow_cartpole
from procs import descendants, run_in_session, wait_gone
from rpc_collectors import GymEnv, MultiAsyncCollector, MultiSyncCollector, RPCCollector
from rpc_collectors.single_process.preemption import MASK, Preemption, drop_padding, padded, valid_frames
from rpc_collectors.transport.rendezvous import free_port
from rpc_collectors.worker.spawner import Spawner

TRAJ = ("collector", "traj_ids")
WORKER = ("collector", "worker_id")
STEPS = 20  # of each worker's batch; the slow worker would take 20 * 0.5 s for one


def cartpole() -> GymEnv:
    return GymEnv("CartPole-v1")


def straggler() -> GymEnv:
    """CartPole whose every step takes 0.5 s: the worker the fast one leaves behind."""
    return slow_cartpole(0.5)


# ------------------------------------------------------------------ worker side, in this process
def test_a_stop_ends_only_the_batch_it_was_sent_for():
    p = Preemption()
    p.stop(1)  # arrives before the worker began batch 1
    p.begin()
    assert p.stopped()
    p.begin()  # batch 2 is not cut short by batch 1's stop
    assert not p.stopped()
    p.stop(2)
    assert p.stopped()
    p.stop(1)  # a late stop for an older batch changes nothing
    p.begin()
    assert not p.stopped()


def test_a_cut_batch_is_padded_with_its_mask_and_no_trajectory():
    batch = TensorDict({"observation": torch.ones(3, 2, 4), TRAJ: torch.full((3, 2), 7)}, [3, 2], names=[None, "time"])
    out = padded(batch, 5)
    assert out.shape == (3, 5) and out.names == [None, "time"]
    assert out[MASK].tolist() == [[True, True, False, False, False]] * 3
    assert (out[TRAJ][:, 2:] == -1).all() and (out[TRAJ][:, :2] == 7).all()
    assert (out["observation"][:, 2:] == 0).all()
    assert valid_frames(out) == 6
    dropped = drop_padding(out)
    assert dropped.shape == (3, 2) and MASK not in dropped.keys(True)
    assert padded(batch, 2)[MASK].all()  # a whole batch carries its mask too


# ------------------------------------------------------------------ bad input, before any process
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(preemptive_threshold=1.5), ["preemptive_threshold=1.5", "[0, 1]"]),
        (dict(preemptive_threshold=-0.1), ["preemptive_threshold=-0.1", "[0, 1]"]),
        (dict(preemptive_threshold="0.5"), ["preemptive_threshold='0.5'", "[0, 1]"]),
        (dict(preemptive_threshold=True), ["preemptive_threshold=True", "[0, 1]"]),
        (dict(preemptive_threshold=0.5, sync=False), ["preemptive_threshold=0.5", "sync=False: None"]),
        (dict(preemptive_threshold=0.5, split_trajs=True), ["preemptive_threshold=0.5", "split_trajs=True"]),
        (dict(preemptive_threshold=0.5, trajs_per_batch=2, traj_format="padded"),
         ["preemptive_threshold=0.5", "trajs_per_batch"]),
        (dict(preemptive_threshold=0.5, collector_class="sync", num_workers_per_collector=2),
         ["preemptive_threshold=0.5", "node collectors"]),
    ],
)
def test_bad_preemptive_threshold_is_refused_before_any_process(kwargs, words, monkeypatch):
    def spawn(*args, **kw):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(Spawner, "spawn", spawn)
    with pytest.raises(ValueError) as info:
        RPCCollector([cartpole] * 2, None, frames_per_batch=40, launcher="local", **kwargs)
    for word in words:
        assert word in str(info.value)


# ------------------------------------------------------------------ worker processes
def preempted_lane(batch, lane: int) -> int:
    """Checks lane ``lane`` of a stacked batch is a collected prefix then padding; its length."""
    mask, ids = batch[MASK][lane], batch[TRAJ][lane]
    n = int(mask.sum())
    assert 1 <= n < STEPS, "the slow worker was not stopped, or not after a step"
    assert mask[:n].all() and not mask[n:].any()
    assert (ids[:n] >= 0).all() and (ids[n:] == -1).all()
    assert (batch["observation"][lane, n:] == 0).all() and (batch[("next", "reward")][lane, n:] == 0).all()
    return n


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(120)
def test_stacked_rounds_end_when_the_fast_worker_is_done_and_mask_the_slow_ones_steps():
    with MultiSyncCollector([cartpole, straggler], None, frames_per_batch=2 * STEPS, total_frames=-1,
                            preemptive_threshold=0.5) as c:
        batches = [b.clone() for b in itertools.islice(c, 3)]
        frames = c.frames
    lengths = []
    for batch in batches:
        assert batch.shape == (2, STEPS)
        assert batch[MASK][0].all() and (batch[TRAJ][0] >= 0).all()  # the fast worker finished its batch
        lengths.append(preempted_lane(batch, 1))
    assert frames == sum(valid_frames(b) for b in batches) == 3 * STEPS + sum(lengths)
    for before, after, n in zip(batches, batches[1:], lengths):  # the slow worker's env goes on where it stopped
        last = n - 1
        if not before[("next", "done")][1, last]:
            assert torch.equal(before[("next", "observation")][1, last], after["observation"][1, 0])
            assert before[TRAJ][1, last] == after[TRAJ][1, 0]


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cat_results", [-1, 0])
def test_concatenated_rounds_drop_the_steps_a_stopped_worker_did_not_collect(cat_results):
    with RPCCollector([cartpole, straggler], None, frames_per_batch=2 * STEPS, launcher="local",
                      cat_results=cat_results, preemptive_threshold=0.5, track_policy_version=True) as c:
        batches = [b.clone() for b in itertools.islice(c, 2)]
        frames = c.frames
    for batch in batches:
        assert MASK not in batch.keys(True)
        workers = batch[WORKER].tolist()
        n = workers.count(1)
        assert workers == [0] * STEPS + [1] * n and 1 <= n < STEPS
        assert (batch[TRAJ] >= 0).all()
    assert frames == sum(b.numel() for b in batches)


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(120)
def test_total_frames_counts_only_collected_frames():
    """Two full rounds would hold 80 frames; preempted ones hold fewer, so the run takes more rounds,
    and ``len()``, which cannot know how many, says so instead of a number the run does not keep."""
    with MultiSyncCollector([cartpole, straggler], None, frames_per_batch=2 * STEPS, total_frames=4 * STEPS,
                            preemptive_threshold=0.5) as c:
        with pytest.raises(TypeError, match=r"len\(\) .*preemptive_threshold=0.5.*accepted: preemptive_threshold=None"):
            len(c)
        batches = [b.clone() for b in c]
    assert len(batches) > 2
    assert sum(valid_frames(b) for b in batches) == c.frames >= 4 * STEPS


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(120)
def test_threshold_zero_stops_every_worker_after_its_first_steps_as_torchrl():
    """The stop goes out as the round starts; 200 steps of 10 ms leave it two seconds to arrive
    (200 plain CartPole steps take a few milliseconds: about as long as the stop's way there)."""
    paced = lambda: slow_cartpole(0.01)  # noqa: E731
    with MultiSyncCollector([paced, paced], None, frames_per_batch=400, total_frames=-1,
                            preemptive_threshold=0.0) as c:
        for batch in itertools.islice(c, 3):
            assert batch.shape == (2, 200) and valid_frames(batch) < 400
            for lane in range(2):
                n = int(batch[MASK][lane].sum())
                assert n >= 1 and batch[MASK][lane, :n].all()


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(120)
def test_threshold_one_is_no_preemption():
    with MultiAsyncCollector([cartpole, cartpole], None, frames_per_batch=20, total_frames=40, preemptive_threshold=1.0) as c:
        batches = list(c)
        assert len(c) == len(batches) == 2
        assert all(MASK not in b.keys(True) and b.shape == (20,) for b in batches)


TORCHRUN_TRAINER = """
import itertools, json, time
from rpc_collectors import GymEnv, RPCCollector

def slow_cartpole():
    env = GymEnv("CartPole-v1")
    step = env.step_arrays
    env.step_arrays = lambda action: (time.sleep(0.5), step(action))[1]
    return env

c = RPCCollector(["CartPole-v1", slow_cartpole], None, frames_per_batch=40, launcher="torchrun",
                 cat_results="stack", preemptive_threshold=0.5)
lanes = [batch["collector", "mask"].sum(-1).tolist() for batch in itertools.islice(c, 2)]
print(json.dumps({"lanes": lanes, "frames": c.frames}), flush=True)
c.shutdown()
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_torchrun_ranks_are_stopped_over_rpc(tmp_path):
    """Collector ranks get the stop as an RPC call while their batch runs."""
    script = tmp_path / "trainer.py"
    script.write_text(TORCHRUN_TRAINER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", f"--master-port={free_port()}", str(script)]
    before = descendants()
    run = run_in_session(cmd, timeout=100)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))
    for fast, slow in summary["lanes"]:
        assert fast == STEPS and 1 <= slow < STEPS
    assert summary["frames"] == sum(map(sum, summary["lanes"]))
    assert not wait_gone(descendants() - before, 10)


def vector() -> GymEnv:
    return GymEnv("CartPole-v1", num_envs=2)


def slow_vector() -> GymEnv:
    """Two CartPoles stepped together, 0.5 s a step."""
    env = vector()
    step = env.step_arrays
    env.step_arrays = lambda action: (time.sleep(0.5), step(action))[1]
    return env


class Buffer:
    """A replay buffer as TorchRL's with a one-dim storage: it keeps what ``extend`` writes."""

    class storage:  # noqa: N801  (TorchRL's buffers expose their storage's ndim)
        ndim = 1

    def __init__(self) -> None:
        self.written: list = []

    def extend(self, td) -> None:
        self.written.append(td.clone())


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("collector", ["MultiSyncCollector", "RPCCollector-cat0-vector"])
def test_a_replay_buffer_gets_only_collected_frames_from_rounds_cut_short(collector):
    """A preempted worker's padding (zeros, trajectory id -1) is no data: the buffer never gets it,
    and it holds exactly the frames ``collector.frames`` counts."""
    buffer = Buffer()
    if collector == "MultiSyncCollector":
        c = MultiSyncCollector([cartpole, straggler], None, frames_per_batch=2 * STEPS, total_frames=6 * STEPS,
                               preemptive_threshold=0.5, replay_buffer=buffer)
    else:  # [B, T] batches concatenated along dim 0 keep their mask: their padding must not be written either
        c = RPCCollector([vector, slow_vector], None, frames_per_batch=4 * STEPS, total_frames=12 * STEPS,
                         launcher="local", cat_results=0, preemptive_threshold=0.5, replay_buffer=buffer)
    with c:
        assert all(out is None for out in c)
        frames = c.frames
    written = [td.reshape(-1) for td in buffer.written]
    ids = torch.cat([td[TRAJ] for td in written])
    assert (ids >= 0).all(), f"{int((ids < 0).sum())} padded frames of {ids.numel()} written to the replay buffer"
    assert all(MASK not in td.keys(True) for td in written)
    assert ids.numel() == frames >= 6 * STEPS * (2 if collector != "MultiSyncCollector" else 1)
