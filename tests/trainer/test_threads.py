"""The inference thread's torch threads: the rule of ``inference_threads``."""
from __future__ import annotations

import os

import pytest

from rpc_collectors.trainer.threads import inference_threads


@pytest.mark.parametrize("cores, env_processes, envs, current, threads", [
    (2, 2, 2, 2, 1),  # every core steps an env: one thread, as Sample Factory's inference worker
    (2, 1, 64, 2, 1),
    (2, 8, 8, 2, 1),  # more env processes than cores: still one
    (16, 2, 2, 16, 1),  # a forward pass of two rows: one thread, whatever the cores left over
    (16, 2, 4, 16, 1),
    (16, 2, 64, 16, 4),  # one per 16 envs
    (16, 8, 1024, 16, 8),  # at most the cores left over
    (64, 2, 1024, 8, 8),  # never more than torch uses now
])
def test_the_default_is_one_thread_per_sixteen_envs_within_the_cores_left_at_least_one(cores, env_processes, envs,
                                                                                        current, threads):
    assert inference_threads(None, env_processes, envs, cores=cores, current=current) == threads


def test_the_default_reads_this_processs_cores_and_torchs_count(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    monkeypatch.setattr("torch.get_num_threads", lambda: 32)
    assert inference_threads(None, 2, 256) == 4


def test_a_given_count_is_kept_whatever_the_cores():
    assert inference_threads(3, 8, 8, cores=2, current=2) == 3
