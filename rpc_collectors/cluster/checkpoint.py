"""A whole run's checkpoint in one file, written atomically: the collector, the user's modules and
optimizers, a replay buffer if asked, and a dict of the user's own.

``save`` writes a temporary file in the same folder, fsyncs it, renames it over the checkpoint and
fsyncs the folder: a process killed during a save leaves the previous checkpoint whole, and the
next save (or :class:`RunCheckpoint` on the folder) removes the temporary files no live save holds
(each save holds a lock on its own). A save that fails (a full disk) raises
:class:`CheckpointWriteError` naming the folder and its free space; the previous checkpoint stays.
The file starts with a line holding the SHA-256 of the rest, so a flipped bit is refused on
reading. ``load`` checks that what it reads is a checkpoint of this run (the same modules, keys
and shapes) before changing anything, and names the file in every error. The file also keeps the
run's allocations (one record per SLURM allocation or process that ran it: start, frames, how it
ended), written beside it as ``run.json`` for people to read.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import io
import json
import os
import pickle
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

FILE_NAME = "checkpoint.pt"
RECORD_NAME = "run.json"
FORMAT = "rpc_collectors.checkpoint/1"
# set in SLURM jobs submitted with a checkpoint_dir
ENV_DIR = "RPC_COLLECTORS_CHECKPOINT_DIR"
# the file's first line: this, the hex digest of the rest, "\n"
CHECKSUM = b"rpc_collectors checkpoint sha256 "
HEADER_SIZE = len(CHECKSUM) + 64 + 1
# a file written before checkpoints carried a checksum: torch's zip alone
ZIP_START = b"PK"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be read, or that is not one of this run."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint (or its ``run.json``) that could not be written, e.g. on a full disk."""


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
        raise ValueError(f"{name}={str(path)!r} is not a writable folder ({err.strerror or err}); "
                         "accepted: a folder this user can create files in, on a filesystem every "
                         "node of the job reads") from None
    return path


def read(path: str | os.PathLike) -> dict:
    """The content of checkpoint file ``path``; CheckpointError or FileNotFoundError naming it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    # one open file: what is checked is what is loaded
    with open(path, "rb") as file:
        head = file.read(HEADER_SIZE)
        if head.startswith(CHECKSUM):
            digest = hashlib.sha256()
            while chunk := file.read(2**24):
                digest.update(chunk)
            if digest.hexdigest().encode() != head[len(CHECKSUM):-1]:
                raise CheckpointError(f"{path} is not a readable checkpoint (its content does not "
                                      "match its SHA-256 checksum: corrupt or truncated); delete "
                                      "it to start afresh, or restore a copy")
            start = HEADER_SIZE
        elif head.startswith(ZIP_START):
            # written before checkpoints carried a checksum
            start = 0
        else:
            raise CheckpointError(f"{path} is not a readable checkpoint (neither an rpc_collectors "
                                  "checksum line nor torch's format at its start); delete it to "
                                  "start afresh, or restore a copy")
        try:
            content = torch.load(_From(file, start), map_location="cpu", weights_only=False)
        except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile,
                ValueError) as err:
            raise CheckpointError(f"{path} is not a readable checkpoint (truncated or corrupt: "
                                  f"{err}); delete it to start afresh, or restore a copy") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an rpc_collectors checkpoint (no {FORMAT!r} format "
                              "mark)")
    return content


class _From:
    """A binary file read from ``start`` on, as if it began there (torch reads the zip
    after the checksum line)."""

    def __init__(self, file: io.BufferedReader, start: int) -> None:
        self.file, self.start = file, start
        file.seek(start)

    def read(self, size: int = -1) -> bytes:
        return self.file.read(size)

    def readinto(self, buffer: Any) -> int:
        return self.file.readinto(buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.file.seek(offset + self.start if whence == os.SEEK_SET else offset,
                              whence) - self.start

    def tell(self) -> int:
        return self.file.tell() - self.start


class _HashingFile:
    """A binary file that hashes what is written to it and keeps the first OSError it met (torch
    reports a failed write as a RuntimeError of its own)."""

    def __init__(self, file: io.BufferedWriter) -> None:
        self.file, self.hash, self.error = file, hashlib.sha256(), None

    def write(self, data: bytes) -> int:
        try:
            written = self.file.write(data)
        except OSError as err:
            self.error = self.error or err
            raise
        self.hash.update(data)
        return written

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as err:
            self.error = self.error or err
            raise


def write_atomically(path: Path, content: Any) -> None:
    """``torch.save(content)`` to ``path``, after its checksum line, so that a reader (or a kill)
    never meets half a file; :class:`CheckpointWriteError` if it cannot be written."""
    remove_stale_temporaries(path)
    with _written(path):
        fd, tmp = _locked_temporary(path)
        try:
            with os.fdopen(fd, "wb") as file:
                # the checksum line, written once the rest is
                file.write(bytes(HEADER_SIZE))
                hashing = _HashingFile(file)
                try:
                    torch.save(content, hashing)
                except RuntimeError:
                    if hashing.error is None:
                        raise
                    raise hashing.error from None
                file.seek(0)
                file.write(CHECKSUM + hashing.hash.hexdigest().encode() + b"\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _sync_folder(path.parent)


def write_text_atomically(path: Path, text: str) -> None:
    """``text`` to ``path`` through one temporary file beside it (a kill leaves one at most),
    fsynced and renamed over it, so that a reader (or a kill) never meets half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """fsync ``folder``: a rename in it outlasts a crash of the machine."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _locked_temporary(path: Path) -> tuple[int, str]:
    """A new temporary file beside ``path`` and its fd, which holds a lock on it while it lives."""
    while True:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            # not taken for stale between mkstemp and flock
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                return fd, tmp
        os.close(fd)


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files of saves of ``path`` that no live process holds (killed saves)."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                os.unlink(tmp)
        except OSError:
            # a save in progress holds it, or it is gone
            pass
        finally:
            os.close(fd)


@contextlib.contextmanager
def _written(path: Path) -> Iterator[None]:
    """Turn a failed write of ``path`` into a CheckpointWriteError naming its
    folder and free space."""
    try:
        yield
    except OSError as err:
        try:
            usage = shutil.disk_usage(path.parent)
            space = f"{usage.free / 2**20:,.1f} MiB free of {usage.total / 2**20:,.1f} MiB there"
        except OSError:
            space = "its free space unknown"
        full = " (the disk is full)" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise CheckpointWriteError(
            f"could not write {path.name} to {path.parent}: {err.strerror or err}{full}; {space}. "
            f"The previous {path.name} there, if any, is unchanged; free space or choose another "
            "folder") from err


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
    """How ``saved``'s state dict differs from ``current``'s in keys and
    tensor shapes ("" if not)."""
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
    with _written(path):
        write_text_atomically(path, json.dumps({"allocations": allocations}, indent=1))
