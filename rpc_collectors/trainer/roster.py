"""The workers of a multi-worker collector, by worker id (slot): who serves each, and the run's
restarts.

:class:`Roster` is one part of the collector front: the record of the process serving each worker
id (:class:`WorkerRecord`: its generation, what it reported of itself, its death, its requests),
the budget of replacements (``max_worker_restarts``) and how often each id was replaced or left,
and what a new process in a slot continues from (trajectory ids, seed). The front and its recovery
change it only through the transitions of :class:`Roster`.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rpc_collectors.transport.membership import WorkerRestartWarning


@dataclass
class WorkerRecord:
    """What the trainer knows of the process serving one worker id, changed only by the
    transitions below.

    ``generation`` tells processes apart: answers of one that was replaced are dropped.
    ``info`` is what the process reported of itself (None: vacant, or not built yet).
    ``dead`` is why it died, as its pool first reported it, until it is replaced. ``outstanding``
    counts its batch requests in flight; ``redo`` the requests a failed predecessor left
    unanswered, which its replacement is asked again (into the same slots); ``stale`` those of its
    outstanding requests that were asked before its stream was cut (:mod:`.continuity`), whose
    answers are dropped as they come. ``requests`` counts
    the batches this process was asked for (the number of the latest). ``serving_since`` is when
    it began on the oldest request it has not answered (asked, or its previous answer came):
    that request's ``rpc_timeout`` runs from there, in async runs too, where other workers'
    answers keep coming meanwhile. ``local_restarts`` counts the local workers that the nodes
    serving this id replaced (node collectors, :mod:`~rpc_collectors.trainer.node_restarts`).
    ``uncounted`` is how many of the frames this id delivered the process's own frame count does
    not hold (a predecessor's; after a resume, less the count the process resumed from).
    ``weights_version`` is the weights version the id's next batch must be collected with (the one
    it was sent last, or loaded), ``batches_since_push`` how many batches it delivered since it was
    sent weights (``max_weight_update_interval``); both belong to the id, whichever process serves
    it.
    """

    generation: int = 0
    info: dict | None = None
    dead: str | None = None
    outstanding: int = 0
    redo: int = 0
    stale: int = 0
    requests: int = 0
    serving_since: float | None = None
    local_restarts: int = 0
    uncounted: int = 0
    weights_version: int = 0
    batches_since_push: int = 0

    def replaced(self) -> None:
        """A new process is taking the slot: what the last one was asked is asked again."""
        self.generation += 1
        self.redo += self.outstanding
        self.outstanding = self.stale = self.requests = 0
        self.serving_since = None
        self.dead = None
        self.info = None

    def served(self, info: dict) -> None:
        """The new process built its collector."""
        self.info = info

    def vacated(self) -> None:
        """The slot is vacant (elastic): nothing asked of the process that left is redone."""
        self.generation += 1
        self.outstanding = self.redo = self.stale = self.requests = 0
        self.serving_since = None
        self.dead = None
        self.info = None

    @property
    def serving(self) -> bool:
        """Whether a process serves this worker id (it built its collector); False: the slot is
        vacant (elastic), or its process is being replaced."""
        return self.info is not None

    def died(self, reason: str) -> None:
        """The process died: the first report says why (a later one of the same death adds
        nothing)."""
        if self.dead is None:
            self.dead = reason

    def asked(self, again: bool = False) -> None:
        """A batch request went out (``again``: one a predecessor left unanswered)."""
        if not self.outstanding:
            self.serving_since = time.monotonic()
        self.outstanding += 1
        self.requests += 1
        if again and self.redo:
            self.redo -= 1

    def answered(self) -> bool:
        """A batch request was answered: one batch more with the same weights. False: it was asked
        before the worker's stream was cut (``stale``)."""
        self.outstanding -= 1
        self.serving_since = time.monotonic() if self.outstanding else None
        self.batches_since_push += 1
        if self.stale:
            self.stale -= 1
            return False
        return True

    def cut(self) -> None:
        """The worker's stream was cut where its last answer ended: the requests outstanding are
        stale."""
        self.stale = self.outstanding

    def sent_weights(self, version: int) -> None:
        """Weights ``version`` were sent: the next batch is collected with them."""
        self.weights_version, self.batches_since_push = version, 0

    def loaded_weights(self, version: int) -> None:
        """The process loaded a saved state holding weights ``version``: it collects on with
        them."""
        self.weights_version = version

    def weights_due(self, after_each_batch: bool, interval: int) -> bool:
        """Whether the trainer's weights go to this id before its next batch
        (``update_after_each_batch``, or ``max_weight_update_interval`` batches with the same
        weights)."""
        if after_each_batch:
            return self.batches_since_push > 0
        return 0 <= interval < self.batches_since_push


