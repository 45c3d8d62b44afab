"""Elastic runs: how long a killed worker is missing, how soon a joining collector delivers,
and what either costs the run.

Restarts (``max_worker_restarts``):

4 local workers step ``_common.SleepEnv`` (latency-bound: 2 ms per step, so the rate does not
depend on free cores) with a small policy whose weights are pushed after every batch. Each
case runs in a fresh process:

1. steady: frames/s over ``--window`` seconds without a failure;
2. then ``--kills`` times: SIGKILL worker 1 at 20% of a ``--window``-second window, and record
   the time from the kill to the first batch that holds its replacement's frames ("death ->
   first batch"), and the window's frames/s divided by the steady rate ("dip": 1.0 means the
   restart cost nothing, 0.75 would be a whole worker missing for the whole window).

Membership (``elastic=True``): a trainer (torchrun variables, no ranks of its own) with 2
collector slots, filled by 2 collector processes that joined it on this host, same env and
policy. Then ``--kills`` times, at 20% of a window: SIGKILL the collector of slot 1 and start a
new process that joins. Recorded: seconds from the new process's start to its first batch
("start -> first batch": Python, imports, rendezvous, join), from the trainer admitting it to
its first batch ("admit -> first batch": the membership change itself, with the weights
catch-up and one 0.1 s batch), and the window's frames/s over the steady rate. With a spare
(a third collector waiting), the spare takes the slot at once and the new process becomes
the next spare; the times are then from the kill and from the spare's admission to the slot.

    python benchmarks/elastic.py [--window 10] [--kills 3]
"""
from __future__ import annotations

import argparse
import functools
import os
import signal
import subprocess
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
        track_policy_version=True,  # each frame's ("collector", "worker_id") shows the replaced worker's frames
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


def join_case(sync: bool, window: float, kills: int, spare: bool = False) -> dict:
    from rpc_collectors import RPCCollector, WorkerLeftWarning
    from rpc_collectors.transport.rendezvous import free_port

    warnings.simplefilter("ignore", WorkerLeftWarning)
    port = free_port()
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    collector = RPCCollector(
        functools.partial(make_sleep_env, STEP_S), ArgmaxLinear(), frames_per_batch=FRAMES * (2 if sync else 1),
        num_collectors=2, sync=sync, launcher="torchrun", elastic=True, rpc_timeout=10, join_timeout=60,
        track_policy_version=True,
    )
    admitted: dict[int, float] = {}  # rank -> when the trainer admitted it
    admit = collector.recovery.admit

    def timed_admit(rank: int) -> None:
        admitted[rank] = time.perf_counter()
        admit(rank)

    collector.recovery.admit = timed_admit
    env = dict(os.environ, RPC_COLLECTORS_JOIN=f"127.0.0.1:{port}", PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    procs: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--collector"], env=env))
        return procs[-1]

    batches = iter(collector)

    def run(seconds: float, kill_at: float | None) -> tuple[float, float | None, float | None]:
        """Frames/s over ``seconds``; with ``kill_at``, seconds from the start of the process that
        takes slot 1 (the kill, with a spare) to its first batch, and from its admission."""
        frames, begin, started, first, admit_first = 0, time.perf_counter(), None, None, None
        while (now := time.perf_counter()) - begin < seconds:
            if kill_at is not None and started is None and now - begin >= kill_at:
                killed = collector.infos[1]["pid"]
                os.kill(killed, signal.SIGKILL)
                newcomer, started = start(), time.perf_counter()  # with a spare, the next spare
            batch = next(batches)
            frames += batch.numel()
            collector.update_policy_weights_()
            taker = collector.infos[1]
            if started is not None and first is None and taker and taker["pid"] != killed:
                if (batch["collector", "worker_id"] == 1).any() and (spare or taker["pid"] == newcomer.pid):
                    first = time.perf_counter() - started
                    admit_first = time.perf_counter() - admitted[taker["rank"]]
        return frames / (time.perf_counter() - begin), first, admit_first

    try:
        for _ in range(3 if spare else 2):
            start()
        while len(admitted) < len(procs):  # every one joined
            next(batches)
        run(2.0, None)  # warm
        steady, _, _ = run(window, None)
        dips, firsts, admits = [], [], []
        for _ in range(kills):
            while not all(collector.infos):  # the last newcomer is in
                next(batches)
            rate, first, admit_first = run(window, 0.2 * window)
            dips.append(rate / steady)
            firsts.append(first)
            admits.append(admit_first)
    finally:
        collector.shutdown()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return {"sync": sync, "steady": steady, "dips": dips, "firsts": firsts, "admits": admits}


def collector_main() -> None:
    """A process that joins the trainer named by RPC_COLLECTORS_JOIN (it never returns)."""
    from rpc_collectors import RPCCollector

    RPCCollector(None, frames_per_batch=1, elastic=True, rpc_timeout=10, join_timeout=60)


def _cells(values: list) -> str:
    return ", ".join("-" if v is None else f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--join-case", help=argparse.SUPPRESS)
    parser.add_argument("--collector", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet()
    if args.collector:
        collector_main()
    if args.case or args.join_case:
        import json

        emit(case(**json.loads(args.case)) if args.case else join_case(**json.loads(args.join_case)))
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

    print(f"\nelastic trainer, 2 collector slots; {args.kills} times: one collector SIGKILLed and a new process "
          f"joins, {args.window:.0f} s windows")
    print(f"{'mode':14} {'steady f/s':>11} {'start -> first batch (s)':>26} {'admit -> first batch (s)':>26} "
          f"{'window f/s / steady':>22}")
    for sync, spare in ((True, False), (False, False), (True, True)):
        r = run_case(__file__, {"sync": sync, "window": args.window, "kills": args.kills, "spare": spare},
                     timeout=60 + (args.kills + 2) * args.window * 3, flag="--join-case")
        mode = ("sync" if sync else "async") + (" + spare" if spare else "")
        print(f"{mode:14} {r['steady']:11,.0f} {_cells(r['firsts']):>26} {_cells(r['admits']):>26} {_cells(r['dips']):>22}")


if __name__ == "__main__":
    main()
