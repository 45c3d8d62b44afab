"""The inference thread's torch threads: the rule of ``inference_threads``."""
from __future__ import annotations

import os

import pytest

from rpc_collectors.trainer.threads import inference_threads


@pytest.mark.parametrize("cores, env_processes, current, threads", [
    (2, 2, 2, 1),  # every core steps an env: one thread, as Sample Factory's inference worker
    (2, 1, 2, 1),
    (2, 8, 2, 1),  # more env processes than cores: still one
    (16, 2, 16, 14),  # the cores left over
    (16, 8, 16, 8),
    (64, 2, 8, 8),  # never more than torch uses now
])
def test_the_default_is_the_cores_left_by_the_env_processes_at_least_one(cores, env_processes, current, threads):
    assert inference_threads(None, env_processes, cores=cores, current=current) == threads


def test_the_default_reads_this_processs_cores_and_torchs_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.setattr("torch.get_num_threads", lambda: 32)
    assert inference_threads(None, 2) == 4


def test_a_given_count_is_kept_whatever_the_cores():
    assert inference_threads(3, 8, cores=2, current=2) == 3
