"""Per-worker state of a multi-worker collector, one record per worker id (slot)."""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class WorkerRecord:
    """What the trainer knows of the process serving one worker id, changed only by the
    transitions below.

    ``generation`` tells processes apart: answers of one that was replaced are dropped.
    ``info`` is what the process reported of itself (None: vacant, or not built yet).
    ``dead`` is why it died, as its pool reported, until it is replaced. ``outstanding``
    counts its batch requests in flight; ``redo`` the requests a failed predecessor left
    unanswered, which its replacement is asked again (into the same slots). ``requests`` counts
    the batches this process was asked for (the number of the latest). ``serving_since`` is when
    it began on the oldest request it has not answered (asked, or its previous answer came):
    that request's ``rpc_timeout`` runs from there, in async runs too, where other workers'
    answers keep coming meanwhile. ``local_restarts`` counts the local workers that the nodes
    serving this id replaced (node collectors, :mod:`~rpc_collectors.trainer.node_restarts`).
    ``uncounted`` is how many of the frames this id delivered the process's own frame count does
    not hold (a predecessor's; after a resume, less the count the process resumed from).
    """

    generation: int = 0
    info: dict | None = None
    dead: str | None = None
    outstanding: int = 0
    redo: int = 0
    requests: int = 0
    serving_since: float | None = None
    local_restarts: int = 0
    uncounted: int = 0

    def replaced(self) -> None:
        """A new process is taking the slot: what the last one was asked is asked again."""
        self.generation += 1
        self.redo += self.outstanding
        self.outstanding = self.requests = 0
        self.serving_since = None
        self.dead = None
        self.info = None

    def served(self, info: dict) -> None:
        """The new process built its collector."""
        self.info = info

    def vacated(self) -> None:
        """The slot is vacant (elastic): nothing asked of the process that left is redone."""
        self.generation += 1
        self.outstanding = self.redo = self.requests = 0
        self.serving_since = None
        self.dead = None
        self.info = None

    def died(self, reason: str) -> None:
        self.dead = reason

    def asked(self, again: bool = False) -> None:
        """A batch request went out (``again``: one a predecessor left unanswered)."""
        if not self.outstanding:
            self.serving_since = time.monotonic()
        self.outstanding += 1
        self.requests += 1
        if again and self.redo:
            self.redo -= 1

    def answered(self) -> None:
        self.outstanding -= 1
        self.serving_since = time.monotonic() if self.outstanding else None
