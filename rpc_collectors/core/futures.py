"""Waiting on a ``torch.futures.Future`` without the future keeping whoever waited.

A future completed with an exception holds that exception object where the garbage collector
cannot see it, and ``wait()`` raises the object itself. Each wait would add its frames to the
exception's traceback, and those frames (with the collector in their locals, and the collector
holding the future) would live as long as the future, in a cycle the garbage collector never breaks.
:func:`outcome` leaves the held exception without a traceback and raises a copy of it; a waiter
that handles the failure itself raises :func:`detached`'s copy, outside its ``except`` block.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def outcome(fut: torch.futures.Future) -> Any:
    """``fut.wait()``; a failed future raises a copy of its exception (same type, message and
    attributes), never the exception it holds."""
    try:
        return fut.wait()
    except Exception as err:
        held = err
    raise detached(held)


def detached(err: BaseException) -> BaseException:
    """A copy of ``err``, the exception a future holds (same type, message and attributes), to raise
    in its place; ``err`` is left without the traceback its raising gave it."""
    err.__traceback__ = None
    clone = type(err).__new__(type(err), *err.args)
    clone.__dict__.update(getattr(err, "__dict__", {}))
    clone.__cause__, clone.__suppress_context__ = err.__cause__, err.__suppress_context__
    return clone