class Roster:
    """The workers of one collector: ``roster[i]`` is worker ``i``'s :class:`WorkerRecord`, and the
    roster holds the run's ``budget`` of replacements over all workers (``max_worker_restarts``).

    :meth:`take` spends one, warning with the worker, the reason and what is left, or says the
    budget is spent; ``counts[i]`` is how often worker i was replaced (elastic: how many
    collectors left its slot). A process that starts serving worker i gets trajectory ids above
    any its predecessors could have used (:meth:`traj_id_start`) and a seed from i's seed
    sequence (:meth:`seed`). ``name`` says how a warning names worker i.

    ``taken`` lists (worker id, reason) of every replacement, in order; ``seeds`` the seed each
    worker was last given; ``resumes`` how many times the run was resumed from a saved state;
    ``joins`` and ``leaves`` the collectors that took a vacant slot, and that left theirs
    (elastic). ``_ids[i]`` bounds the id counts worker i's processes may have used.
    """

    def __init__(self, num_workers: int, max_worker_restarts: int,
                 name: str = "collector worker {}") -> None:
        self.records = [WorkerRecord() for _ in range(num_workers)]
        self.budget, self.name = max_worker_restarts, name
        self.counts = [0] * num_workers
        self.taken: list[tuple[int, str]] = []
        self.seeds: list[int | None] = [None] * num_workers
        self._ids = [0] * num_workers
        self.resumes = 0
        self.joins = self.leaves = 0

    def __getitem__(self, worker_id: int) -> WorkerRecord:
        return self.records[worker_id]

    def __iter__(self) -> Iterator[WorkerRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def num_workers(self) -> int:
        return len(self.records)

    def serving(self) -> list[int]:
        """The worker ids a process serves now (all of them, but for vacant elastic slots and
        replacements)."""
        return [worker_id for worker_id, record in enumerate(self.records) if record.serving]

    # ---------------------------------------------------------------- restarts
    @property
    def left(self) -> int:
        """Replacements left in the run's budget."""
        return self.budget - sum(self.counts)

    @property
    def worker_restarts(self) -> list[int]:
        """How often each worker id was replaced or left, plus the local workers its nodes
        replaced."""
        return [count + record.local_restarts for count, record in zip(self.counts, self.records)]

    def take(self, worker_id: int, reason: str) -> bool:
        """Spend a replacement of ``worker_id``, which ``reason``; False once the budget is
        spent."""
        if self.left <= 0:
            return False
        self.counts[worker_id] += 1
        self.taken.append((worker_id, reason))
        warnings.warn(
            f"{self.name.format(worker_id)} {reason}; replacing it ({self.left} of "
            f"max_worker_restarts={self.budget} restarts left)",
            WorkerRestartWarning, stacklevel=5,
        )
        return True

    # ---------------------------------------------------------------- who serves each worker id
    def died(self, worker_id: int, reason: str) -> None:
        """The process serving ``worker_id`` died (its pool's report; the first one counts)."""
        self.records[worker_id].died(reason)

    def replaced(self, worker_id: int) -> None:
        """A new process takes ``worker_id`` (a restart): a new generation, asked what its
        predecessor was."""
        self.records[worker_id].replaced()

    def joining(self, worker_id: int) -> None:
        """A collector is taking the vacant slot ``worker_id`` (elastic): a new generation,
        nothing to redo."""
        self.records[worker_id].vacated()
        self.joins += 1

    def left_slot(self, worker_id: int) -> None:
        """The collector serving ``worker_id`` left an elastic trainer: its slot is vacant (no
        budget spent)."""
        self.records[worker_id].vacated()
        self.counts[worker_id] += 1
        self.leaves += 1

    def served(self, worker_id: int, info: dict) -> None:
        """The process serving ``worker_id`` built its collector (``info``: what it reports of
        itself, its ``"envs"`` among it); each env starts a trajectory."""
        self.records[worker_id].served(info)
        self._ids[worker_id] += info["envs"]

    def asked(self, worker_id: int, frames: int, again: bool = False) -> None:
        """``worker_id`` was asked for a batch of ``frames`` (``again``: one its predecessor left
        unanswered): each frame may end a trajectory, each env may reset."""
        record = self.records[worker_id]
        record.asked(again)
        self._ids[worker_id] += frames + record.info["envs"]

    # ------------------------------------------------- what a new process continues from
    def traj_id_start(self, worker_id: int) -> int:
        """First trajectory id of a new process serving ``worker_id``: ids
        ``start + k * num_workers`` never meet those of its predecessors (same residue, higher
        counts)."""
        return worker_id + self.num_workers * self._ids[worker_id]

    def seed(self, worker_id: int) -> int | None:
        """The seed of ``worker_id``'s current process (or, after a resume, of the resumed worker),
        drawn from its seed's sequence."""
        seed = self.seeds[worker_id]
        if seed is None:
            return None
        count = self.counts[worker_id]
        key = (count,) if not self.resumes else (count, self.resumes)
        return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1)[0])

    def bounds(self) -> list[int]:
        """What :meth:`traj_id_start` continues from, to save with the trainer's state."""
        return list(self._ids)

    def restore(self, bounds: list[int]) -> None:
        self._ids = [int(b) for b in bounds]

    def loaded(self, worker_id: int, traj_count: int) -> None:
        """Worker ``worker_id`` resumed from a state that had started ``traj_count``
        trajectories."""
        self._ids[worker_id] += traj_count
