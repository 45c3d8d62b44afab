"""The trainer's torch threads while its workers run on the same cores: the trainer's own
(:class:`TrainerThreads`) and a batched-inference collector's inference thread's (:func:`inference_threads`)."""
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
        self.threads = num_threads if num_threads is not None else max(1, self.saved - local_workers)
        torch.set_num_threads(self.threads)

    def close(self) -> None:
        """Back to the count the trainer had before, unless something else changed it since."""
        if torch.get_num_threads() == self.threads:
            torch.set_num_threads(self.saved)


def inference_threads(num_threads: int | None, env_processes: int, cores: int | None = None,
                      current: int | None = None) -> int:
    """The torch threads of a batched-inference collector's inference thread: ``num_threads`` if
    given; else the cores this process may run on (``os.sched_getaffinity``, or ``cores``) less
    the env processes stepping on them, at least 1 and at most the count torch uses now
    (``current``). The env processes each keep a core busy; inference threads beyond the cores
    left over would only take turns with them (2 cores and 2 env processes: 1 thread, as Sample
    Factory's inference worker)."""
    if num_threads is not None:
        return num_threads
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    current = torch.get_num_threads() if current is None else current
    return max(1, min(current, cores - env_processes))
