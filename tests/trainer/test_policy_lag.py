"""``max_policy_lag`` on async collectors: no batch handed out lags more than the bound.

``policy_lag_mode="admit"`` (the default) keeps the bound by pacing the workers ahead: nothing is dropped.
``policy_lag_mode="drop"`` drops the batches beyond it and counts them."""
from __future__ import annotations

import os
import signal

import pytest

from conftest import CountEnv
from rpc_collectors import GymEnv, MultiAsyncCollector, MultiCollector
from test_rpc_collector import BiasPolicy

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures("no_leftover_processes"), pytest.mark.timeout(180)]


def count_env() -> GymEnv:
    return GymEnv(CountEnv())


def lags(max_policy_lag, batches: int = 30, mode: str = "drop") -> tuple[list, MultiAsyncCollector]:
    """Run with a trainer that bumps the weights after every batch; each batch's (min, max) lag."""
    seen = []
    with MultiAsyncCollector([count_env] * 4, BiasPolicy(1, size=3), frames_per_batch=10,
                             max_policy_lag=max_policy_lag, policy_lag_mode=mode) as c:
        for i, _ in enumerate(c):
            seen.append((c.last_batch.min_lag, c.last_batch.lag, c.last_batch.trainer_version))
            c.update_policy_weights_()
            if i + 1 == batches:
                break
    return seen, c


def test_batches_beyond_the_bound_are_dropped_and_counted():
    unbounded, free = lags(None)
    bounded, c = lags(1)
    assert free.dropped_frames == free.dropped_batches == 0
    assert max(lag for _, lag, _ in unbounded) > 1  # without the bound, batches do fall behind
    assert all(0 <= low <= high <= 1 for low, high, _ in bounded)
    assert c.dropped_batches > 0 and c.dropped_frames == 10 * c.dropped_batches
    assert c.stats()["stepped_frames"] == c.frames + c.dropped_frames  # TorchRL's counter: stepped, handed out or not
    assert [version for _, _, version in bounded] == list(range(30))  # every handed-out batch is counted once


def test_zero_lag_hands_out_only_batches_of_the_trainers_weights():
    bounded, c = lags(0, batches=10)
    assert all(high == 0 for _, high, _ in bounded) and c.dropped_batches > 0


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_admission_keeps_the_bound_without_dropping_a_frame(bound):
    """The same run admitted instead: every batch within the bound, none dropped, every batch
    counted once, and the workers still take turns (each delivers)."""
    bounded, c = lags(bound, batches=24, mode="admit")
    assert all(0 <= low <= high <= bound for low, high, _ in bounded), bounded
    assert c.dropped_frames == c.dropped_batches == 0
    assert [version for _, _, version in bounded] == list(range(24))
    assert c.frames == 24 * 10


@pytest.mark.filterwarnings("ignore::rpc_collectors.WorkerRestartWarning")
def test_the_bound_holds_across_a_worker_restart_and_a_resume():
    """Admitted, K=1: a worker killed mid-run is replaced, the state is saved and loaded into a new
    collector; every batch of both runs is within the bound of the trainer's version (restored, not
    from 0), none is dropped, the restart counts on, and the frame accounts balance."""
    def run(state: dict | None, batches: int, kill: bool) -> tuple[list, dict, MultiAsyncCollector]:
        seen = []
        with MultiAsyncCollector([count_env] * 3, BiasPolicy(1, size=3), frames_per_batch=10, max_policy_lag=1,
                                 policy_lag_mode="admit", max_worker_restarts=1, rpc_timeout=60) as c:
            if state is not None:
                c.load_state_dict(state)
            for i, _ in enumerate(c):
                seen.append((c.last_batch.lag, c.last_batch.trainer_version))
                c.update_policy_weights_()
                if kill and i == 3:
                    os.kill(c.infos[1]["pid"], signal.SIGKILL)
                if i + 1 == batches:
                    break
            assert c.dropped_frames == 0
            account = c.metrics().accounts
            assert account.stepped == account.delivered + account.dropped + account.lost + account.pending
            return seen, c.state_dict(), c

    first, state, c1 = run(None, 12, kill=True)
    assert c1.worker_restarts == [0, 1, 0]
    second, _, c2 = run(state, 12, kill=False)
    assert c2.worker_restarts == [0, 1, 0]  # the saved run's restart, not a new one
    assert all(0 <= lag <= 1 for lag, _ in first + second), first + second
    assert [version for _, version in first + second] == list(range(24))  # the resumed run goes on from 12
    saved = state["accounts"]
    assert c2.metrics().accounts.lost == saved["lost"] + saved["pending"]  # the saved run's pending frames


@pytest.mark.filterwarnings("ignore::rpc_collectors.WorkerRestartWarning")
@pytest.mark.parametrize("mode", ["admit", "drop"])
def test_async_nodes_admitted_drop_nothing_also_when_a_local_worker_is_replaced(mode):
    """2 async nodes of 2 local workers, K=1, a push after every batch, node 1's local worker 0 killed and
    replaced: admitted, every batch is within the bound, nothing is dropped (the nodes collect nothing ahead of
    the trainer's requests) and every local worker delivers; dropped, the nodes drop what their local workers
    collected with older weights (the figure the admission removes)."""
    seen, streams = [], set()
    with MultiAsyncCollector([count_env] * 2, BiasPolicy(1, size=3), frames_per_batch=10, max_policy_lag=1,
                             policy_lag_mode=mode, collector_class="async", num_workers_per_collector=2,
                             max_worker_restarts=1, track_policy_version=True, rpc_timeout=60) as c:
        for i, batch in enumerate(c):
            seen.append(c.last_batch.lag)
            streams.add(int(batch["collector", "traj_ids"][0]) % 4)
            c.update_policy_weights_()
            if i == 5:
                os.kill(c.infos[1]["local_pids"][0], signal.SIGKILL)
            if i + 1 == 30:
                break
        account = c.metrics().accounts
        assert account.stepped == account.delivered + account.dropped + account.lost + account.pending
        assert c.worker_restarts == [0, 1]
        dropped = c.dropped_frames
    assert all(0 <= lag <= 1 for lag in seen), seen
    assert streams == {0, 1, 2, 3}
    assert dropped == 0 if mode == "admit" else dropped > 0


@pytest.mark.parametrize("kwargs, match", [
    ({"max_policy_lag": -1, "sync": False}, "max_policy_lag=-1 is invalid; accepted: None"),
    ({"max_policy_lag": 1.5, "sync": False}, "max_policy_lag=1.5 is invalid"),
    ({"max_policy_lag": 2, "sync": True}, "max_policy_lag=2 applies to async collection.*accepted with sync=True: None"),
])
def test_bad_max_policy_lag_is_refused_before_any_process_starts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiCollector([count_env] * 2, BiasPolicy(1, size=3), frames_per_batch=10, **kwargs)
