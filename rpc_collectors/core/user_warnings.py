"""Warnings that point at the user's line: the first caller outside this package, however deep
in the package the warning is raised (``stacklevel`` counted from there)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parents[1])


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the nearest caller outside rpc_collectors
    (in a process where every caller is the package's, a worker's: the outermost one)."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
