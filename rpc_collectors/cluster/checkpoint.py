"""A whole run's checkpoint in one file, written atomically: the collector, the user's modules and
optimizers, a replay buffer if asked, and a dict of the user's own.

``save`` writes a temporary file in the same folder, fsyncs it, renames it over the checkpoint and
fsyncs the folder: a process killed during a save leaves the previous checkpoint whole. ``load``
checks that what it reads is a checkpoint of this run (the same modules, keys and shapes) before
changing anything, and names the file in every error. The file also keeps the run's allocations
(one record per SLURM allocation or process that ran it: start, frames, how it ended), written
beside it as ``run.json`` for people to read.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch

FILE_NAME = "checkpoint.pt"
RECORD_NAME = "run.json"
FORMAT = "rpc_collectors.checkpoint/1"
ENV_DIR = "RPC_COLLECTORS_CHECKPOINT_DIR"  # set in SLURM jobs submitted with a checkpoint_dir


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read, or that is not one of this run."""


def check_directory(directory: str | os.PathLike, name: str = "checkpoint_dir") -> Path:
    """``directory`` made if missing and checked writable (a ValueError naming it otherwise)."""
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise TypeError(f"{name}={directory!r} is invalid; accepted: a folder path (str or Path)")
    path = Path(directory).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise ValueError(f"{name}={str(path)!r} is not a writable folder ({err.strerror or err}); accepted: "
                         "a folder this user can create files in, on a filesystem every node of the job reads") from None
    return path


def read(path: str | os.PathLike) -> dict:
    """The content of checkpoint file ``path``; CheckpointError or FileNotFoundError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        content = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt: {err}); "
                              "delete it to start afresh, or restore a copy") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an rpc_collectors checkpoint (no {FORMAT!r} format mark)")
    return content


def write_atomically(path: Path, content: Any) -> None:
    """``torch.save(content)`` to ``path`` so that a reader (or a kill) never meets half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(content, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def signature(state: Mapping[str, Any]) -> dict[str, tuple]:
    """Key -> shape and dtype of every tensor in a (nested) state dict; other values by type."""
    out: dict[str, tuple] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[str(key)] = (tuple(value.shape), str(value.dtype))
        elif isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in signature(value).items()})
    return out


def difference(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """How ``saved``'s state dict differs from ``current``'s in keys and tensor shapes ("" if not)."""
    old, new = signature(saved), signature(current)
    missing, extra = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    if missing or extra:
        return f"keys differ (the checkpoint lacks {missing[:5]}, has other {extra[:5]})"
    for key in sorted(new):
        if old[key] != new[key]:
            return f"{key!r} is {old[key]} in the checkpoint, {new[key]} here"
    return ""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_record(path: Path, allocations: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"allocations": allocations}, indent=1))
    os.replace(tmp, path)
