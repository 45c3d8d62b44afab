"""Worker restarts (``max_worker_restarts``): how long a killed worker is missing, and what a
restart costs the run.

4 local workers step ``_common.SleepEnv`` (latency-bound: 2 ms per step, so the rate does not
depend on free cores) with a small policy whose weights are pushed after every batch. Each
case runs in a fresh process:

1. steady: frames/s over ``--window`` seconds without a failure;
2. then ``--kills`` times: SIGKILL worker 1 at 20% of a ``--window``-second window, and record
   the time from the kill to the first batch that holds its replacement's frames ("death ->
   first batch"), and the window's frames/s divided by the steady rate ("dip": 1.0 means the
   restart cost nothing, 0.75 would be a whole worker missing for the whole window).

    python benchmarks/elastic.py [--window 10] [--kills 3]

Collector ranks that join a running trainer (torchrun/SLURM membership) are not implemented
yet, so their time to a first batch is not measured here.
"""
from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ArgmaxLinear, emit, make_sleep_env, median, quiet, run_case  # noqa: E402

WORKERS, STEP_S, FRAMES = 4, 0.002, 50  # 50 frames per worker and batch: 0.1 s of stepping


def case(sync: bool, window: float, kills: int) -> dict:
    from rpc_collectors import MultiCollector, WorkerRestartWarning

    warnings.simplefilter("ignore", WorkerRestartWarning)
    policy = ArgmaxLinear()
    collector = MultiCollector(
        [functools.partial(make_sleep_env, STEP_S)] * WORKERS, policy,
        frames_per_batch=FRAMES * (WORKERS if sync else 1), sync=sync, max_worker_restarts=kills,
    )
    batches = iter(collector)

    def run(seconds: float, kill_at: float | None) -> tuple[float, float | None]:
        """Frames/s over ``seconds``; with ``kill_at``, also seconds from the kill to the replacement's first batch."""
        frames, start, killed, first = 0, time.perf_counter(), None, None
        old = collector.infos[1]["pid"]
        while (now := time.perf_counter()) - start < seconds:
            if kill_at is not None and killed is None and now - start >= kill_at:
                os.kill(old, signal.SIGKILL)
                killed = time.perf_counter()
            batch = next(batches)
            frames += batch.numel()
            collector.update_policy_weights_()
            replaced = collector.infos[1]["pid"] != old
            if killed is not None and first is None and replaced and (batch["collector", "worker_id"] == 1).any():
                first = time.perf_counter() - killed
        return frames / (time.perf_counter() - start), first

    try:
        run(1.0, None)  # warm-up
        steady, _ = run(window, None)
        dips, firsts = [], []
        for _ in range(kills):
            rate, first = run(window, 0.2 * window)
            dips.append(rate / steady)
            firsts.append(first)
        assert collector.worker_restarts == [0, kills, 0, 0], collector.worker_restarts
    finally:
        collector.shutdown()
    return {"sync": sync, "steady": steady, "dips": dips, "firsts": firsts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet()
    if args.case:
        import json

        emit(case(**json.loads(args.case)))
        return
    print(f"{WORKERS} local workers, SleepEnv {STEP_S * 1e3:.0f} ms/step, {FRAMES} frames per worker batch, "
          f"weights pushed after every batch; {args.kills} kills of worker 1, {args.window:.0f} s windows")
    print(f"{'mode':6} {'steady f/s':>11} {'death -> first batch (s)':>26} {'window f/s / steady':>22}")
    for sync in (True, False):
        r = run_case(__file__, {"sync": sync, "window": args.window, "kills": args.kills},
                     timeout=60 + (args.kills + 2) * args.window * 3)
        firsts = ", ".join("-" if f is None else f"{f:.2f}" for f in r["firsts"])
        dips = ", ".join(f"{d:.2f}" for d in r["dips"])
        print(f"{'sync' if sync else 'async':6} {r['steady']:11,.0f} {firsts:>26} {dips:>22}")
        done = [f for f in r["firsts"] if f is not None]
        if done:
            print(f"{'':6} {'median':>11} {median(done):26.2f} {median(r['dips']):22.2f}")


if __name__ == "__main__":
    main()
