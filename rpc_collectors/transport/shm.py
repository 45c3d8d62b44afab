"""Nameless shared-memory files: what the weight plane and the data plane map on one host (each
slot a mapping of its own, page-locked for CUDA where asked: :func:`mapped`), and
large call arguments (:class:`SharedBytes`) that local workers read instead of a pipe's stream.

A file is made in /dev/shm and its name removed at once. Other processes on this host open it
through the creating process's descriptor (``/proc/<pid>/fd/<fd>``) while that process keeps
it open, and the memory goes away with the last process that maps it, so no process killed
at any moment leaves a file behind. Its space is reserved up front: a file larger than the
free space is an ``OSError`` naming both sizes, never a SIGBUS in a worker later.
"""
from __future__ import annotations

import errno
import mmap
import os
import tempfile
from dataclasses import dataclass

import torch


def file_id(fd: int) -> tuple[int, int]:
    """Which open file ``fd`` names: (device, inode), unique while the file is open."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def open_checked(path: str, flags: int, expected: tuple[int, int]) -> int:
    """Open ``path`` (``/proc/<pid>/fd/<n>``) only if it is still the file ``expected`` names.

    A number the trainer closed may name another file of its by now (say, a pipe of the next
    collector's worker): a worker that comes to open it late (its spawn was given up on) must
    never take that file over, so the file is checked before the open and again after."""
    # a list, after the spawner's JSON
    expected = tuple(expected)
    # FileNotFoundError: closed, its number not reused (yet)
    st = os.stat(path)
    fd = os.open(path, flags) if (st.st_dev, st.st_ino) == expected else -1
    if fd < 0 or file_id(fd) != expected:
        if fd >= 0:
            os.close(fd)
        raise FileNotFoundError(errno.ENOENT,
                                "the trainer closed this descriptor; its number names another file "
                                "now", path)
    return fd


def directory() -> str:
    """Where shared-memory files are made: /dev/shm (tmpfs), else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _free_bytes(where: str) -> int:
    st = os.statvfs(where)
    return st.f_bavail * st.f_frsize


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def nameless_file(prefix: str, nbytes: int, what: str, detail: str, advice: str) -> tuple[int, str]:
    """A shared-memory file of ``nbytes`` with no name: its descriptor, and the path to open it by.

    The caller closes the descriptor once every process that needs the file has mapped it.
    ``what``, ``detail`` and ``advice`` word the error raised when /dev/shm lacks the space.
    """
    where = directory()

    def no_space(free: int) -> OSError:
        return OSError(
            errno.ENOSPC,
            f"{what} needs {_mib(nbytes)} ({nbytes} bytes{detail}) but {where} has only "
            f"{_mib(free)} ({free} bytes) free; {advice}, or give the machine more shared memory "
            "(docker: --shm-size)",
        )

    if nbytes > _free_bytes(where):
        raise no_space(_free_bytes(where))
    fd, name = tempfile.mkstemp(prefix=f"rpc_collectors_{prefix}_", dir=where)
    os.unlink(name)
    try:
        os.posix_fallocate(fd, 0, max(nbytes, 1))
    except OSError as err:
        os.close(fd)
        if err.errno != errno.ENOSPC:
            raise
        raise no_space(_free_bytes(where)) from err
    return fd, f"/proc/{os.getpid()}/fd/{fd}"


def mapped(fd: int, count: int, nbytes: int, pinned: bool) -> list[torch.Tensor]:
    """``count`` consecutive parts of ``nbytes`` of the file ``fd``, each mapped on its own (a torch
    storage each, so each part's users can be counted); ``pinned``: page-locked for CUDA, so that
    copies to a GPU read them by DMA."""
    parts = [torch.frombuffer(mmap.mmap(fd, nbytes, offset=i * nbytes), dtype=torch.uint8)
             for i in range(count)]
    for i, part in enumerate(parts if pinned else []):
        try:
            error = int(torch.cuda.cudart().cudaHostRegister(part.data_ptr(), part.numel(), 0))
            if error != 0:
                raise RuntimeError(f"cudaHostRegister of a {part.numel()}-byte batch slot failed "
                                   f"with CUDA error {error}")
        except BaseException:
            unpin(parts[:i])
            raise
    return parts


def unpin(parts: list[torch.Tensor]) -> None:
    """Undo the page lock of :func:`mapped`."""
    for part in parts:
        torch.cuda.cudart().cudaHostUnregister(part.data_ptr())


@dataclass(frozen=True)
class SharedBytes:
    """Bytes that another process on this host holds in a nameless shared-memory file (its
    descriptor ``fd``, naming the file ``file``), read while that process keeps the file open."""

    pid: int
    fd: int
    size: int
    file: tuple[int, int]

    @classmethod
    def of(cls, data: bytes, what: str, advice: str) -> tuple[SharedBytes, int]:
        """``data`` in a new file: the bytes to send, and the descriptor to close once every
        reader has read them (``what`` and ``advice`` word the error when
        /dev/shm lacks the space)."""
        fd, _ = nameless_file("bytes", len(data), what, "", advice)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            raise
        return cls(os.getpid(), fd, len(data), file_id(fd)), fd

    def read(self) -> memoryview:
        """The bytes, mapped copy-on-write (no copy: the readers share its pages until one writes
        a page, which it then holds alone; they stay mapped while the view or a slice of it is
        held, and no descriptor stays open); ``FileNotFoundError`` once their holder closed the
        file."""
        fd = open_checked(f"/proc/{self.pid}/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC, self.file)
        try:
            if os.fstat(fd).st_size < self.size:
                raise EOFError(f"a shared file of {self.size} bytes holds "
                               f"{os.fstat(fd).st_size}")
            if not self.size:
                return memoryview(b"")
            # a private mapping (shared=False), whose descriptor torch closes once mapped
            mapped = torch.from_file(f"/proc/self/fd/{fd}", shared=False, size=self.size,
                                     dtype=torch.uint8)
            return memoryview(mapped.numpy())
        finally:
            os.close(fd)
