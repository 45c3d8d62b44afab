"""The trainer's torch threads while its workers run on the same cores: the trainer's own
(:class:`TrainerThreads`) and a batched-inference collector's inference thread's
(:func:`inference_threads`)."""
from __future__ import annotations

import os

import torch


class TrainerThreads:
    """Lowers the trainer's torch threads for the life of a collector, then restores them.

    Args:
        num_threads: threads to use; None: as TorchRL, the current count less ``local_workers``
            (workers sharing this host), at least 1.
        local_workers: worker processes on the trainer's host.
    """

    def __init__(self, num_threads: int | None, local_workers: int) -> None:
        self.saved = torch.get_num_threads()
        given = num_threads is not None
        self.threads = num_threads if given else max(1, self.saved - local_workers)
        torch.set_num_threads(self.threads)

    def close(self) -> None:
        """Back to the count the trainer had before, unless something else changed it since."""
        if torch.get_num_threads() == self.threads:
            torch.set_num_threads(self.saved)


# the envs one inference thread serves before a second one pays for itself
ROWS_PER_THREAD = 16


def inference_threads(num_threads: int | None, env_processes: int, envs: int,
                      cores: int | None = None, current: int | None = None) -> int:
    """The torch threads of a batched-inference collector's inference thread: ``num_threads`` if
    given; else one per :data:`ROWS_PER_THREAD` of its ``envs`` (the rows of a forward pass at
    most), but no more than the cores this process may run on (``os.sched_getaffinity``, or
    ``cores``) less the ``env_processes`` stepping on them, and no more than the count torch uses
    now (``current``); at least 1. A forward pass of a few rows gains nothing from more threads:
    2 env processes of 4x84x84 pixels and a Nature-CNN ran 1.37x faster with 1 thread than with
    the 14 cores left over on 16, as fast as 2 threads on 2 cores (1 thread is what Sample
    Factory's inference worker runs); env processes beyond the cores only take turns with them."""
    if num_threads is not None:
        return num_threads
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    current = torch.get_num_threads() if current is None else current
    return max(1, min(current, cores - env_processes, envs // ROWS_PER_THREAD))
