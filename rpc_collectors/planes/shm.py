"""Nameless shared-memory files: what the weight plane and the data plane map on one host.

A file is made in /dev/shm and its name removed at once. Other processes on this host open it
through the creating process's descriptor (``/proc/<pid>/fd/<fd>``) while that process keeps
it open, and the memory goes away with the last process that maps it, so no process killed
at any moment leaves a file behind. Its space is reserved up front: a file larger than the
free space is an ``OSError`` naming both sizes, never a SIGBUS in a worker later.
"""
from __future__ import annotations

import errno
import os
import tempfile


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
            f"{what} needs {_mib(nbytes)} ({nbytes} bytes{detail}) but {where} has only {_mib(free)} "
            f"({free} bytes) free; {advice}, or give the machine more shared memory (docker: --shm-size)",
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
