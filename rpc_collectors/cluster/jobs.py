"""Collector jobs that the trainer submits to SLURM itself (``launcher="submitit"``).

The trainer serves its rendezvous store, writes where it is to
``<folder>/<session>_rendezvous.json`` and submits one single-task job per collector with
``submitit.AutoExecutor(folder=...)``; each job reads that file and joins the trainer's
dynamic RPC group as any elastic collector does (:func:`collector_job`, see
:mod:`rpc_collectors.cluster.elastic`). The jobs end when the trainer stops their collectors;
:meth:`CollectorJobs.end` cancels those still queued or running a few seconds later, and a
guard process (:mod:`rpc_collectors.cluster.job_guard`) cancels them if the trainer dies first.
A job that SLURM ends by its time limit, a preemption or a node failure is submitted again
(:meth:`CollectorJobs.resubmit_ended`, at most ``slurm_kwargs["max_resubmits"]`` times in a run).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import submitit

from rpc_collectors.cluster.elastic import join_rendezvous, member_rendezvous
from rpc_collectors.cluster.requeue import unblock, usr_signal
from rpc_collectors.cluster.submission import _write_json, setup_join_env
from rpc_collectors.cluster.task_start import python_command
from rpc_collectors.transport.rendezvous import interface_address, interface_towards
from rpc_collectors.worker.rpc_rank import serve_rank

# TorchRL's time limit (its DEFAULT_SLURM_CONF); partition and CPUs per task are
# the cluster's defaults
DEFAULT_SLURM_KWARGS = {"timeout_min": 10}
# TorchRL's folder for the jobs' logs, in the working directory, when slurm_kwargs has none
DEFAULT_FOLDER = "log_test"
# collector jobs submitted again in a run, after SLURM ended them
DEFAULT_MAX_RESUBMITS = 10
# the ends that are SLURM's, not the collector's
RESUBMITTED_STATES = ("TIMEOUT", "PREEMPTED", "NODE_FAIL")
# how long stopped collectors' jobs get to complete before they are cancelled
END_GRACE_S = 5.0
POLL_S = 0.2


def executor(slurm_kwargs: Any) -> submitit.AutoExecutor:
    """The submitit executor of the collector jobs, from ``slurm_kwargs``
    (checked; no job is submitted).

    ``slurm_kwargs["folder"]`` is where the jobs' logs go (see :func:`writable_folder`), by default
    :data:`DEFAULT_FOLDER` in the working directory, as TorchRL's (the executor's ``default_folder``
    says so); the other keys are ``submitit.AutoExecutor.update_parameters``'s (``timeout_min``,
    ``slurm_partition``, ...), and ``"max_resubmits"`` (kept as the executor's ``max_resubmits``).
    """
    example = "{'folder': '/shared/logs/run1', 'slurm_partition': 'cpu', 'timeout_min': 120}"
    given = {} if slurm_kwargs is None else slurm_kwargs
    if not isinstance(given, dict) or ("folder" in given and not given["folder"]):
        raise ValueError(
            f"slurm_kwargs={slurm_kwargs!r} is invalid for launcher='submitit'; accepted: None or "
            f"a dict such as {example} ('folder': where the collector jobs' logs go, one every "
            f"node can read; without it ./{DEFAULT_FOLDER}, as TorchRL)"
        )
    resubmits = given.get("max_resubmits", DEFAULT_MAX_RESUBMITS)
    if not isinstance(resubmits, int) or isinstance(resubmits, bool) or resubmits < 0:
        raise ValueError(f"slurm_kwargs['max_resubmits']={resubmits!r} is invalid; accepted: an "
                         "int >= 0, how many collector jobs ended by SLURM (time limit, "
                         "preemption) are submitted again in a run")
    params = {**DEFAULT_SLURM_KWARGS,
              **{k: v for k, v in given.items() if k not in ("folder", "max_resubmits")}}
    try:
        jobs = submitit.AutoExecutor(folder=given.get("folder", DEFAULT_FOLDER), cluster="slurm",
                                     slurm_python=python_command())
        jobs.update_parameters(**params)
    except (AssertionError, NameError, TypeError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"slurm_kwargs={slurm_kwargs!r} is invalid: {reason}; accepted: 'folder' and the "
            f"parameters of submitit.AutoExecutor.update_parameters, e.g. {example}"
        ) from err
    jobs.max_resubmits = resubmits
    jobs.default_folder = "folder" not in given
    return jobs


def writable_folder(jobs: submitit.AutoExecutor) -> None:
    """Make the jobs' folder if it is missing and check this process can write there (the
    trainer's rendezvous file and submitit's job files go there); a
    ``ValueError`` names it otherwise."""
    path = Path(jobs.folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path, prefix=".rpc-collectors-"):
            pass
    except OSError as err:
        named = f": {err.filename}" if err.filename else ""
        reason = f"{err.strerror or type(err).__name__}" + named
        if jobs.default_folder:
            name = f"the collector jobs' folder {str(path)!r} (slurm_kwargs has no 'folder')"
        else:
            name = f"slurm_kwargs['folder']={str(path)!r}"
        raise ValueError(
            f"{name} is not a folder this process can write ({reason}); accepted: "
            "a folder this process can create or write, on a file system every node reads"
        ) from None


def trainer_interface() -> str:
    """The network interface where collector jobs reach the trainer: ``TP_SOCKET_IFNAME`` or
    ``GLOO_SOCKET_IFNAME`` when set, else the one that routes to the SLURM controller."""
    interface = os.environ.get("TP_SOCKET_IFNAME") or os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        # a wrong name fails here, with the list of interfaces
        interface_address(interface)
        return interface
    return interface_towards(controller_address())


def controller_address() -> str:
    """The SLURM controller's address (``scontrol show config``'s SlurmctldHost)."""
    try:
        proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                              timeout=30)
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1] if proc.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as err:
        reason = str(err)
    if reason:
        raise RuntimeError("launcher='submitit' needs a SLURM cluster this process can submit to; "
                           f"`scontrol show config` failed ({reason}): check SLURM_CONF and that "
                           "the controller runs")
    match = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", proc.stdout,
                      re.MULTILINE)
    if match is None:
        raise RuntimeError(
            "`scontrol show config` names no SlurmctldHost; set TP_SOCKET_IFNAME to the interface "
            "where the collector jobs reach this trainer"
        )
    return match.group(2) or match.group(1)


def collector_job(rendezvous_file: str, join_timeout: float, rpc_timeout: float) -> int:
    """A collector job's task: join the trainer whose rendezvous is in ``rendezvous_file`` and
    serve a collector until the trainer stops it."""
    # submitit's signal before the time limit: the trainer resubmits us
    signal.signal(usr_signal(), signal.SIG_IGN)
    # the task started with it blocked (see task_start), so that it cannot end the task as it starts
    unblock()
    setup_join_env(Path(rendezvous_file), wait_s=join_timeout)
    code = serve_rank(member_rendezvous(join_rendezvous(), join_timeout), rpc_timeout)
    if code:
        raise RuntimeError("this collector lost its trainer (see the lines above)")
    return code


class CollectorJobs:
    """The collector jobs of one trainer: submitted, watched, and ended (or cancelled)."""

    def __init__(self, jobs: submitit.AutoExecutor, session: str) -> None:
        self.executor = jobs
        self.folder = Path(jobs.folder)
        self.rendezvous = self.folder / f"{session}_rendezvous.json"
        self.jobs: list[submitit.Job] = []
        # (job id, the state it ended in, its successor's id)
        self.resubmitted: list[tuple[str, str, str]] = []
        self.max_resubmits = getattr(jobs, "max_resubmits", DEFAULT_MAX_RESUBMITS)
        self.default_folder = getattr(jobs, "default_folder", False)
        # ended jobs already looked at
        self._seen: set[str] = set()
        self._args: tuple = ()
        self._lock = threading.Lock()
        self._guard: subprocess.Popen | None = None

    def submit(self, count: int, address: str, port: int, join_timeout: float,
               rpc_timeout: float) -> None:
        """Write the trainer's rendezvous and submit ``count`` collector jobs that join it; one line
        on stderr says where their logs go when ``slurm_kwargs`` named no folder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.default_folder:
            print(f"rpc_collectors: the collector jobs' logs go to {self.folder} (slurm_kwargs has "
                  "no 'folder')",
                  file=sys.stderr, flush=True)
        _write_json(self.rendezvous, {"master_addr": address, "master_port": port})
        guard = Path(__file__).with_name("job_guard.py")
        self._guard = subprocess.Popen(
            [sys.executable, "-I", str(guard)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, text=True,
        )
        self._args = (str(self.rendezvous), join_timeout, rpc_timeout)
        for _ in range(count):
            self._submit_one()

    def _submit_one(self) -> submitit.Job:
        with self._lock:
            job = self.executor.submit(collector_job, *self._args)
            self.jobs.append(job)
            self._guard.stdin.write(f"{job.job_id}\n")
            self._guard.stdin.flush()
        return job

    def ended(self) -> dict[str, str]:
        """The jobs that ended (id: SLURM state), as SLURM's accounting reports them now."""
        with self._lock:
            watcher = submitit.SlurmJob.watcher
            # one sacct call for every job
            watcher.update()
            return {job.job_id: watcher.get_state(job.job_id, mode="cache") for job in self.jobs
                    if watcher.is_done(job.job_id, mode="cache")}

    def resubmit_ended(self) -> list[str]:
        """Submit a job again for each that SLURM ended (time limit, preemption, node
        failure) since the last call, while ``max_resubmits`` lasts; the new jobs' ids. One
        line on stderr for each."""
        new = []
        for job_id, state in self.ended().items():
            if job_id in self._seen:
                continue
            self._seen.add(job_id)
            if state.split()[0] not in RESUBMITTED_STATES:
                continue
            if len(self.resubmitted) >= self.max_resubmits:
                print(f"rpc_collectors: collector job {job_id} ended as {state}; not submitted "
                      f"again (max_resubmits={self.max_resubmits} used)", file=sys.stderr,
                      flush=True)
                continue
            job = self._submit_one()
            self.resubmitted.append((job_id, state, job.job_id))
            new.append(job.job_id)
            print(f"rpc_collectors: collector job {job_id} ended as {state}; submitted job "
                  f"{job.job_id} in its place ({len(self.resubmitted)} of "
                  f"max_resubmits={self.max_resubmits})", file=sys.stderr, flush=True)
        return new

    def describe(self, job_id: str) -> str:
        """A job's log, and its last lines."""
        job = next(j for j in self.jobs if j.job_id == job_id)
        text = (job.stderr() or "").strip().splitlines()[-5:]
        return f"its log: {job.paths.stderr}" + ("\n" + "\n".join(text) if text else "")

    def queued(self) -> list[str]:
        """The ids of the jobs SLURM still lists (pending, running or completing)."""
        ids = [job.job_id for job in self.jobs]
        if not ids:
            return []
        out = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(ids)], capture_output=True,
                             text=True, timeout=30).stdout
        return [line.strip() for line in out.splitlines() if line.strip() in ids]

    def end(self, grace: float = END_GRACE_S) -> None:
        """Give the jobs ``grace`` seconds to complete, cancel the rest (the guard does), remove
        the rendezvous file."""
        deadline = time.monotonic() + grace
        try:
            while self.queued() and time.monotonic() < deadline:
                time.sleep(POLL_S)
        except (OSError, subprocess.TimeoutExpired):
            # squeue failed: the guard cancels them all
            pass
        if self._guard is not None:
            # the guard cancels every job still there
            self._guard.stdin.close()
            self._guard.wait(timeout=150)
            self._guard = None
        self.rendezvous.unlink(missing_ok=True)
