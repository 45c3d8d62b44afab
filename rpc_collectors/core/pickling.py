"""User code as bytes for another process: :func:`dumps` is cloudpickle (closures, lambdas and
functions of ``__main__`` travel by value) with one difference that a worker's traceback relies on.

Invariant (owned here): a function that travels keeps its file name and line numbers, so a
worker's traceback names the user's own file and line, and shows the line where the file is
readable. cloudpickle 3.1.3 and later rename every code object it pickles ``<dynamic-code>`` (for
deterministic payloads); here a code object travels whole, as :mod:`marshal` writes it for a
``.pyc`` (the interpreter's own format: same Python version on both ends, as cloudpickle's code
objects need too).
"""
from __future__ import annotations

import io
import marshal
import pickle
import types
from collections import ChainMap
from typing import Any

import cloudpickle


def _code_reduce(code: types.CodeType) -> tuple:
    return marshal.loads, (marshal.dumps(code),)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)


def dumps(value: Any) -> bytes:
    """``value`` pickled for another process: cloudpickle's bytes, code objects
    with their file names."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


loads = pickle.loads
"""What :func:`dumps` gave back as the value (plain :func:`pickle.loads`, as cloudpickle's)."""
