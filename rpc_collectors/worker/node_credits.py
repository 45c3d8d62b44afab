"""An async node's requests under its trainer's admission (``policy_lag_mode="admit"``): one local
batch per request of the trainer, asked after the request's weights.

The trainer admits a request only if a batch collected with the weights it sends along (the
request's ``min_version``) can be handed out within ``max_policy_lag``
(:mod:`rpc_collectors.trainer.admission`). A node whose local workers collected on their own,
ahead of the requests, would hold batches of older weights than that, which it would have to drop.
So here each request of the trainer is a credit: the node asks one idle local worker for one
batch for it, once the weights the request names are in the node (the server applies them first,
:meth:`Credits.take`), and answers the requests in the order they came, each with the batch asked
for it. The trainer may keep one request per local worker in flight, so every local worker can be
busy, and the doorbell announces each request as it arrives (``answer(..., announce=...)``), so a
request is asked of a local worker while the node is still waiting for an earlier one's batch.

Invariant, owned here: the batch that answers a request was asked of its local worker after the
node's policy held the request's weights, so its oldest frame's version is at least the
request's ``min_version``, and the node drops nothing.
"""
from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDictBase

from rpc_collectors.single_process.batch_record import workers_in


@dataclass
class Asked:
    """A request asked of local worker ``worker``; ``batch`` once it came."""

    worker: int
    batch: TensorDictBase | None = None


class Credits:
    """The requests of one node: announced (read, not yet asked of a local worker), asked (oldest
    first), and the local workers free to take one, in the order they became free."""

    def __init__(self, num_workers: int) -> None:
        self._lock = threading.Lock()
        # min versions of the requests read and not yet taken
        self._announced: list[int] = []
        # taken: their weights are applied; each is asked of a local worker once one is free
        self._taken = 0
        self._asked: collections.deque[Asked] = collections.deque()
        self._idle = collections.deque(range(num_workers))

    def announce(self, min_version: int) -> None:
        """A request arrived (the doorbell's reader thread, or the server for a request by call)."""
        with self._lock:
            self._announced.append(min_version)

    def take(self) -> int | None:
        """The requests announced so far are to be asked now: the newest weights version they name
        (None: none), which the server applies before :meth:`next`."""
        with self._lock:
            taken, self._announced = self._announced, []
        self._taken += len(taken)
        return max(taken) if taken else None

    def next(self, local: Any) -> TensorDictBase:
        """The batch for the oldest request, from ``local`` (a node's local front, asked on
        demand); the batches of later requests that come first are kept (copied) for theirs."""
        self._ask(local)
        oldest = self._asked[0]
        while oldest.batch is None:
            batch = local.next()
            worker = workers_in(batch)[0]
            self._idle.append(worker)
            entry = next(e for e in self._asked if e.worker == worker and e.batch is None)
            entry.batch = batch if entry is oldest else batch.clone()
            self._ask(local)
        self._asked.popleft()
        return oldest.batch

    def _ask(self, local: Any) -> None:
        """Ask a free local worker for each request taken and not asked yet."""
        while self._taken and self._idle:
            worker = self._idle.popleft()
            local.schedule.ask(worker)
            self._asked.append(Asked(worker))
            self._taken -= 1
