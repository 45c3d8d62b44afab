"""What ``collector.metrics()`` answers: a run's metrics, one frozen dataclass per group.

:class:`Metrics` holds the groups: the workers (:class:`WorkerMetrics`, one per worker process;
a node collector's local workers each have their own), the trainer's rounds
(:class:`RoundMetrics`), policy lag and drops (:class:`LagMetrics`), restarts, joins and leaves
(:class:`RosterMetrics`), weight pushes (:class:`PushMetrics`), the data plane
(:class:`DataPlaneMetrics`) and the results evaluators reported (:class:`EvaluationMetrics`).
:meth:`Metrics.scalars` flattens them into the ``name -> number`` that the exporters write. A
worker answers the trainer's ``phases`` call with :class:`WorkerPhases`, a few ints.

Times are seconds of the monotonic clock; totals count from the collector's start (a worker's
from its process's start: a replaced worker starts again from 0).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerPhases:
    """A worker process's answer to ``phases``: its frames and batches collected, and the
    nanoseconds of its phase clock in each phase (``idle``, ``weights``, ``policy``, ``env``,
    ``write``); ``worker_id`` is the flat run's id (a node's local worker ``w`` of node ``i``:
    ``i * W + w``); ``stepped``: the frames its envs stepped, its batch in progress too."""

    worker_id: int
    pid: int
    frames: int
    batches: int
    phase_ns: dict[str, int]
    stepped: int = 0


@dataclass(frozen=True)
class WorkerMetrics:
    """One worker process, from its own clock. An env worker of ``AsyncBatchedCollector`` runs no
    policy and builds no batch: its ``frames`` are its envs' steps, ``batches``, ``weights_s`` and
    ``policy_s`` are 0, ``idle_s`` is its wait for actions (the trainer computing them), ``env_s``
    its env steps with the copies of their results into the step plane's rows, and ``write_s``
    telling the trainer those rows are ready (the ready bytes).

    Attributes:
        worker_id: the worker's id (a node's local worker ``w`` of node ``i``: ``i * W + w``).
        pid: its process id.
        frames: frames it collected since its process started (dropped ones too).
        batches: batches it collected.
        stepped: frames its envs stepped, its batch in progress too.
        frames_per_s: ``frames`` over the time its clock counted (the sum of the phases below).
        idle_s: waiting for the trainer's next request (between its batches).
        weights_s: applying new weights before a batch.
        policy_s: in policy calls (a rollout's time but its env steps').
        env_s: in env steps (resets, the step record): a sample of a rollout's steps timed, their
            mean counted for each step (every step while a trace window is open).
        write_s: building the batch and writing it into its shared-memory slot.
    """

    worker_id: int
    pid: int
    frames: int
    batches: int
    frames_per_s: float
    idle_s: float
    weights_s: float
    policy_s: float
    env_s: float
    write_s: float
    stepped: int = 0

    @classmethod
    def of(cls, phases: WorkerPhases) -> WorkerMetrics:
        seconds = {name: ns / 1e9 for name, ns in phases.phase_ns.items()}
        counted = sum(seconds.values())
        return cls(phases.worker_id, phases.pid, phases.frames, phases.batches,
                   phases.frames / counted if counted > 0 else 0.0, seconds["idle"],
                   seconds["weights"], seconds["policy"], seconds["env"], seconds["write"],
                   phases.stepped)


@dataclass(frozen=True)
class RoundMetrics:
    """The trainer's side of each batch handed out (a sync round, or one async batch), from asking
    for it to handing it out.

    Attributes:
        rounds: batches handed out.
        wait_s: waiting for the workers' answers (and for pushes to be acknowledged) in those
            rounds.
        busy_s: the rest: the trainer's own work (requests, receiving and combining batches, handing
            out; a single-process collector's: its rollout), in wall-clock time.
        handout_s: of ``busy_s``, from a batch's arrival to its hand-out (storing device,
            ``postproc``, hooks). last_wait_s, last_busy_s, last_handout_s: the same, of the last
            batch.
    """

    rounds: int = 0
    wait_s: float = 0.0
    busy_s: float = 0.0
    handout_s: float = 0.0
    last_wait_s: float = 0.0
    last_busy_s: float = 0.0
    last_handout_s: float = 0.0


@dataclass(frozen=True)
class LagMetrics:
    """Policy lag of the batches handed out (:attr:`BatchRecord.lag
    <rpc_collectors.single_process.batch_record.BatchRecord.lag>`), and what was dropped.

    Attributes:
        min: the smallest ``min_lag`` (the newest frame's) of any batch.
        mean: the mean ``lag`` (the oldest frame's) over the batches.
        max: the largest ``lag`` of any batch.
        last: the last batch's ``lag``. dropped_frames, dropped_batches: collected and not handed
            out (``max_policy_lag``, cut streams).
    """

    min: int = 0
    mean: float = 0.0
    max: int = 0
    last: int = 0
    dropped_frames: int = 0
    dropped_batches: int = 0


@dataclass(frozen=True)
class FrameAccount:
    """Where every frame the envs stepped went: ``stepped = delivered + dropped + lost +
    pending``, exactly (:mod:`~rpc_collectors.trainer.frame_ledger` owns it).

    Attributes:
        stepped: env steps, one frame per env each (a worker's counted in shared memory, so a
            worker that died mid-batch counts what it stepped).
        delivered: frames handed out (``collector.frames``).
        dropped: frames brought in and not handed out (``lag.dropped_frames``).
        lost: frames stepped that never came in: the unfinished batch of a worker that died, and
            what a stopped run had pending when it saved the state this run resumed from.
        pending: stepped, not handed out yet: in a worker's batch in progress, or in the trainer
            (a batch held for its weights, a round not complete); after ``shutdown()``, what was
            pending then.
    """

    stepped: int = 0
    delivered: int = 0
    dropped: int = 0
    lost: int = 0
    pending: int = 0


@dataclass(frozen=True)
class RosterMetrics:
    """Who serves the collector.

    Attributes:
        workers: worker slots (``num_workers``).
        alive: slots served by a live process.
        restarts: processes replaced (``max_worker_restarts``), a node's local workers included.
        joins: collectors that took a slot of an elastic run.
        leaves: collectors that left an elastic run.
    """

    workers: int = 1
    alive: int = 1
    restarts: int = 0
    joins: int = 0
    leaves: int = 0


@dataclass(frozen=True)
class PushMetrics:
    """Weight pushes (``update_policy_weights_`` and the pushes the collector makes itself).

    A multi-process collector's push is split into four phases, each a total over the pushes
    (its ``last_*``: the last push's). The first three are the trainer's, back to back from the
    push's start to its last acknowledgement; apply is the workers'. A single-process
    ``Collector`` applies its own weights: its phases stay 0.

    Attributes:
        count: pushes made.
        bytes: the weights' bytes pushed, each push counted once (however many workers got it).
        ack_s: total time from each push until every worker it went to acknowledged it (counted
            from the end of its pause: the weights packed and the transport started).
        last_ack_s, max_ack_s: that time, of the last push and the longest.
        pause_s: the trainer's collecting stopped for the push: copying the weights out of the
            policy into the send buffer (with ``weight_transport="shm"``, the shared-memory slot
            the workers read), before the transfer can start.
        transfer_s: the bytes moving: starting the broadcast or the sends and sending each worker
            its call (with ``"rpc"``, the weights in it), then the slowest worker's receipt of the
            bytes, timed by that worker (a broadcast, a point-to-point receive, a copy out of a
            shared-memory slot; none with ``"shm"`` to every worker: each reads the slot as it
            applies).
        acknowledge_s: the rest, until the last worker's acknowledgement reached the trainer: the
            calls' way there and back, and the wait for workers busy answering another call.
        apply_s: the workers copying the received weights into their policies (before their
            next batch), each version's slowest worker's, as the workers timed it; a worker tells
            it with its acknowledgement of the next push, so the last push's apply counts once
            the push after it is acknowledged.
        last_pause_s, last_transfer_s, last_acknowledge_s, last_apply_s: those of the last push
            (``last_apply_s``: of the newest version whose apply was told).
    """

    count: int = 0
    bytes: int = 0
    ack_s: float = 0.0
    last_ack_s: float = 0.0
    max_ack_s: float = 0.0
    pause_s: float = 0.0
    transfer_s: float = 0.0
    acknowledge_s: float = 0.0
    apply_s: float = 0.0
    last_pause_s: float = 0.0
    last_transfer_s: float = 0.0
    last_acknowledge_s: float = 0.0
    last_apply_s: float = 0.0


@dataclass(frozen=True)
class DataPlaneMetrics:
    """Batches moved from the workers to the trainer.

    Attributes:
        bytes: the bytes of the batches received (their tensors' size), dropped ones included.
        bytes_per_s: ``bytes`` over the run's time so far.
    """

    bytes: int = 0
    bytes_per_s: float = 0.0


@dataclass(frozen=True)
class InferenceMetrics:
    """The inference loop of a batched-inference collector (``AsyncBatchedCollector``): the thread
    of the trainer's process that runs the policy for the ready envs, on that thread's clock.

    Attributes:
        passes: forward passes of the policy.
        envs: env steps acted for: the envs of those passes, all together.
        envs_per_pass: ``envs`` over ``passes`` (at most ``max_batch_size``).
        wait_s: waiting for envs to be ready (their workers stepping them; ``min_batch_size``'s
            wait; replacing failed env workers).
        policy_s: in forward passes: reading the ready envs' observations, the policy call (and the
            wait for ``update_policy_weights_``, which holds its lock), writing the actions back.
        record_s: recording the transitions completed into batches (and, after each pass, what chose
            its actions), handing full ones to you (and waiting while ``prefetch`` of them wait for
            you).
    """

    passes: int = 0
    envs: int = 0
    envs_per_pass: float = 0.0
    wait_s: float = 0.0
    policy_s: float = 0.0
    record_s: float = 0.0


@dataclass(frozen=True)
class EvaluationMetrics:
    """The results an ``Evaluator`` reported to this collector (``Evaluator(metrics=collector)``),
    one group per ``log_prefix``.

    Attributes:
        prefix: the evaluator's ``log_prefix``.
        results: results reported.
        last: the last result's numbers by their names in the result (``"eval/reward"``,
            ``"eval/step"``, ``"eval/policy_version"``, ...).
    """

    prefix: str
    results: int
    last: dict[str, float]


# the names scalars() gives the run's numbers and groups
GROUPS = ("rounds", "lag", "roster", "pushes", "data_plane", "accounts")
TAKEN = ("elapsed_s", "frames", "frames_per_s", *GROUPS, "inference", "workers")


def shadows(prefix: str) -> bool:
    """Whether an evaluation's names, ``"<prefix>/..."``, could be those of the run's numbers."""
    return prefix.split("/", 1)[0] in TAKEN


@dataclass(frozen=True)
class Metrics:
    """A run's metrics (``collector.metrics()``).

    Attributes:
        elapsed_s: seconds since the collector started.
        frames: frames handed out (``collector.frames``).
        frames_per_s: ``frames`` over ``elapsed_s``.
        rounds, lag, roster, pushes, data_plane: the groups above.
        workers: one per worker process, by ``worker_id``.
        inference: the inference loop of a batched-inference collector (None: a collector without
            one).
        accounts: where the frames the envs stepped went.
        evaluations: the evaluators' results reported to this collector, by prefix.
    """

    elapsed_s: float
    frames: int
    frames_per_s: float
    rounds: RoundMetrics
    lag: LagMetrics
    roster: RosterMetrics
    pushes: PushMetrics
    data_plane: DataPlaneMetrics
    workers: tuple[WorkerMetrics, ...] = ()
    inference: InferenceMetrics | None = None
    accounts: FrameAccount = FrameAccount()
    evaluations: tuple[EvaluationMetrics, ...] = ()

    def scalars(self) -> dict[str, float]:
        """Every number by name: ``"frames_per_s"``, ``"lag/max"``,
        ``"workers/3/env_s"``, ``"inference/passes"``, an evaluation's ``"eval/reward"`` and
        ``"eval/results"``, ..."""
        out: dict[str, float] = {"elapsed_s": self.elapsed_s, "frames": self.frames,
                                 "frames_per_s": self.frames_per_s}
        for group in GROUPS:
            for name, value in dataclasses.asdict(getattr(self, group)).items():
                out[f"{group}/{name}"] = value
        if self.inference is not None:
            inference = dataclasses.asdict(self.inference)
            out.update({f"inference/{name}": value for name, value in inference.items()})
        for worker in self.workers:
            for name, value in dataclasses.asdict(worker).items():
                if name != "worker_id":
                    out[f"workers/{worker.worker_id}/{name}"] = value
        for evaluation in self.evaluations:
            out.update(evaluation.last)
            out[f"{evaluation.prefix}/results"] = evaluation.results
        return out
