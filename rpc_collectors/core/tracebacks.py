"""A worker's traceback as a user reads it: the frames of their own code (and of other libraries),
with the source lines the worker could not show, without this package's frames.

A worker's traceback reaches the trainer as text. Its frames in this package (the server, the
collector, the env wrapper) are the same for every failure and bury the user's: they are left out
of the message, and kept in ``WorkerError.remote_traceback``. A frame whose source the worker
could not read (a function defined in a notebook cell, or in a file only the trainer's host has)
gets its line from the trainer, which usually can read it.
"""
from __future__ import annotations

import linecache
import re
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
_SUBPACKAGES = sorted(p.name for p in _PACKAGE.iterdir() if (p / "__init__.py").exists())
_OURS = re.compile(rf"[/\\]{_PACKAGE.name}[/\\](?:{'|'.join(map(re.escape, _SUBPACKAGES))})[/\\]")
_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+), in ')
HEADER = "Traceback (most recent call last):"


def for_user(text: str) -> tuple[str, bool]:
    """``text`` (a worker's traceback) without this package's frames, with missing source lines
    filled in; and whether frames were left out. A traceback whose frames are all this
    package's keeps them (the error is then the library's own)."""
    sections = re.split(rf"(?m)^(?={re.escape(HEADER)})", text)
    out, dropped = [], False
    for section in sections:
        kept, left_out = _section(section)
        out.append(kept)
        dropped = dropped or left_out
    return "".join(out), dropped


def _section(section: str) -> tuple[str, bool]:
    lines = section.splitlines(keepends=True)
    # each frame: its "File" line and its indented lines
    frames: list[list[str]] = []
    head, tail = [], []
    for line in lines:
        if _FRAME.match(line):
            frames.append([line])
        elif frames and line.startswith("    ") and not tail:
            frames[-1].append(line)
        elif frames or tail:
            tail.append(line)
        else:
            head.append(line)
    theirs = [frame for frame in frames if not _OURS.search(frame[0])]
    if not frames or not theirs:
        return section, False
    for frame in theirs:
        # the worker could not read the source: the trainer may
        if len(frame) == 1:
            match = _FRAME.match(frame[0])
            source = linecache.getline(match["file"], int(match["line"])).strip()
            if source:
                frame.append(f"    {source}\n")
    return "".join(head + [line for frame in theirs for line in frame] + tail), len(theirs) < len(
        frames
    )
