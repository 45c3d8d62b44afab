"""Warnings that point at the user's line: the first caller outside this package, however deep
in the package the warning is raised (``stacklevel`` counted from there)."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from types import FrameType

_PACKAGE = str(Path(__file__).resolve().parents[1])


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the nearest caller outside rpc_collectors
    (in a process where every caller is the package's, a worker's: the outermost one)."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and (_inside(frame) or _generated(frame)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _inside(frame: FrameType) -> bool:
    return str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE)


def _generated(frame: FrameType) -> bool:
    """A method without a file of an object of the package: the ``__init__`` its
    dataclasses were given."""
    if not frame.f_code.co_filename.startswith("<"):
        return False
    return type(frame.f_locals.get("self")).__module__.startswith(__package__.split(".")[0] + ".")
