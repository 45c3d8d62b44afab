"""Frame accounts: every frame the envs stepped is delivered, dropped, lost or pending
(``metrics().accounts``), exactly, checked against the envs' own log of their steps.

Each env writes one byte per step to a file named for its process and observes that pid, so a
test knows what each process stepped (the log) and which frames of it the trainer handed out
(the batches); a process that kills itself mid-batch shows where its unfinished frames went.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc_collectors import (
    AsyncBatchedCollector,
    Collector,
    DistributedCollector,
    GymEnv,
    MultiAsyncCollector,
    MultiSyncCollector,
    RPCCollector,
)
from rpc_collectors.core.metrics import FrameAccount
from rpc_collectors.single_process.frame_ledger import Ledger
from test_restarts import StampEnv
from test_rpc_collector import BiasPolicy

FRAMES = 10  # per worker's batch


class StepLogEnv(StampEnv):
    """StampEnv (observes ``[pid, per-process step, 0]``) whose every step appends a byte to
    ``<log>/<pid>``. With ``die_at``, the first process to reach its step ``die_at`` (it claims
    ``<log>/die`` and writes its pid there) SIGKILLs itself then, before the step."""

    def __init__(self, log: str, die_at: int | None = None, pause: float = 0.0) -> None:
        super().__init__(0, step_s=pause, marker=os.path.join(log, "die"))
        self.die_at = die_at
        self.fd = os.open(os.path.join(log, str(os.getpid())), os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def step(self, action):
        if self.counter + 1 == self.die_at and self._first():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        stepped = super().step(action)
        os.write(self.fd, b"s")
        return stepped

    def close(self) -> None:
        os.close(self.fd)


class LogEnvFactory:
    def __init__(self, log: Path, die_at: int | None = None, pause: float = 0.0) -> None:
        self.log, self.die_at, self.pause = str(log), die_at, pause

    def __call__(self) -> GymEnv:
        return GymEnv(StepLogEnv(self.log, self.die_at, self.pause))


def logged(log: Path) -> dict[int, int]:
    """The frames each process stepped, by pid, from the envs' log."""
    return {int(p.name): p.stat().st_size for p in log.iterdir() if p.name.isdigit()}


def delivered_by_pid(batches: list) -> dict[int, int]:
    pids = torch.cat([b["observation"][..., 0].reshape(-1) for b in batches]).long()
    return {int(p): int(n) for p, n in zip(*torch.unique(pids, return_counts=True))}


def assert_balanced(account: FrameAccount) -> None:
    assert account.stepped == account.delivered + account.dropped + account.lost + account.pending, account
    assert min(account.delivered, account.dropped, account.lost, account.pending) >= 0, account


KINDS = {
    "Collector": lambda f, **kw: Collector(f, BiasPolicy(1, size=3), frames_per_batch=FRAMES, **kw),
    "MultiSyncCollector": lambda f, **kw: MultiSyncCollector([f] * 2, BiasPolicy(1, size=3), frames_per_batch=2 * FRAMES,
                                                             rpc_timeout=60, **kw),
    "MultiAsyncCollector": lambda f, **kw: MultiAsyncCollector([f] * 2, BiasPolicy(1, size=3), frames_per_batch=FRAMES,
                                                               rpc_timeout=60, **kw),
    "RPCCollector": lambda f, **kw: RPCCollector([f] * 2, BiasPolicy(1, size=3), frames_per_batch=2 * FRAMES,
                                                 launcher="local", rpc_timeout=60, **kw),
    "DistributedCollector": lambda f, **kw: DistributedCollector([f] * 2, BiasPolicy(1, size=3),
                                                                 frames_per_batch=2 * FRAMES, launcher="mp", **kw),
    "AsyncBatchedCollector": lambda f, **kw: AsyncBatchedCollector([f] * 2, policy=BiasPolicy(1, size=3),
                                                                   frames_per_batch=2 * FRAMES, rpc_timeout=60, **kw),
    "debug": lambda f, **kw: MultiAsyncCollector([f] * 2, BiasPolicy(1, size=3), frames_per_batch=FRAMES,
                                                 launcher="debug", **kw),
}


# ------------------------------------------------------------------ the ledger alone
@st.composite
def runs(draw):
    """Events of a run of 3 worker ids: steps, answers taken in, hand-outs, drops and deaths."""
    return draw(st.lists(st.tuples(st.sampled_from(["step", "take", "hand", "drop", "die", "die-unknown"]),
                                   st.integers(0, 2), st.integers(1, 20)), max_size=60))


