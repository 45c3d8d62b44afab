"""The one place a multi-worker collector waits: answers, joins, deaths and shutdown.

Producers (the callbacks of workers' futures, a pool reporting a death or a newcomer,
``shutdown()`` from another thread) add an event or change the collector's state, and wake
every waiter. A waiter takes the first event it waits for and leaves the others, in order, for
the next one: a weight push may wait while a worker's batch arrives, and the batch stays for
the collecting thread. Waiting costs no CPU, and every wait has a deadline.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Answer:
    """Worker ``worker_id``'s process ``generation`` answered the request ``tag`` in ``fut``."""

    worker_id: int
    generation: int
    tag: object  # BATCH, or the gather that sent the call
    fut: torch.futures.Future


@dataclass(frozen=True)
class Joined:
    """A collector process (``rank``) joined an elastic trainer."""

    rank: int


BATCH = "batch"


class Events:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Any] = []

    def put(self, item: Any) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def watch(self, worker_id: int, generation: int, tag: object, fut: torch.futures.Future) -> None:
        """Add an :class:`Answer` once ``fut`` completes (at once if it has)."""
        fut.add_done_callback(lambda f: self.put(Answer(worker_id, generation, tag, f)))

    def wake(self) -> None:
        """Wake every waiter to look at the collector's state again (a death, shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def take(self, match: Callable[[Any], bool], deadline: float, check: Callable[[], None]) -> Any:
        """The first event ``match`` accepts, or None at ``deadline``; ``check()`` runs before each
        look (it raises on a death or shutdown the waiter must hear of)."""
        with self._cond:
            while True:
                check()
                for k, item in enumerate(self._items):
                    if match(item):
                        return self._items.pop(k)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def drop(self, match: Callable[[Any], bool]) -> None:
        """Forget the events ``match`` accepts (answers nobody waits for any more)."""
        with self._cond:
            self._items = [item for item in self._items if not match(item)]
