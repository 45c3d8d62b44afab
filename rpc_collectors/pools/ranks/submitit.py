"""Collector jobs that the trainer submits to SLURM (``launcher="submitit"``),
members of its RPC group.

The trainer starts a dynamic RPC group, as an elastic trainer does, and submits one job per
collector (:mod:`rpc_collectors.cluster.jobs`); each job joins the group. With
``elastic=True`` the jobs are slots' members like any joiner: one that fails to start or ends
leaves its slot vacant. Otherwise the constructor waits until every job joined (a job that
ends first is an error naming it and its log), and slot i is served by the i-th rank drawn,
so a failure is a :class:`~rpc_collectors.core.errors.WorkerError` as in any fixed world.
A job that SLURM ends (time limit, preemption, node failure) is submitted again
(:meth:`~rpc_collectors.cluster.jobs.CollectorJobs.resubmit_ended`): elastic, the new job joins a
vacant slot; otherwise, with ``max_worker_restarts``, it replaces the failed worker
(:meth:`SubmititPool.replace`).
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from typing import Callable

import submitit

from rpc_collectors.cluster.elastic import JOIN_VARIABLE
from rpc_collectors.cluster.jobs import CollectorJobs, trainer_interface
from rpc_collectors.pools.ranks.elastic_pool import ElasticPool
from rpc_collectors.transport.rendezvous import Rendezvous, free_port, interface_address

# how often the constructor asks SLURM about jobs that have not joined yet
STATE_POLL_S = 2.0
# how often SLURM is asked which collector jobs it ended
RESUBMIT_POLL_S = 10.0


class SubmititPool(ElasticPool):
    """``num_workers`` collector jobs submitted by this process, which serves as their trainer."""

    port_argument = "tcp_port"

    def __init__(
        self, executor: submitit.AutoExecutor, num_workers: int, rpc_timeout: float,
        join_timeout: float, tcp_port: int | None, elastic: bool, on_arrival: Callable[[int], None],
    ) -> None:
        interface = trainer_interface()
        address = interface_address(interface)
        port = tcp_port or free_port(address)
        rdv = Rendezvous("submitit", 0, num_workers + 1, address, port, interface, dynamic=True)
        self.jobs = CollectorJobs(executor, uuid.uuid4().hex[:12])
        self._joined: list[int] = []
        self._changed = threading.Condition()
        self._closing = threading.Event()
        self._resubmitter: threading.Thread | None = None
        # ranks that served a slot (non-elastic)
        self._used: set[int] = set()
        # worker id -> resubmissions when a wait for its replacement timed out
        self._waited_out: dict[int, int] = {}
        self.join_timeout = join_timeout
        super().__init__(rdv, num_workers, rpc_timeout,
                         on_arrival if elastic else self._joined_at_start)
        try:
            self.jobs.submit(num_workers, address, port, join_timeout, rpc_timeout)
            if not elastic:
                self.ranks = self._await_jobs(join_timeout)
                self._used.update(self.ranks)
            self._resubmitter = threading.Thread(target=self._resubmit, name="collector-jobs",
                                                 daemon=True)
            self._resubmitter.start()
        except BaseException:
            self.close()
            raise

    def _joined_at_start(self, rank: int) -> None:
        with self._changed:
            self._joined.append(rank)
            self._changed.notify_all()

    def _await_jobs(self, timeout: float) -> list:
        """Wait until every job joined; a job that ends first raises, naming it and its log."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._joined) < self.num_workers:
                ended = self.jobs.ended()
                if ended:
                    job_id, state = next(iter(ended.items()))
                    raise RuntimeError(
                        f"collector job {job_id} ended as {state} before it joined the trainer "
                        f"({len(self._joined)} of {self.num_workers} jobs joined); "
                        f"{self.jobs.describe(job_id)}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{self.num_workers - len(self._joined)} of {self.num_workers} collector "
                        f"jobs ({', '.join(j.job_id for j in self.jobs.jobs)}) did not join the "
                        f"trainer within join_timeout={timeout:g} s; see `squeue` (still pending?) "
                        f"and their logs in {self.jobs.folder}"
                    )
                self._changed.wait(min(STATE_POLL_S, remaining))
            return sorted(self._joined)[: self.num_workers]

    def replace(self, worker_id: int) -> None:
        """Non-elastic, with ``max_worker_restarts``: the job serving ``worker_id`` failed. A
        job that SLURM ended is submitted again (see :meth:`_resubmit`); the first collector
        that joins from such a job serves ``worker_id``. A :class:`WorkerError` if none joins
        within ``join_timeout``."""
        resubmitted = len(self.jobs.resubmitted)
        # nothing was submitted since the last wait: no newcomer
        if self._waited_out.get(worker_id) == resubmitted:
            raise self.error(worker_id, self._no_replacement())
        self.vacate(worker_id)
        deadline = time.monotonic() + self.join_timeout
        with self._changed:
            while True:
                newcomers = sorted(set(self._joined) - self._used)
                if newcomers:
                    self.ranks[worker_id] = newcomers[0]
                    self._used.add(newcomers[0])
                    self._waited_out.pop(worker_id, None)
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._waited_out[worker_id] = len(self.jobs.resubmitted)
                    raise self.error(worker_id, self._no_replacement())
                self._changed.wait(min(STATE_POLL_S, remaining))

    def _no_replacement(self) -> str:
        try:
            ended = ", ".join(f"{i} {s}" for i, s in self.jobs.ended().items()) or "none"
        except Exception as err:
            # sacct failed: the reason goes without the jobs' states
            ended = f"unknown ({err})"
        return ("failed, and no collector job joined in its place within "
                f"join_timeout={self.join_timeout:g} s (collector jobs are submitted again only "
                "when SLURM ended them by a time limit, a preemption or a node failure, at most "
                f"max_resubmits={self.jobs.max_resubmits} times; submitted again so far: "
                f"{len(self.jobs.resubmitted)}; jobs that ended: {ended}; logs in "
                f"{self.jobs.folder})")

    def _resubmit(self) -> None:
        """Submit a job again for each one SLURM ended, until the pool closes."""
        while not self._closing.wait(RESUBMIT_POLL_S):
            try:
                self.jobs.resubmit_ended()
            except (OSError, subprocess.SubprocessError, RuntimeError) as err:
                # sacct or sbatch failed: next time
                print(f"rpc_collectors: could not check or resubmit collector jobs ({err}); trying "
                      "again",
                      file=sys.stderr, flush=True)

    def failure(self, worker_id: int, err: BaseException) -> tuple[str, str]:
        """As any rank's failure, with the jobs that ended by now (a cancelled
        job, one out of time)."""
        reason, remote = super().failure(worker_id, err)
        ended = self.jobs.ended()
        if ended:
            states = ", ".join(f"{i} {s}" for i, s in ended.items())
            reason += " (SLURM jobs that ended: " + states + ")"
        return reason, remote

    def join_advice(self) -> str:
        """The jobs that ended, and what brings collectors back: these jobs are
        submitted only at the start."""
        try:
            ended = self.jobs.ended()
        except Exception as err:
            # sacct failed: the advice goes without the jobs' states
            ended = {"?": f"unknown ({err})"}
        states = ", ".join(f"{job_id} {state}" for job_id, state in ended.items()) or "none"
        return (f"this trainer's collector jobs that ended: {states} (logs in {self.jobs.folder}); "
                "launcher='submitit' submits its jobs when the collector starts (and again those "
                f"SLURM ended): start the run again, or start collectors with "
                f"{JOIN_VARIABLE}={self.rdv.master_addr}:{self.rdv.master_port}")

    def close(self, timeout: float = 2.0) -> None:
        self._closing.set()
        if self._resubmitter is not None:
            self._resubmitter.join(timeout=60)
        # stops the collectors: their jobs complete
        super().close(timeout)
        self.jobs.end()
