"""How many times a run started collecting, counted in its checkpoint folder.

A run resumed from the same checkpoint twice (its job killed in between) loads the same state
both times, so the state cannot tell the resumes apart: the folder's file ``starts`` counts them,
written atomically before collection starts. Each start hands its trajectory ids out in a range
of its own (:func:`~rpc_collectors.single_process.trajectories.shift_ids`), so ids handed out after
the last checkpoint by a start that was killed never come back.
"""
from __future__ import annotations

from pathlib import Path

from rpc_collectors.cluster.checkpoint import CheckpointError, write_text_atomically

STARTS_NAME = "starts"


def next_start(directory: Path) -> int:
    """Count a new start of the run whose checkpoint folder is ``directory``; returns its
    number (0: the first)."""
    path = directory / STARTS_NAME
    try:
        start = int(path.read_text()) + 1
    except FileNotFoundError:
        start = 0
    except ValueError:
        raise CheckpointError(f"{path} does not hold a count of the run's starts; restore it, or "
                              "delete the folder's checkpoint to start afresh") from None
    write_text_atomically(path, f"{start}\n")
    return start
