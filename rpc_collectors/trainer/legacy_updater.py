"""TorchRL's legacy ``weight_updater`` on a multi-process collector: a ``WeightUpdaterBase`` that
``update_policy_weights_`` calls instead of pushing itself, and the per-worker ``pipes`` it talks
through.

TorchRL's updaters send ``(weights, "update")`` down ``collector.pipes[i]`` and wait for
``(j, "updated")``; here that message is a push of those weights to worker ``i`` over the weight
plane (one new version, applied before the worker's next batch, as every push), and the answer
comes once the push is delivered. The updater is the one home of how weights are sent; the pushes
keep their versions, so every frame still names the weights that chose its action.
"""
from __future__ import annotations

from collections import deque
from typing import Any

# the one message TorchRL's worker pipes take from a weight updater
UPDATE = "update"


class WorkerPipe:
    """``collector.pipes[i]`` for a weight updater: ``send((weights, "update"))`` pushes
    ``weights`` to worker ``i``; ``recv()`` gives ``(batches so far, "updated")`` for each."""

    def __init__(self, front: Any, worker_id: int) -> None:
        self.front, self.worker_id = front, worker_id
        self._answers: deque[tuple[int, str]] = deque()

    def send(self, message: Any) -> None:
        if not (isinstance(message, tuple) and len(message) == 2 and message[1] == UPDATE):
            raise ValueError(f"pipes[{self.worker_id}].send({message!r}) is not supported: the "
                             "workers take only weights here; accepted: (weights, 'update')")
        self.front.pusher.update(message[0], [self.worker_id], False)
        self._answers.append((self.front._iter, "updated"))

    def recv(self) -> tuple[int, str]:
        if not self._answers:
            raise RuntimeError(f"pipes[{self.worker_id}].recv(): nothing was sent to answer; "
                               "accepted: one recv() after each send((weights, 'update'))")
        return self._answers.popleft()


def register(front: Any, updater: Any) -> None:
    """Give ``front`` its ``weight_updater``, if any (registered with it, as TorchRL's collectors
    do), and one pipe per worker."""
    if updater is None:
        return
    front.weight_updater = updater
    front.pipes = [WorkerPipe(front, i) for i in range(front.plan.num_workers)]
    updater.register_collector(front)
