"""Which warnings a worker process shows: those the trainer's ``warnings`` filters ask for, and no
other.

TorchRL's worker processes ignore every warning (``torchrl.filter_warnings_subprocess``, True by
default): an env that warns at each construction or step would otherwise repeat it once per
worker. Here a worker runs under the trainer's filters as they were when the collector was made
(``-W``, ``PYTHONWARNINGS`` and every ``warnings.filterwarnings``/``simplefilter`` call included),
followed by one that ignores the rest: a warning some filter of the trainer's shows ("default",
"always", "once", "module") or raises ("error") is shown or raised in the worker too; one that
no filter names, which the trainer would show once per location, is ignored. With
``torchrl.filter_warnings_subprocess = False`` (TorchRL imported) nothing is added: the worker
shows what the trainer would.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any

# the worker option that carries them
KEY = "warning_filters"
# a filter as warnings.filters holds it
IGNORE_THE_REST = ("ignore", None, Warning, None, 0)


def for_workers() -> tuple:
    """The filters a worker made now runs under (see the module's docstring)."""
    torchrl = sys.modules.get("torchrl")
    rest = () if getattr(torchrl, "filter_warnings_subprocess", True) is False else (
        IGNORE_THE_REST,
    )
    return tuple(warnings.filters) + rest


def apply(filters: Any) -> None:
    """Make ``filters`` (from :func:`for_workers`) this worker process's, in place of its own."""
    # also forgets which warnings were shown already
    warnings.resetwarnings()
    warnings.filters[:] = list(filters)
