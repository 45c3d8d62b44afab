"""How a collector server (a rank of torchrun or SLURM) decides its exit code: 0 when its trainer
stopped it, 1 when the trainer is gone. SLURM fails the whole job (``--kill-on-bad-exit``) on a
task's non-zero exit, so a finished run must never end with a 1."""
from __future__ import annotations

import pytest

from rpc_collectors.worker import rpc_rank


@pytest.fixture
def stop_event(monkeypatch):
    monkeypatch.setattr(rpc_rank, "PING_EVERY", 0.01)
    rpc_rank._stop.clear()
    yield rpc_rank._stop
    rpc_rank._stop.clear()


def test_a_ping_that_fails_because_the_trainer_stopped_us_meanwhile_is_a_clean_exit(stop_event, monkeypatch, capsys):
    """The trainer stops every server, then its own agent: a ping sent just before the stop arrived
    fails with the agent gone. That is the end the trainer asked for: exit code 0, nothing said."""
    def ping_in_flight_at_the_stop(*args, **kwargs):
        rpc_rank._stop.set()  # what the trainer's stop() call does
        raise RuntimeError("RPCErr:1:RPC ran for more than set timeout")

    monkeypatch.setattr(rpc_rank.rpc, "rpc_sync", ping_in_flight_at_the_stop)
    assert rpc_rank.watch_trainer("rpc-worker0", 1, rpc_timeout=5.0) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("answer, said", [(RuntimeError("connection refused"), "the trainer is unreachable"),
                                          (False, "the trainer evicted this collector")])
def test_a_trainer_gone_without_stopping_us_is_an_exit_code_1_that_says_why(stop_event, monkeypatch, capsys, answer, said):
    def ping(*args, **kwargs):
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(rpc_rank.rpc, "rpc_sync", ping)
    assert rpc_rank.watch_trainer("rpc-worker0", 1, rpc_timeout=5.0) == 1
    assert said in capsys.readouterr().err
