"""Admission (``policy_lag_mode="admit"``) keeps the data invariants: each worker's stream of handed-out
frames is its env's consecutive steps, and the weights version each frame names is the one that chose
its action. Checked frame for frame against a single-process ``Collector`` replaying the same env with
the weights of each frame's version, pushed before each of its steps; for async workers and nodes
unbounded too (``max_policy_lag=None``: a node hands out what its local workers collected ahead), and
for each env of an ``AsyncBatchedCollector``.
"""
from __future__ import annotations

import copy

import pytest
import torch

from conftest import CountEnv
from rpc_collectors import AsyncBatchedCollector, Collector, GymEnv, MultiAsyncCollector
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300), pytest.mark.usefixtures("no_leftover_processes")]

VERSION, WORKER, TRAJ = ("collector", "policy_version"), ("collector", "worker_id"), ("collector", "traj_ids")
COMPARED = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
            ("next", "terminated"), ("next", "truncated"))
FRAMES, BATCHES = 8, 30


class OffsetEnv:
    """CountEnv whose episode lengths are shifted by ``offset``: each worker's env differs."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __call__(self) -> GymEnv:
        return GymEnv(CountEnv(lengths=(3, 5, 2, 7), offset=self.offset))


# flat: 3 workers; nodes: 2 async nodes of 2 local workers (worker.node_credits), each stream a local worker's
LAYOUTS = {"workers": (3, {}), "nodes": (2, {"collector_class": "async", "num_workers_per_collector": 2})}


def collected(bound: int, layout: str) -> tuple[list, dict[int, dict]]:
    """Batches of an admitted run whose trainer pushes new weights after every batch (the action
    flips with each version), and the weights of each version."""
    workers, options = LAYOUTS[layout]
    policy = BiasPolicy(0, size=3)
    weights = {0: copy.deepcopy(policy.state_dict())}
    batches = []
    with MultiAsyncCollector([OffsetEnv(w) for w in range(workers)], policy, frames_per_batch=FRAMES,
                             max_policy_lag=bound, policy_lag_mode="admit", track_policy_version=True,
                             rpc_timeout=60, **options) as collector:
        for i, batch in enumerate(collector):
            batches.append(batch.clone())
            assert bound is None or collector.last_batch.lag <= bound
            policy.set_action((i + 1) % 2)
            collector.update_policy_weights_()
            weights[collector.pushed_version] = copy.deepcopy(policy.state_dict())
            if i + 1 == BATCHES:
                break
        assert collector.dropped_frames == 0
    return batches, weights


def streams(layout: str) -> dict[int, int]:
    """Each stream of frames (a worker's, a node's local worker's) and the env offset it steps."""
    workers, options = LAYOUTS[layout]
    per_node = options.get("num_workers_per_collector", 1)
    return {stream: stream // per_node for stream in range(workers * per_node)}


def stream_of(batches: list, stream: int, layout: str) -> list:
    """The frames of ``stream``, in the order they were handed out: a worker's by its id, a local worker's
    by its trajectory ids (the flat run's worker's, mod the number of local workers)."""
    count = len(streams(layout))
    key, of = (WORKER, lambda i: i) if layout == "workers" else (TRAJ, lambda i: i % count)
    return [frame for batch in batches for frame in batch.unbind(0) if of(int(frame[key])) == stream]


def assert_replayed(frames: list, offset: int, weights: dict, version_key) -> set:
    """``frames`` (one env's, in order) are a single-process ``Collector``'s steps of the env at
    ``offset`` with, before each step, the weights of the version the frame names; returns the
    versions seen."""
    assert frames, f"the env at offset {offset} delivered nothing"
    seen, policy = set(), BiasPolicy(0, size=3)
    with Collector(OffsetEnv(offset), policy, frames_per_batch=1, total_frames=len(frames)) as replay:
        steps = iter(replay)
        for index, frame in enumerate(frames):
            version = int(frame[version_key])
            seen.add(version)
            policy.load_state_dict(weights[version])
            replay.update_policy_weights_()
            expected = next(steps)[0]
            for key in COMPARED:
                assert torch.equal(frame[key], expected[key]), (
                    f"offset {offset}'s frame {index} (version {version}) differs from the replay in {key}")
    return seen


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("bound", [0, 1, 2, None])
def test_each_workers_admitted_frames_are_its_envs_steps_chosen_by_the_weights_they_name(bound, layout):
    batches, weights = collected(bound, layout)
    seen = set()
    for worker, offset in streams(layout).items():
        seen |= assert_replayed(stream_of(batches, worker, layout), offset, weights, VERSION)
    assert len(seen) > 2, "the run handed out too few versions for the comparison to mean much"


@pytest.mark.parametrize("bound", [1, 2])
def test_each_batched_envs_admitted_frames_are_its_steps_chosen_by_the_weights_they_name(bound):
    """``AsyncBatchedCollector(max_policy_lag=K)``, an update after every batch."""
    weights, batches = {0: copy.deepcopy(BiasPolicy(0, size=3).state_dict())}, []
    with AsyncBatchedCollector([OffsetEnv(w) for w in range(3)], policy=BiasPolicy(0, size=3),
                               frames_per_batch=FRAMES, total_frames=-1, max_policy_lag=bound,
                               rpc_timeout=60) as collector:
        for i, batch in enumerate(collector):
            batches.append(batch.clone())
            assert collector.last_batch.lag <= bound
            new = BiasPolicy((i + 1) % 2, size=3)
            collector.update_policy_weights_(new)
            weights[collector.policy_version] = copy.deepcopy(new.state_dict())
            if i + 1 == BATCHES:
                break
    whole = torch.cat(batches)
    seen = set()
    for env in range(3):
        frames = list(whole[whole["env_index"] == env].unbind(0))
        seen |= assert_replayed(frames, env, weights, "policy_version")
    assert len(seen) > 2, "the run handed out too few versions for the comparison to mean much"
