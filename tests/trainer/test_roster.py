"""The roster of a collector's workers, without processes: who serves each worker id, its deaths,
the run's restart budget (``max_worker_restarts``), elastic joins and leaves, what a new
process in a slot continues from (trajectory ids, seed), and the weights each worker collects with."""
from __future__ import annotations

import warnings

import pytest

from rpc_collectors import WorkerRestartWarning
from rpc_collectors.trainer.roster import Roster


def serving(num_workers: int, max_worker_restarts: int, envs: int = 1) -> Roster:
    roster = Roster(num_workers, max_worker_restarts)
    for worker_id in range(num_workers):
        roster.served(worker_id, {"envs": envs, "pid": 100 + worker_id})
    return roster


def test_restarts_are_spent_over_all_workers_and_refused_past_max_worker_restarts():
    roster = serving(3, max_worker_restarts=2)
    with pytest.warns(WorkerRestartWarning, match=r"collector worker 0 died; replacing it \(1 of max_worker_restarts=2"):
        assert roster.take(0, "died")
    with pytest.warns(WorkerRestartWarning, match=r"collector worker 2 raised; replacing it \(0 of max_worker_restarts=2"):
        assert roster.take(2, "raised")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a refused restart warns of nothing: the caller raises WorkerError
        assert not roster.take(1, "died")
    assert roster.left == 0 and roster.counts == [1, 0, 1] and roster.worker_restarts == [1, 0, 1]
    assert roster.taken == [(0, "died"), (2, "raised")]


def test_no_restart_without_a_budget():
    roster = serving(2, max_worker_restarts=0)
    assert not roster.take(0, "died") and roster.counts == [0, 0] and roster.left == 0


def test_a_death_is_recorded_once_with_its_first_reason_until_the_worker_is_replaced():
    roster = serving(2, max_worker_restarts=1)
    roster.died(1, "died with exit code -9 (SIGKILL)")
    roster.died(1, "closed its connection")  # the same death, seen again
    assert roster[1].dead == "died with exit code -9 (SIGKILL)" and roster[0].dead is None
    with pytest.warns(WorkerRestartWarning):
        assert roster.take(1, roster[1].dead)
    roster.replaced(1)
    assert roster[1].dead is None and roster[1].info is None  # the new process has not reported yet
    roster.died(1, "raised in its env")
    assert roster[1].dead == "raised in its env"


def test_a_new_process_is_a_new_generation_and_is_asked_what_its_predecessor_left():
    roster = serving(2, max_worker_restarts=1)
    roster.asked(0, frames=10)
    roster.asked(0, frames=10)
    roster[0].answered()
    assert roster[0].generation == 0 and roster[0].outstanding == 1 and roster[0].requests == 2
    with pytest.warns(WorkerRestartWarning):
        roster.take(0, "died")
    roster.replaced(0)
    roster.served(0, {"envs": 1, "pid": 200})
    assert roster[0].generation == 1 and roster[0].info["pid"] == 200
    assert roster[0].redo == 1 and roster[0].outstanding == 0 and roster[0].requests == 0
    roster.asked(0, frames=10, again=True)  # into its predecessor's slot
    assert roster[0].redo == 0 and roster[0].outstanding == 1
    assert roster[1].generation == 0  # the other worker's process is the same


def test_elastic_leave_vacates_the_slot_without_the_budget_and_a_newcomer_starts_afresh():
    roster = serving(2, max_worker_restarts=0)
    roster.asked(1, frames=10)
    roster.left_slot(1)
    assert roster[1].info is None and roster[1].generation == 1 and roster[1].outstanding == roster[1].redo == 0
    assert roster.counts == [0, 1] and roster.worker_restarts == [0, 1]  # one collector left slot 1
    roster.joining(1)
    roster.served(1, {"envs": 1, "pid": 300})
    assert roster[1].generation == 2 and roster[1].info["pid"] == 300 and roster[1].redo == 0


def test_a_vacant_slot_is_served_by_no_process_until_a_newcomer_built_its_collector():
    roster = serving(3, max_worker_restarts=0)
    assert roster.serving() == [0, 1, 2]
    roster.left_slot(1)
    assert roster.serving() == [0, 2] and not roster[1].serving
    roster.joining(1)
    assert roster.serving() == [0, 2]  # taken, its collector not built yet
    roster.served(1, {"envs": 1, "pid": 300})
    assert roster.serving() == [0, 1, 2]


def test_a_record_holds_the_weights_version_its_worker_collects_with_and_when_the_next_push_is_due():
    record = serving(1, max_worker_restarts=1)[0]
    assert record.weights_version == 0 and not record.weights_due(after_each_batch=True, interval=-1)
    record.asked()
    record.answered()
    assert record.weights_due(after_each_batch=True, interval=-1)
    assert not record.weights_due(after_each_batch=False, interval=-1)  # no interval: only pushes
    assert not record.weights_due(after_each_batch=False, interval=1)  # one batch with these weights
    record.asked()
    record.answered()
    assert record.weights_due(after_each_batch=False, interval=1)  # two: more than max_weight_update_interval
    record.sent_weights(4)
    assert record.weights_version == 4 and not record.weights_due(after_each_batch=True, interval=0)
    record.loaded_weights(2)  # a resumed worker collects on with the version it saved
    assert record.weights_version == 2
    record.replaced()  # the version belongs to the slot: a new process is sent what the slot holds
    assert record.weights_version == 2


def test_new_processes_get_trajectory_ids_and_seeds_no_predecessor_used():
    roster = Roster(4, max_worker_restarts=2)
    roster.served(1, {"envs": 3})  # ids 1, 5, 9 at reset
    for _ in range(5):  # 5 batches of 10 frames: at most 10 ends and 3 resets each
        roster.asked(1, frames=10)
    roster.seeds[1] = 123
    with pytest.warns(WorkerRestartWarning, match=r"collector worker 1 crashed; replacing it \(1 of max_worker_restarts=2"):
        assert roster.take(1, "crashed")
    roster.replaced(1)
    first = roster.traj_id_start(1)
    assert first % 4 == 1 and first >= 1 + 4 * (3 + 5 * 13)  # above every id worker 1 could have used
    seed_1 = roster.seed(1)
    roster.served(1, {"envs": 3})
    roster.asked(1, frames=10)
    with pytest.warns(WorkerRestartWarning, match=r"\(0 of max_worker_restarts=2 restarts left\)"):
        assert roster.take(1, "crashed")
    assert roster.traj_id_start(1) >= first + 4 * 16
    assert len({123, seed_1, roster.seed(1)}) == 3 and roster.seed(1) == roster.seed(1)
    assert roster.seed(0) is None  # never seeded: the env seeds itself
    assert not roster.take(2, "crashed") and roster.counts == [0, 2, 0, 0]


def test_a_resumed_run_continues_ids_and_draws_new_seeds():
    roster = serving(2, max_worker_restarts=0)
    roster.seeds[:] = [7, 8]
    before = [roster.seed(0), roster.seed(1)]
    saved = roster.bounds()
    resumed = Roster(2, max_worker_restarts=0)
    resumed.restore(saved)
    resumed.seeds[:], resumed.resumes = [7, 8], 1
    assert [resumed.traj_id_start(i) for i in range(2)] == [roster.traj_id_start(i) for i in range(2)]
    assert resumed.seed(0) not in before and resumed.seed(1) not in before
