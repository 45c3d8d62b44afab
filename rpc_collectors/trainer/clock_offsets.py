"""How far each worker's clock is from the trainer's, measured as NTP does.

The trainer asks each worker for its ``time.monotonic_ns()`` a few times (``clock``, one of
:class:`~rpc_collectors.core.protocol.WorkerCalls`), noting when it sent each call and when the
answer came. The answer was read, at best, halfway through the round trip: the worker's clock
minus the trainer's is ``worker - (sent + received) / 2``, taken from the shortest round trip,
off by at most half of it. Processes on one host share the monotonic clock (offset about 0);
other hosts' clocks started elsewhere.
"""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Callable

# round trips per worker; the shortest one counts
TRIES = 5

# (sent, the worker's clock, received) in nanoseconds
Sample = tuple[int, int, int]


def offset_of(samples: Iterable[Sample]) -> tuple[int, int]:
    """``(offset, round trip)`` in nanoseconds from the sample with the shortest round trip; the
    offset is the worker's clock minus the trainer's."""
    sent, theirs, received = min(samples, key=lambda sample: sample[2] - sample[0])
    return theirs - (sent + received) // 2, received - sent


def measure(pool: Any, gather: Callable[..., list], deferred: Any, worker_ids: list[int],
            tries: int = TRIES) -> dict[int, tuple[int, int]]:
    """``{worker_id: (offset, round trip)}`` of ``worker_ids``, from ``tries`` rounds of ``clock``
    calls sent to all of them at once (``pool.calls``), waited for with ``gather``."""
    samples: dict[int, list[Sample]] = {i: [] for i in worker_ids}
    for _ in range(tries):
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        futures = {}
        for i in worker_ids:
            sent[i] = time.monotonic_ns()
            futures[i] = pool.calls.clock(i)
            futures[i].add_done_callback(
                lambda _, i=i, got=received: got.setdefault(i, time.monotonic_ns()))
        answers = gather({i: deferred.clock(i) for i in worker_ids}, futures, recover=False)
        for i, theirs in zip(sorted(worker_ids), answers):
            samples[i].append((sent[i], theirs, received.get(i) or time.monotonic_ns()))
    return {i: offset_of(found) for i, found in samples.items()}
