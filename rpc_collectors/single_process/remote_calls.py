"""TorchRL's ``get_distant_attr`` and ``map_fn`` on one collector: a dotted attribute path read,
or a method called once per argument entry (a multi-worker collector asks each worker this)."""
from __future__ import annotations

from typing import Any


def attribute(obj: Any, path: str) -> Any:
    """``obj``'s attribute at the dotted ``path`` (``"replay_buffer.write_count"``)."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"attribute path {path!r} is invalid; accepted: a non-empty "
                        "str such as 'frames_per_batch'")
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def call_entries(obj: Any, method: str, list_of_args: list | None,
                 list_of_kwargs: list | None) -> list:
    """``obj.<method>(*args, **kwargs)`` for each entry of
    ``list_of_args``/``list_of_kwargs``, in order."""
    args, kwargs = entries(list_of_args, list_of_kwargs)
    return [attribute(obj, method)(*a, **k) for a, k in zip(args, kwargs)]


def entries(list_of_args: list | None, list_of_kwargs: list | None,
            count: int | None = None) -> tuple[list, list]:
    """The argument and keyword entries, one per call (``count`` calls if given,
    TorchRL's checks and words)."""
    if list_of_args is None and list_of_kwargs is None:
        list_of_args = [()] * (count or 1)
    if list_of_args is None:
        list_of_args = [()] * len(list_of_kwargs)
    if list_of_kwargs is None:
        list_of_kwargs = [{}] * len(list_of_args)
    if len(list_of_args) != len(list_of_kwargs):
        raise ValueError(f"list_of_args ({len(list_of_args)} entries) and list_of_kwargs "
                         f"({len(list_of_kwargs)}) must have the same length")
    if count is not None and len(list_of_args) != count:
        raise ValueError(f"Expected {count} argument entries, got "
                         f"{len(list_of_args)}: one per worker")
    return [tuple(a) for a in list_of_args], [dict(k) for k in list_of_kwargs]
