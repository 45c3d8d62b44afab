"""How many frames a collector's envs stepped: one int64 word its rollout adds each env step's
frames to, right after the step.

A collector's word is its own (:func:`word`), except in a local worker process: there the word
is one of a shared-memory file that the pool which started the process holds, a word per worker
id (:class:`SharedCounts`); the worker maps it when it starts (:func:`attach`) and its collector
counts into it. So the trainer reads what a worker stepped at any moment without asking it, and
still reads it once the process is dead: the steps of a batch a killed worker never finished are
counted, not guessed.
"""
from __future__ import annotations

import ctypes
import mmap
import os

from rpc_collectors.transport.shm import file_id, nameless_file, open_checked

# bytes between two workers' words: one cache line each, so no two workers write the same line
STRIDE = 64
# the word this process's served collector counts into (a local worker's, once attached)
_process_word: ctypes.c_int64 | None = None


def word() -> ctypes.c_int64:
    """A word of a collector's own, at 0."""
    return ctypes.c_int64(0)


class SharedCounts:
    """The pool's side of its local workers' words, one per worker id, in a nameless
    shared-memory file a worker opens through ``/proc/<pid>/fd`` (:meth:`ends`)."""

    def __init__(self, num_workers: int) -> None:
        self.fd, _ = nameless_file("steps", STRIDE * num_workers, "the workers' step counts", "",
                                   "free some of it")
        self._map = mmap.mmap(self.fd, STRIDE * num_workers)
        self._words = [ctypes.c_int64.from_buffer(self._map, STRIDE * i)
                       for i in range(num_workers)]

    def ends(self, worker_id: int) -> list[int]:
        """What :func:`attach` opens ``worker_id``'s word by: this pid, the descriptor, the
        file's id and the word's index."""
        return [os.getpid(), self.fd, *file_id(self.fd), worker_id]

    def value(self, worker_id: int) -> int:
        """Frames ``worker_id``'s process stepped so far (all of them, once it exited)."""
        return int(self._words[worker_id].value)

    def restart(self, worker_id: int) -> int:
        """Before ``worker_id``'s next process starts (the last one exited): its last process's
        frames; the word goes back to 0."""
        stepped = self.value(worker_id)
        self._words[worker_id].value = 0
        return stepped

    def close(self) -> list[int]:
        """Every word's last value; the file is unmapped and closed (a live worker's mapping keeps
        it)."""
        values = [word.value for word in self._words]
        del self._words
        self._map.close()
        os.close(self.fd)
        return values


def attach(ends: list[int]) -> None:
    """Map the word :meth:`SharedCounts.ends` names as the one this process's collector counts
    into."""
    global _process_word
    pid, fd, dev, ino, index = ends
    opened = open_checked(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC, (dev, ino))
    try:
        mapping = mmap.mmap(opened, STRIDE * (index + 1))
    finally:
        os.close(opened)
    _process_word = ctypes.c_int64.from_buffer(mapping, STRIDE * index)


def process_word() -> ctypes.c_int64 | None:
    """The word :func:`attach` mapped in this process (None: none was)."""
    return _process_word
