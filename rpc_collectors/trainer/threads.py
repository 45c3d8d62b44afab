"""The trainer's torch threads while its workers run on the same cores."""
from __future__ import annotations

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
