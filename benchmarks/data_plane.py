"""Batch transfer: 2 and 8 local workers on a no-work env against the single-process Collector.

The env (``_common.NoWorkEnv``) returns one preallocated observation per step, so the cost
measured is the collectors' own, per frame and per byte. Observations: 4 floats
(CartPole-size), 4x84x84 uint8 (an Atari frame stack, 56 KB per frame with the next
observation) and 3x256x256 uint8 (a camera, 393 KB per frame). Each case runs in a fresh
process for ``--seconds`` after a warm-up; the single process is measured before and after
the multi-worker cases (the denominator is their mean).

Batches: about 12 MB per worker (1000 frames of 4 floats, 224 of 4x84x84, 32 of 3x256x256),
the same frames for the single process. Workers on this host deliver through shared memory
(``rpc_collectors/transport/data.py``); ``--rpc`` forces every batch through RPC results
(TensorPipe over TCP) instead, the path of workers on other hosts.

"receive" is the trainer's own rate: bytes delivered divided by the time the trainer spent
turning workers' answers into batches (handing out a slot, or copying it out, and building
the TensorDict), i.e. what it could take in if workers were never late. The "keep" cases
keep the last 4 batches alive (as a replay buffer holding references would), so the trainer
copies each slot out instead of handing it over.

The machine is shared, so frames/s depend on what else runs. "CPU us/frame" (all processes
of the case: trainer and workers) does not; "2 idle cores" = min(2, N) x the single process's
CPU per frame / the case's, i.e. the ratio to expect when the case has both cores to itself
and the workers are never starved (an estimate; it ignores waiting in sync rounds). "shared" is the total size of the
shared-memory buffers (3 slots x workers x batch bytes).

    python benchmarks/data_plane.py [--seconds 4] [--obs 4f,84,256,pong] [--no-n8] [--rpc]

``pong`` needs ale-py (``pip install ale-py``): a real Atari env, for a report.

Goals (2 cores): 4x84x84 sync and async >= 1.2x one process; 3x256x256 >= 1.0x; 4 floats
no slower than RPC results (0.54-0.57x); receive >= 2 GB/s.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time

import torch

import _common
from _common import emit, run_case, steady_rate
from rpc_collectors import Collector, MultiCollector

OBS = {
    "4f": ((4,), "float32", 1000),
    "84": ((4, 84, 84), "uint8", 224),
    "256": ((3, 256, 256), "uint8", 32),
    "pong": (None, None, 224),  # real Atari (ale-py): Pong, AtariPreprocessing, 4-frame stack
}
LABEL = {"4f": "4 floats", "84": "4x84x84 uint8", "256": "3x256x256 uint8", "pong": "Pong 4x84x84"}


def instrument(collector: MultiCollector) -> list[float]:
    """Accumulate the trainer's time spent turning answers into batches (receive and stack)."""
    spent = [0.0]
    plane = collector._batches
    for name in ("receive", "round"):
        inner = getattr(plane, name)

        def timed(*args, _inner=inner):
            start = time.perf_counter()
            try:
                return _inner(*args)
            finally:
                spent[0] += time.perf_counter() - start

        setattr(plane, name, timed)
    return spent


def run(case: dict) -> dict:
    _common.quiet()
    torch.set_num_threads(1)
    shape, dtype, per_worker = OBS[case["obs"]]
    if case["rpc"]:
        import rpc_collectors.transport.data as data_plane

        data_plane.MIN_BYTES = 1 << 62  # no batch is worth a slot: all go as RPC results
    make = _common.make_pong if shape is None else functools.partial(_common.make_no_work_env, shape, dtype)
    if case["kind"] == "single":
        collector = Collector(make, None, frames_per_batch=per_worker)
        warmup = 3
    else:
        n, sync = case["n"], case["kind"] == "sync"
        collector = MultiCollector(
            [make] * n, None, sync=sync, frames_per_batch=n * per_worker if sync else per_worker,
        )
        warmup = 3 if sync else 3 * n
    try:
        it = iter(collector)
        batch = next(it)
        frame_bytes = sum(v.numel() * v.element_size() for k, v in batch.items(True, True)
                          if k != ("collector", "worker_id")) / batch.numel()
        spent = instrument(collector) if case["kind"] != "single" else [0.0]
        if case.get("keep"):  # the user keeps the last few batches: the trainer must copy
            kept: list = []

            def keep(batch):
                kept.append(batch)
                del kept[:-case["keep"]]
                return batch

            collector.postproc = keep
        for _ in range(warmup):
            next(it)
        spent[0] = 0.0
        pids = [os.getpid()] + ([info["pid"] for info in collector.infos] if case["kind"] != "single" else [])
        cpu0, frames0 = _common.cpu_seconds(pids), collector.frames
        rate = steady_rate(collector, case["seconds"], 0)
        frames = collector.frames - frames0
        out = {"rate": rate, "frame_bytes": frame_bytes, "cpu_us": (_common.cpu_seconds(pids) - cpu0) / frames * 1e6}
        wall_bytes = frames * frame_bytes
        if case["kind"] != "single":
            out["shared"] = collector._batches.shared_bytes
            out["receive"] = wall_bytes / spent[0] if spent[0] else 0.0
        return out
    finally:
        collector.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--obs", default="4f,84,256")
    parser.add_argument("--n8", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rpc", action="store_true", help="every batch as an RPC result (no shared memory)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        emit(run(json.loads(args.case)))
        return

    def case(obs: str, kind: str, n: int = 1, keep: int = 0) -> dict:
        return run_case(__file__, {"obs": obs, "kind": kind, "n": n, "keep": keep, "seconds": args.seconds, "rpc": args.rpc})

    path = "RPC results (--rpc)" if args.rpc else "shared memory"
    print(f"no-work env, batches through {path}, {args.seconds:.0f} s per case, "
          f"{torch.get_num_threads()} threads, load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{'observation':<16} {'case':<14} {'frames/s':>10} {'x 1 proc':>9} {'MB/s':>8} {'receive MB/s':>13} "
          f"{'shared MB':>10} {'CPU us/frame':>13} {'2 idle cores':>13}")
    for obs in args.obs.split(","):
        singles = [case(obs, "single")]
        runs = [(f"N=2 {kind}", case(obs, kind, 2)) for kind in ("sync", "async")]
        runs += [(f"N=2 {kind} keep", case(obs, kind, 2, keep=4)) for kind in ("sync", "async")]
        if args.n8:
            runs += [(f"N=8 {kind}", case(obs, kind, 8)) for kind in ("sync", "async")]
        singles.append(case(obs, "single"))
        single = sum(s["rate"] for s in singles) / 2
        fb = singles[0]["frame_bytes"]
        single_cpu = min(s["cpu_us"] for s in singles)
        print(f"{LABEL[obs]:<16} {'1 process':<14} {single:>10,.0f} {1:>9.2f} {single * fb / 1e6:>8,.0f} "
              f"{'':>13} {'':>10} {single_cpu:>13.1f} {1:>13.2f}   runs: {singles[0]['rate']:,.0f}, {singles[1]['rate']:,.0f}")
        for name, r in runs:
            print(f"{'':<16} {name:<14} {r['rate']:>10,.0f} {r['rate'] / single:>9.2f} {r['rate'] * fb / 1e6:>8,.0f} "
                  f"{'n/a' if args.rpc else format(r['receive'] / 1e6, ',.0f'):>13} "
                  f"{r['shared'] / 1e6:>10,.1f} {r['cpu_us']:>13.1f} "
                  f"{min(2, int(name[2])) * single_cpu / r['cpu_us']:>13.2f}")
    print(f"load average after: {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
