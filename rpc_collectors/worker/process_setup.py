"""What the spawner and the processes it forks do to themselves on Linux (elsewhere, nothing):
their name in ``ps``, death with their parent, the descriptors they let go of, and the page size
of the memory they hand down to their children.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# madvise(2): collapse a range into transparent huge pages now (Linux 6.1+)
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: object) -> None:
    try:
        _libc().prctl(option, arg)
    except (OSError, AttributeError):
        # not Linux: the stdin EOF path still cleans up
        pass


def die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def name_process(name: str) -> None:
    """Show this process as ``name`` (at most 15 bytes) in ``ps -o comm``, top, /proc/<pid>/comm."""
    _prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))


def drop_inherited_fds(keep: tuple[int, ...]) -> None:
    """Let go of every descriptor this process inherited but the standard streams and ``keep``.

    They are pointed at /dev/null rather than closed: Python objects of the parent (a logging
    handler, a test runner's capture file) may still write to their numbers, which must not
    come to name a socket this process opens later. ``sys.stdout``/``sys.stderr`` are
    rebound to descriptors 1 and 2.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        # no /proc: the usual range
        fds = list(range(3, 1024))
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd > 2 and fd != devnull and fd not in keep:
            try:
                os.dup2(devnull, fd)
            except OSError:
                # not open (any more)
                pass
    os.close(devnull)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            same = stream.fileno() == fd
        except (AttributeError, OSError, ValueError):
            same = False
        if not same:
            setattr(sys, name, open(fd, "w", buffering=1, closefd=False))


def collapse_to_huge_pages() -> int:
    """Move this process's private anonymous memory (the heap and arenas that torch and the
    interpreter filled) into 2 MiB pages; return the bytes moved (0 where the kernel cannot).

    A fork copies, and an exit tears down, one page-table entry per 4 KiB of the memory a child
    inherits, and touches each page's bookkeeping: for 230 MiB and hundreds of children that
    is most of the CPU their forks and exits take. In 2 MiB pages it is one entry per 2 MiB; a
    child's write to one still copies only the 4 KiB it writes. The pages this process shared
    with its own parent become its own (about that much more memory, once).
    """
    try:
        madvise = _libc().madvise
        maps = open("/proc/self/maps").read().splitlines()
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    moved = 0
    for line in maps:
        fields = line.split()
        if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        start, end = (int(bound, 16) for bound in fields[0].split("-"))
        start, end = -(-start // HUGE_PAGE) * HUGE_PAGE, end // HUGE_PAGE * HUGE_PAGE
        # a kernel without it, or THP off: EINVAL, and nothing changes
        if end > start and madvise(start, end - start, MADV_COLLAPSE) == 0:
            moved += end - start
    return moved
