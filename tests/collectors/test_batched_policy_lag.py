"""``AsyncBatchedCollector(max_policy_lag=K)``: the inference loop holds the envs that are ahead, so
every batch is within K versions and no frame is dropped, with a slow env among fast ones (the
rule, as a property of a model of the loop: ``tests/trainer/test_batched_admission.py``)."""
from __future__ import annotations

import time
import warnings

import pytest
import torch

from conftest import CountEnv
from continuity import assert_env_steps_continue
from rpc_collectors import AsyncBatchedCollector, GymEnv
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"),
              pytest.mark.timeout(120)]


class SlowCountEnv(CountEnv):
    """CountEnv whose steps take ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return super().step(action)


def fast_env() -> GymEnv:
    return GymEnv(CountEnv())


def slow_env() -> GymEnv:
    # 50 fast steps (one forward pass each, a batch of 4 frames every few) take less
    return GymEnv(SlowCountEnv(0.1))


def test_each_batch_is_within_the_bound_and_no_frame_is_dropped():
    """A trainer that updates the weights after every batch; one env 100x slower than the five
    others. Unbounded, the slow env's frames would join batches many versions later; with
    max_policy_lag=2 the loop waits for it, and each env's stream has no gap."""
    bound = 2
    with AsyncBatchedCollector([slow_env] + [fast_env] * 5, policy=BiasPolicy(0, size=3), frames_per_batch=4,
                               total_frames=-1, max_policy_lag=bound) as collector:
        batches = []
        for i, batch in enumerate(collector):
            assert collector.last_batch.lag <= bound, collector.last_batch
            assert (batch["policy_version"] >= collector.policy_version - bound).all()
            batches.append(batch.clone())
            if i == 24:
                break
            # copied in under the loop's lock, with the version
            collector.update_policy_weights_(BiasPolicy((i + 1) % 2, size=3))
        accounts = collector.metrics().accounts
    whole = torch.cat(batches)
    # each frame's action is the one its stamped version chose
    assert torch.equal(whole["action"], whole["policy_version"] % 2)
    assert 0 in whole["env_index"].tolist(), "the slow env's frames never joined a batch"
    for env in range(6):
        frames = whole[whole["env_index"] == env]
        if len(frames) > 1:
            assert_env_steps_continue(frames)
            assert (frames["policy_version"].diff() >= 0).all()
    assert accounts.dropped == 0 and accounts.lost == 0
    assert accounts.stepped == accounts.delivered + accounts.pending


def test_updates_faster_than_batches_are_warned_of_where_the_bound_breaks():
    """The bound holds for at most one update per batch: with three per batch the batch taken next
    was chosen by weights three updates back, and the warning points at the trainer's loop."""
    policy = BiasPolicy(0, size=3)
    with AsyncBatchedCollector([fast_env] * 2, policy=policy, frames_per_batch=4, total_frames=-1,
                               max_policy_lag=1) as collector:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i, _ in enumerate(collector):
                if i == 5:
                    break
                for _ in range(3):
                    collector.update_policy_weights_()
    beyond = [w for w in caught if "beyond max_policy_lag=1" in str(w.message)]
    assert beyond, [str(w.message) for w in caught]
    assert beyond[0].category is RuntimeWarning and beyond[0].filename == __file__
    assert "at most one update per batch" in str(beyond[0].message)


def test_a_resumed_collector_keeps_the_bound_from_the_saved_version_on():
    """``load_state_dict`` of a run that updated its weights 5 times: the next run's versions go on
    from 5, and every batch stays within the bound of them."""
    def run(state=None):
        with AsyncBatchedCollector([slow_env] + [fast_env] * 3, policy=BiasPolicy(0, size=3),
                                   frames_per_batch=4, total_frames=-1, max_policy_lag=1) as collector:
            if state is not None:
                collector.load_state_dict(state)
            versions, lags = [], []
            for i, batch in enumerate(collector):
                versions.append(batch["policy_version"].clone())
                lags.append(collector.last_batch.lag)
                if i == 5:
                    return collector.state_dict(), versions, lags
                collector.update_policy_weights_()

    saved, _, first_lags = run()
    state, versions, lags = run(saved)
    assert saved["policy_version"] == 5 and state["policy_version"] == 10
    assert max(first_lags + lags) <= 1
    assert torch.cat(versions).min() >= 5 and (versions[-1] >= 9).all()
    assert state["frames"] == 2 * saved["frames"] == 48