@settings(max_examples=200, deadline=None)
@given(runs())
def test_the_ledger_puts_every_stepped_frame_in_exactly_one_account(events):
    """A model of the workers: each process's frames move stepped -> taken in -> handed out or
    dropped; a death loses what its process stepped and no answer brought (or, unknown, counts
    only what the answers brought)."""
    ledger = Ledger(3)
    stepped, unanswered = [0] * 3, [0] * 3  # the serving process's
    held = delivered = dropped = lost = ended = 0
    for kind, worker, n in events:
        if kind == "step":
            stepped[worker] += n
            unanswered[worker] += n
        elif kind == "take":
            n = min(n, unanswered[worker])
            ledger.took(worker, n)
            unanswered[worker] -= n
            held += n
        elif kind in ("hand", "drop"):
            n = min(n, held)
            held -= n
            delivered, dropped = (delivered + n, dropped) if kind == "hand" else (delivered, dropped + n)
        else:
            known = kind == "die"
            ledger.process_ended(worker, stepped[worker] if known else None)
            lost += unanswered[worker] if known else 0
            ended += stepped[worker] if known else stepped[worker] - unanswered[worker]
            stepped[worker] = unanswered[worker] = 0
        account = ledger.account(sum(stepped), delivered, dropped)
        assert account == FrameAccount(ended + sum(stepped), delivered, dropped, lost, held + sum(unanswered))


def test_a_resumed_ledger_counts_the_saved_pending_frames_as_lost():
    saved = Ledger.state(FrameAccount(100, 60, 10, 5, 25))
    ledger = Ledger(2)
    ledger.took(0, 7)  # this run's frames before the load: 7 delivered, which the saved 60 replace
    ledger.load({"frames": 60, "accounts": saved}, forgotten=7)
    # stepped: the saved 100 and this run's 11, less the 7 delivered the load forgot; 4 pending
    assert ledger.account(7 + 4, 60, 10) == FrameAccount(104, 60, 10, 5 + 25, 4)


def test_a_state_saved_without_accounts_resumes_with_nothing_pending():
    ledger = Ledger(1)
    ledger.load({"frames": 40, "dropped": {"frames": 10, "batches": 1}}, forgotten=0)
    assert ledger.account(0, 40, 10) == FrameAccount(50, 40, 10, 0, 0)


# ------------------------------------------------------------------ collectors
@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_stepped_frame_is_delivered_or_pending_in_a_run_and_after_shutdown(kind, tmp_path):
    collector = KINDS[kind](LogEnvFactory(tmp_path), total_frames=6 * 2 * FRAMES)
    try:
        batches = [batch.clone() for batch in collector]
        running = collector.metrics().accounts
        assert_balanced(running)
        assert running.delivered == collector.frames == sum(b.numel() for b in batches)
        assert running.lost == running.dropped == 0
    finally:
        collector.shutdown()
    after = collector.metrics().accounts
    assert_balanced(after)
    assert after.stepped == sum(logged(tmp_path).values()), "the account's steps are not the envs' steps"
    assert after.stepped >= running.stepped and after.delivered == running.delivered
    assert after.lost == 0 and after.pending == after.stepped - after.delivered
    steps = logged(tmp_path)
    assert all(n <= steps[pid] for pid, n in delivered_by_pid(batches).items()), "a frame no env stepped"


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.filterwarnings("ignore::rpc_collectors.WorkerRestartWarning")
@pytest.mark.parametrize("kind", ["MultiSyncCollector", "MultiAsyncCollector", "RPCCollector"])
def test_a_killed_workers_unfinished_batch_is_lost_and_nothing_else(kind, tmp_path):
    """A worker that dies at its 25th step (mid-batch) is replaced; the frames it stepped that no
    batch brought are ``lost``, the rest of the run balances."""
    collector = KINDS[kind](LogEnvFactory(tmp_path, die_at=25), total_frames=-1, max_worker_restarts=1)
    batches = []
    # a survivor can deliver a fixed run alone before the death is reported: run until both
    deadline = time.monotonic() + 120  # allows for a loaded machine
    try:
        for batch in collector:
            batches.append(batch.clone())
            if sum(collector.worker_restarts) == 1 and len(batches) >= 10 * 2:
                break
            assert time.monotonic() < deadline, "the worker that killed itself was not replaced"
    finally:
        collector.shutdown()
    account, steps = collector.metrics().accounts, logged(tmp_path)
    assert_balanced(account)
    assert account.stepped == sum(steps.values())
    dead = int((tmp_path / "die").read_text())
    assert steps[dead] == 24, "the process that killed itself did not stop before its 25th step"
    assert account.lost == 24 - delivered_by_pid(batches).get(dead, 0) > 0
    assert account.delivered == collector.frames and account.dropped == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.filterwarnings("ignore::rpc_collectors.WorkerRestartWarning")
