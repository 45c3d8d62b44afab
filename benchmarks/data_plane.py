"""Batch transfer: 2 and 8 local workers on a no-work env against the single-process Collector.

The env (``_common.NoWorkEnv``) returns one preallocated observation per step, so the cost
measured is the collectors' own, per frame and per byte. Observations: 4 floats
(CartPole-size), 4x84x84 uint8 (an Atari frame stack, 56 KB per frame with the next
observation) and 3x256x256 uint8 (a camera, 393 KB per frame). Each case runs in a fresh
process for ``--seconds`` after a warm-up, in ``--rounds`` interleaved rounds (every case once
per round); each figure is the median over the rounds. "copy" is a plain copy of the same
bytes (one batch's, ``Tensor.copy_``) in one process, measured in the same rounds: the memory's
own speed, to read the MB/s against. "2 processes" is two single-process Collectors side by
side, independent: what 2 workers could give at most on this machine as it is.

Batches: about 12 MB per worker (1000 frames of 4 floats, 224 of 4x84x84, 32 of 3x256x256),
the same frames for the single process. Workers on this host deliver through shared memory
(``rpc_collectors/transport/data.py``); ``--rpc`` forces every batch through RPC results
(TensorPipe over TCP) instead, the path of workers on other hosts.

"receive" is the trainer's own rate: bytes delivered divided by the time the trainer spent
turning workers' answers into batches (handing out a slot, or copying it out, and building
the TensorDict), i.e. what it could take in if workers were never late. Each case's loop holds
its batches as a training loop does (one iterator, each batch let go once the next is asked
for), so slots are handed out; the "keep" cases keep the last 4 batches alive (as a replay
buffer holding references would), so the trainer copies each slot out instead of handing it over.

The machine is shared, so frames/s depend on what else runs. "CPU us/frame" (all processes
of the case: trainer and workers) does not; "2 idle cores" = min(2, N) x the single process's
CPU per frame / the case's, i.e. the ratio to expect when the case has both cores to itself
and the workers are never starved (an estimate; it ignores waiting in sync rounds). "shared" is the total size of the
shared-memory buffers (3 slots x workers x batch bytes).

    python benchmarks/data_plane.py [--seconds 4] [--rounds 3] [--obs 4f,84,256,pong] [--no-n8] [--rpc] [--cases CASES]

``pong`` needs ale-py (``pip install ale-py``): a real Atari env, for a report.

Goals (2 cores): 4x84x84 and 3x256x256, sync and async, >= 1.5x one process; 4 floats no
slower than RPC results (0.54-0.57x); receive >= 2 GB/s.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
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
    plane = collector.slots.plane
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
    if case["kind"] == "copy":
        return plain_copy(make, per_worker, case["seconds"])
    if case["kind"] == "pair":
        return pair(case)
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
        it = iter(collector)  # one iterator, and no batch held past the next: a training loop's hold on its batches
        batch = next(it)
        frame_bytes = sum(v.numel() * v.element_size() for k, v in batch.items(True, True)
                          if k != ("collector", "worker_id")) / batch.numel()
        del batch
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
        rate = steady_rate(it, case["seconds"], 0)  # iter(it) is it
        frames = collector.frames - frames0
        out = {"rate": rate, "frame_bytes": frame_bytes, "cpu_us": (_common.cpu_seconds(pids) - cpu0) / frames * 1e6}
        wall_bytes = frames * frame_bytes
        if case["kind"] != "single":
            out["shared"] = collector.slots.plane.shared_bytes
            out["receive"] = wall_bytes / spent[0] if spent[0] else 0.0
        return out
    finally:
        collector.shutdown()


def plain_copy(make, frames: int, seconds: float) -> dict:
    """A plain copy of one batch's bytes, over and over: the memory's speed, in frames/s of that batch."""
    collector = Collector(make, None, frames_per_batch=frames)
    try:
        batch = collector.next()
    finally:
        collector.shutdown()
    nbytes = sum(v.numel() * v.element_size() for v in batch.values(True, True))
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    copies, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        dst.copy_(src)
        copies += 1
    return {"rate": copies * batch.numel() / (time.perf_counter() - start), "frame_bytes": nbytes / batch.numel()}


def pair(case: dict) -> dict:
    """Two single-process Collectors at once, in processes of their own: their frames/s added up."""
    import subprocess
    import sys

    single = json.dumps({**case, "kind": "single"})
    procs = [subprocess.Popen([sys.executable, __file__, "--case", single], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [json.loads([line for line in p.communicate()[0].splitlines() if line.startswith("{")][-1]) for p in procs]
    return {"rate": sum(r["rate"] for r in results), "frame_bytes": results[0]["frame_bytes"],
            "cpu_us": sum(r["cpu_us"] for r in results) / 2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; figures are their medians")
    parser.add_argument("--obs", default="4f,84,256")
    parser.add_argument("--n8", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rpc", action="store_true", help="every batch as an RPC result (no shared memory)")
    parser.add_argument("--cases", help="only these cases, comma-separated (e.g. 'N=2 sync,N=2 async'); "
                        "copy and 1 process always run")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        emit(run(json.loads(args.case)))
        return

    def case(obs: str, kind: str, n: int = 1, keep: int = 0) -> dict:
        return run_case(__file__, {"obs": obs, "kind": kind, "n": n, "keep": keep, "seconds": args.seconds, "rpc": args.rpc})

    path = "RPC results (--rpc)" if args.rpc else "shared memory"
    print(f"no-work env, batches through {path}, {args.seconds:.0f} s per case, {args.rounds} interleaved rounds "
          f"(medians), {torch.get_num_threads()} threads, load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{'observation':<16} {'case':<14} {'frames/s':>10} {'x 1 proc':>9} {'MB/s':>8} {'x copy':>7} {'receive MB/s':>13} "
          f"{'shared MB':>10} {'CPU us/frame':>13} {'2 idle cores':>13}")
    for obs in args.obs.split(","):
        names = ["copy", "1 process", "2 processes"] + [f"N=2 {kind}" for kind in ("sync", "async")]
        names += [f"N=2 {kind} keep" for kind in ("sync", "async")]
        if args.n8:
            names += [f"N=8 {kind}" for kind in ("sync", "async")]
        if args.cases:
            names = [name for name in names if name in ("copy", "1 process") or name in args.cases.split(",")]
        rounds: dict[str, list[dict]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                if name in ("copy", "1 process", "2 processes"):
                    result = case(obs, {"copy": "copy", "1 process": "single", "2 processes": "pair"}[name])
                else:
                    n, kind = int(name[2]), name.split()[1]
                    result = case(obs, kind, n, keep=4 if name.endswith("keep") else 0)
                rounds[name].append(result)

        def med(name: str, key: str, rounds: dict = rounds) -> float:
            return statistics.median(r[key] for r in rounds[name])

        single, fb, single_cpu = med("1 process", "rate"), rounds["1 process"][0]["frame_bytes"], med("1 process", "cpu_us")
        copy_mb = med("copy", "rate") * med("copy", "frame_bytes") / 1e6
        print(f"{LABEL[obs]:<16} {'copy':<14} {'':>10} {'':>9} {copy_mb:>8,.0f} {1:>7.2f}")
        for name in names[1:]:
            rate, cpu = med(name, "rate"), med(name, "cpu_us")
            multi = name.startswith("N=")
            print(f"{'':<16} {name:<14} {rate:>10,.0f} {rate / single:>9.2f} {rate * fb / 1e6:>8,.0f} "
                  f"{rate * fb / 1e6 / copy_mb:>7.2f} "
                  f"{('n/a' if args.rpc else format(med(name, 'receive') / 1e6, ',.0f')) if multi else '':>13} "
                  f"{format(med(name, 'shared') / 1e6, ',.1f') if multi else '':>10} {cpu:>13.1f} "
                  f"{(min(2, int(name[2])) if multi else 1) * single_cpu / cpu:>13.2f}"
                  f"   runs: {', '.join(format(r['rate'], ',.0f') for r in rounds[name])}")
    print(f"load average after: {open('/proc/loadavg').read().split()[0]}")


if __name__ == "__main__":
    main()
