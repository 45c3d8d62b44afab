"""A trace window's spans as a Chrome trace event file (opens in Perfetto and chrome://tracing).

Each process is one track: the trainer is pid 0, worker ``i`` pid ``i + 1`` (its rank on
torchrun/SLURM), a node's local workers follow; each thread of a process is one row (tid). A span
is a complete event (``"ph": "X"``) with its start (``ts``) and length (``dur``) in microseconds
since the window opened, on the trainer's clock; metadata events name the processes
(``"worker 3 (host)"``), their threads and the clock offset that was corrected.
"""
from __future__ import annotations

import json
from typing import Any

from rpc_collectors.core.protocol import ProcessSpans


def process_name(entry: ProcessSpans, nodes: set[int]) -> str:
    """``trainer``, ``worker i``, ``node i`` (a worker with local workers) or
    ``node i's local worker w``, with the host."""
    path = entry.path
    if not path:
        who = "trainer"
    elif len(path) == 1:
        who = f"{'node' if path[0] in nodes else 'worker'} {path[0]}"
    else:
        who = f"node {path[0]}'s local worker " + ".".join(map(str, path[1:]))
    return f"{who} ({entry.host})"


def _pids(processes: list[ProcessSpans]) -> list[int]:
    """The trainer 0, worker ``i`` ``i + 1``, the others after the highest of those."""
    top = [entry.path[0] + 1 for entry in processes if len(entry.path) == 1]
    following = max(top, default=0)
    pids = []
    for entry in processes:
        if len(entry.path) <= 1:
            pids.append(entry.path[0] + 1 if entry.path else 0)
        else:
            following += 1
            pids.append(following)
    return pids


def events(processes: list[ProcessSpans], origin: int) -> list[dict[str, Any]]:
    """The trace events of ``processes`` (all on one clock, in nanoseconds) since ``origin``,
    when the window opened: a span that began before (the phase in progress then) is shown from
    there."""
    nodes = {entry.path[0] for entry in processes if len(entry.path) > 1}
    out: list[dict[str, Any]] = []
    for pid, entry in zip(_pids(processes), processes):
        category = "trainer" if not entry.path else "worker"
        name = process_name(entry, nodes)
        out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                    "args": {"sort_index": pid}})
        if entry.path:
            label = (f"pid {entry.pid}, clock offset {entry.offset_ns / 1e6:+.3f} ms "
                     f"\u00b1 {entry.error_ns / 1e6:.3f} ms")
            out.append({"ph": "M", "name": "process_labels", "pid": pid, "args": {"labels": label}})
        for tid, (thread, spans) in enumerate(entry.threads.items()):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": thread}})
            for name, start, end, *args in spans:
                start = max(start, origin)
                # ended as the window opened, within the offset's error
                end = max(end, start)
                event = {"ph": "X", "name": name, "cat": category, "pid": pid, "tid": tid,
                         "ts": round((start - origin) / 1e3, 3),
                         "dur": round((end - start) / 1e3, 3)}
                if args:
                    event["args"] = args[0]
                out.append(event)
    return out


def write(path: str, processes: list[ProcessSpans], origin: int) -> None:
    """Write ``processes``' spans since ``origin`` to ``path`` as a Chrome trace event file."""
    trace = {"traceEvents": events(processes, origin), "displayTimeUnit": "ms"}
    with open(path, "w") as file:
        json.dump(trace, file, separators=(",", ":"))
