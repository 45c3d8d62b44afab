"""torch's C++ log threshold, set from Python: a stopping RPC agent logs every
connection its peers close."""
from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator

import torch

# c10's log level that drops warnings
ERROR = 2


def level() -> ctypes.c_int:
    """torch's C++ log threshold (``TORCH_CPP_LOG_LEVEL``, read only at start-up), settable here."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    return ctypes.c_int.in_dll(lib, "FLAGS_caffe2_log_level")


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    """Drop torch's C++ warnings meanwhile: a stopping RPC agent warns of every pipe it closes."""
    threshold = level()
    saved = threshold.value
    threshold.value = max(saved, ERROR)
    try:
        yield
    finally:
        threshold.value = saved