def test_a_batched_collectors_killed_env_worker_leaves_its_steps_pending(tmp_path):
    collector = KINDS["AsyncBatchedCollector"](LogEnvFactory(tmp_path, die_at=25), total_frames=10 * 2 * FRAMES,
                                               max_worker_restarts=1)
    try:
        for _ in collector:
            pass
        assert sum(collector.roster.counts) == 1, "the env worker that killed itself was not replaced"
    finally:
        collector.shutdown()
    account = collector.metrics().accounts
    assert_balanced(account)
    assert account.stepped == sum(logged(tmp_path).values()) and account.lost == 0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("kind", ["MultiSyncCollector", "MultiAsyncCollector"])
def test_a_shutdown_mid_round_leaves_the_round_pending(kind, tmp_path):
    """``shutdown()`` from another thread while a round of slow steps is in progress: the frames
    the workers stepped and no batch brought are pending, and stay so."""
    collector = KINDS[kind](LogEnvFactory(tmp_path, pause=0.01), total_frames=-1)
    batches = []
    try:
        batches.append(next(iter(collector)).clone())
        stopper = threading.Timer(0.1, collector.shutdown)  # 10 steps into the next round
        stopper.start()
        with pytest.raises(RuntimeError, match="shut down"):
            for batch in collector:
                batches.append(batch.clone())
        stopper.join(60)
    finally:
        collector.shutdown()
    account, steps = collector.metrics().accounts, logged(tmp_path)
    assert_balanced(account)
    assert account.stepped == sum(steps.values()) and account.lost == account.dropped == 0
    assert account.delivered == sum(b.numel() for b in batches) == collector.frames
    assert account.pending == sum(steps.values()) - account.delivered > 0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
def test_batches_dropped_for_their_lag_are_in_dropped(tmp_path):
    with MultiAsyncCollector([LogEnvFactory(tmp_path)] * 4, BiasPolicy(1, size=3), frames_per_batch=FRAMES,
                             max_policy_lag=0, policy_lag_mode="drop", rpc_timeout=60) as collector:
        for i, _ in enumerate(collector):
            collector.update_policy_weights_()
            if i == 20:
                break
        account = collector.metrics().accounts
        assert_balanced(account)
        assert account.dropped == collector.dropped_frames > 0 and account.lost == 0
    after = collector.metrics().accounts
    assert after.stepped == sum(logged(tmp_path).values())
    assert_balanced(after)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("kind", ["Collector", "MultiAsyncCollector", "MultiSyncCollector"])
def test_a_resumed_run_counts_on_and_loses_what_the_saved_run_had_pending(kind, tmp_path):
    first_log, second_log = tmp_path / "first", tmp_path / "second"
    first_log.mkdir()
    second_log.mkdir()
    with KINDS[kind](LogEnvFactory(first_log), total_frames=4 * 2 * FRAMES) as first:
        for _ in first:
            pass
        state = first.state_dict()
    saved = state["accounts"]  # the account when the state was saved (async workers step on)
    with KINDS[kind](LogEnvFactory(second_log), total_frames=8 * 2 * FRAMES) as second:
        second.load_state_dict(state)
        for _ in second:
            pass
    account = second.metrics().accounts
    assert_balanced(account)
    assert account.delivered == second.frames
    assert account.lost == saved["lost"] + saved["pending"]
    assert account.stepped == saved["stepped"] + sum(logged(second_log).values())
    assert second.metrics().scalars()["accounts/lost"] == account.lost


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("no_leftover_processes")
@pytest.mark.parametrize("cls,node_class", [(MultiSyncCollector, "sync"), (MultiAsyncCollector, "async")])
def test_node_collectors_report_their_local_workers_steps(cls, node_class, tmp_path):
    with cls([LogEnvFactory(tmp_path)] * 2, BiasPolicy(1, size=3), frames_per_batch=4 * FRAMES, total_frames=16 * FRAMES,
             collector_class=node_class, num_workers_per_collector=2, rpc_timeout=60) as collector:
        for _ in collector:
            pass
        account = collector.metrics().accounts
        assert_balanced(account)
        # the local workers may step on after the account was read, never before
        assert collector.frames <= account.stepped <= sum(logged(tmp_path).values())
    assert_balanced(collector.metrics().accounts)
