"""Trainer (and, on ranks != 0, collector server) for tests/transport/test_data_plane_hosts.py.

Run on every rank with torchrun-style variables; ranks != 0 serve inside the RPCCollector
constructor and exit there. Each worker's env is tests/transport/test_data_plane.py's ``PixelEnv``, so
the trainer checks every frame of every batch. Prints one JSON line when collection starts
(each worker's path and pid) and one at the end (what was checked, or the error raised).

    --sync / --async      the collector's mode
    --batches N           batches to check as they come
    --keep K              then keep K more batches in a list and check them all at the end
    --endless             collect until killed or failed (a test kills a worker meanwhile)
"""
from __future__ import annotations

import argparse
import functools
import json
import sys

import torch

from rpc_collectors import RPCCollector, WorkerError
from test_data_plane import Checker, make_env


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--num-envs", type=int, default=None)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--keep", type=int, default=0)
    parser.add_argument("--endless", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    envs = [functools.partial(make_env, w, args.num_envs, (3, 64, 64)) for w in range(2)]
    per_worker = 40 if args.num_envs is None else 60
    collector = RPCCollector(
        envs, None, sync=args.sync, frames_per_batch=per_worker * (2 if args.sync else 1), total_frames=-1,
        launcher="torchrun", rpc_timeout=20, track_policy_version=True,  # the checker reads each frame's worker id
    )
    # Only rank 0 gets here.
    checker, kept, checked, seen, started = Checker(), [], 0, set(), False
    try:
        with collector:
            for i, batch in enumerate(collector):
                seen.update(batch["collector", "worker_id"].unique().tolist())
                if not started and i >= 1 and seen == {0, 1}:  # each worker's first batch set its path up
                    started = True  # (async, on a loaded machine: one worker may deliver twice before the other once)
                    emit({"event": "start", "paths": [collector.slots.plane.path_of(w) for w in range(2)],
                          "in_flight": [collector.slots.plane.depth(w) for w in range(2)],
                          "pids": [info["pid"] for info in collector.infos],
                          "hosts": [info["host"] for info in collector.infos]})
                if args.endless or i < args.batches:
                    checker.check(batch)
                    checked += 1
                elif len(kept) < args.keep:
                    kept.append(batch)
                else:
                    break
            for batch in kept:
                checker.check(batch)
            emit({"event": "end", "checked": checked, "kept": len(kept), "streams": len(checker.next)})
    except WorkerError as err:
        emit({"event": "error", "worker_id": err.worker_id, "reason": err.reason, "checked": checked})


if __name__ == "__main__":
    main()
    sys.stdout.flush()
