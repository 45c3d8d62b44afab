"""RPC's limits here: flat collector ranks across network-namespace hosts, growing until a size fails.

Each size is one run of ``RPCCollector`` (``collector_class="single"``, one collector per rank,
``launcher="torchrun"``'s variables set by hand, as ``scale.py --parts hosts`` starts them): the
trainer (rank 0) alone in namespace host 1, the collector ranks K to a host in hosts 2, 3, ...
Per size, in the trainer: the rendezvous (``init_rpc`` of the trainer's agent, which waits for
every rank to join), constructor to first batch, the median of 3 pushes of a 1M-parameter
policy (4 MB), ``shutdown()``, and its open files (sockets apart) and threads before the
constructor, after the first batch, after the pushes and after ``shutdown()``; in this script:
how many ranks exited by themselves within 60 s of the trainer, and the lowest MemAvailable
while the size ran (the memory a rank costs: what fell, over the processes).

Parts (``--parts``, all by default):

- ``hosts``: K = 1, 2, 4 ranks per host on 4, 8, 16 hosts (4 ... 64 ranks);
- ``one-host``: 8, 16, 32, 64 ranks in one namespace host (pytorch/pytorch#85607 reports
  ``init_rpc`` failing above 18 ranks on one host);
- ``grow``: 16 hosts x 5, 6, 8, ... ranks (80, 96, 128, ...) until a size fails or would not
  fit in MemAvailable (each size is refused beforehand when its processes, at what one cost in the
  largest size run so far, plus 1.5 GiB kept free, exceed it: the machine has no swap, the kernel
  would kill processes);
- ``nofile``: the largest size that passed, with the trainer's ``RLIMIT_NOFILE`` (soft and hard)
  set below what it needs, twice: with the library's check, and with it taken out (the error
  ``init_rpc`` gives on its own).

The first size that fails is reported with the exact error (the trainer's stderr tail and the
first rank that failed). Every process of a size is killed and reaped when it ends, also when
it fails; the namespaces are torn down at the end. About 20 minutes on the 2-core VM (loaded).

    flock /tmp/rpc-cluster.lock python benchmarks/rpc_limits.py [--parts hosts one-host grow nofile]

Needs root (network namespaces).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
PREFIX, SUBNET, PORT = "rpcc-lim", "10.93.0", 29793
# what a size keeps free of MemAvailable (MiB)
KEEP_FREE_MIB = 1536
# a first guess of what a process costs, until one size has measured it (MiB)
FIRST_GUESS_MIB = 260
STEPS = 5


class PushPolicy(nn.Module):
    """argmax(Linear(4, 2)(observation)), carrying a 1M-float table that a weight push moves."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.table = nn.Parameter(torch.zeros(1_000_000))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def tcp_sockets() -> dict[str, str]:
    """This network namespace's TCP sockets by inode: what each is, by its ports (the store's is
    MASTER_PORT; ``listen`` a listener; ``in``: accepted on a listener of this process; ``out``)."""
    rows = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows += [line.split() for line in f.readlines()[1:]]
        except OSError:
            pass
    store = int(os.environ.get("MASTER_PORT", "0"))
    listening = {int(r[1].rsplit(":", 1)[1], 16) for r in rows if r[3] == "0A"}
    kinds = {}
    for r in rows:
        local, remote = int(r[1].rsplit(":", 1)[1], 16), int(r[2].rsplit(":", 1)[1], 16)
        if r[3] == "0A":
            kind = "listen"
        elif local == store:
            kind = "store in"
        elif remote == store:
            kind = "store out"
        else:
            kind = "in" if local in listening else "out"
        kinds[r[9]] = kind
    return kinds


def open_files() -> dict:
    """This process's open files (sockets among them, by kind) and threads."""
    fds = os.listdir("/proc/self/fd")
    sockets, kinds, tcp = 0, {}, tcp_sockets()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            sockets += 1
            kind = tcp.get(target[8:-1], "unix or other")
            kinds[kind] = kinds.get(kind, 0) + 1
    with open("/proc/self/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return {"fds": len(fds), "sockets": sockets, "threads": threads, "kinds": kinds}


def rank_main(case: dict) -> None:
    """Every rank runs this: rank 0 trains and prints its figures as JSON; the others serve."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import _common
    from rpc_collectors import RPCCollector
    from rpc_collectors.worker import rpc_rank

    _common.quiet()
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    trainer = int(os.environ["RANK"]) == 0
    out: dict = {"python_start_s": case["launched"]}
    if trainer:
        if case.get("nofile"):
            resource.setrlimit(resource.RLIMIT_NOFILE, (case["nofile"], case["nofile"]))
        if case.get("no_check"):
            from rpc_collectors.core import rank_limits

            rank_limits.check_open_files = lambda *a, **k: None
        start_agent = rpc_rank.start_agent

        def timed_start(*args, **kwargs):
            begin = time.perf_counter()
            start_agent(*args, **kwargs)
            out["init_s"] = time.perf_counter() - begin
            out["open_after_init"] = open_files()

        rpc_rank.start_agent = timed_start
        out["open_before"] = open_files()
    out["imported_at"] = time.time()
    t0 = time.perf_counter()
    collector = RPCCollector(
        functools.partial(_common.make_sleep_env, 0.01), PushPolicy(), launcher="torchrun",
        rpc_timeout=case["rpc_timeout"], collector_class="single", sync=True,
        frames_per_batch=(world - 1) * STEPS, track_policy_version=True,
    )
    it = iter(collector)
    next(it)
    out["first_batch_s"] = time.perf_counter() - t0
    out["open_after_first_batch"] = open_files()
    out["push_ms"] = 1e3 * statistics.median(_common.push_seconds(collector, it, 3))
    out["open_after_pushes"] = open_files()
    begin = time.perf_counter()
    collector.shutdown()
    out["shutdown_s"] = time.perf_counter() - begin
    out["open_after_shutdown"] = open_files()
    print(json.dumps(out), flush=True)


# ------------------------------------------------------------------ the parent


def mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1024


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


class MemoryLow:
    """The lowest MemAvailable, sampled every 0.25 s in a thread while the block runs."""

    def __enter__(self) -> "MemoryLow":
        self.low, self._stop = mem_available_mib(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.25):
            self.low = min(self.low, mem_available_mib())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` (it leads one) and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_size(net, ranks: int, per_host: int, args, extra: dict | None = None) -> dict:
    """One size: the trainer in host 1, ``ranks`` collector ranks ``per_host`` to a host from host 2."""
    world = ranks + 1
    env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": f"{SUBNET}.1", "MASTER_PORT": str(PORT),
           "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": f"{REPO}:{REPO / 'benchmarks'}:{os.environ.get('PYTHONPATH', '')}"}
    logs = Path(tempfile.mkdtemp(prefix="rpc-limits-"))
    procs: list[subprocess.Popen] = []
    row = {"ranks": ranks, "per_host": per_host, "hosts": -(-ranks // per_host), **(extra or {})}
    before, launched = mem_available_mib(), time.time()
    case = json.dumps({"rpc_timeout": args.rpc_timeout, "launched": launched, **(extra or {})})
    try:
        with MemoryLow() as memory:
            for rank in range(world):
                host = 1 if rank == 0 else 2 + (rank - 1) // per_host
                cmd = [sys.executable, __file__, "--rank-case", case]
                if rank > 0:
                    # a machine of its own name: the collector must not take it for the trainer's
                    cmd = ["unshare", "--uts", "sh", "-c", f'hostname lim-host{host} && exec "$@"', "sh", *cmd]
                with open(logs / f"{rank}.out", "w") as out, open(logs / f"{rank}.err", "w") as err:
                    procs.append(net.popen(host, cmd, env={**env, "RANK": str(rank), "LOCAL_RANK": "0"},
                                           stdout=out, stderr=err, start_new_session=True))
            try:
                procs[0].wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                row["error"] = f"the trainer ran past {args.timeout} s"
            ended = time.time()
            deadline = time.monotonic() + 60
            for proc in procs[1:]:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            row["ranks_exited"] = sum(proc.poll() is not None for proc in procs[1:])
            row["ranks_exit_0"] = sum(proc.poll() == 0 for proc in procs[1:])
            row["last_rank_exit_after_trainer_s"] = time.time() - ended
    finally:
        for proc in procs:
            kill_group(proc)
    row["mib_per_process"] = (before - memory.low) / world
    row["mem_low_mib"] = memory.low
    row["load"] = load_average()
    lines = [line for line in (logs / "0.out").read_text().splitlines() if line.startswith("{")]
    if procs[0].returncode == 0 and lines:
        result = json.loads(lines[-1])
        row.update(result)
        row["start_to_init_s"] = result["imported_at"] - launched + result["init_s"]
    else:
        row.setdefault("error", f"the trainer exited with {procs[0].returncode}")
        row["trainer_stderr"] = (logs / "0.err").read_text()[-2500:]
        failed = [r for r in range(1, world) if procs[r].returncode not in (0, None)]
        if failed:
            row["first_failed_rank"] = failed[0]
            row["rank_stderr"] = (logs / f"{failed[0]}.err").read_text()[-1500:]
    left = [int(p) for h in range(1, len(net.hosts) + 1)
            for p in subprocess.run(["ip", "netns", "pids", net.host(h).netns], capture_output=True,
                                    text=True).stdout.split()]
    row["processes_left"] = len(left)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["rm", "-rf", str(logs)], check=False)
    return row


def fits(ranks: int, per_process_mib: float) -> tuple[bool, str]:
    need = (ranks + 1) * per_process_mib + KEEP_FREE_MIB
    have = mem_available_mib()
    return need <= have, f"{ranks + 1} processes x {per_process_mib:.0f} MiB + {KEEP_FREE_MIB} MiB kept free " \
                         f"= {need:,.0f} MiB, MemAvailable {have:,.0f} MiB"


def show(row: dict) -> None:
    if "error" in row:
        print(f"  {row['ranks']:>4} ranks ({row['per_host']}/host): FAILED: {row['error']}", flush=True)
        return
    o = row["open_after_pushes"]
    print(f"  {row['ranks']:>4} ranks ({row['per_host']}/host): init {row['init_s']:.1f} s (start to init "
          f"{row['start_to_init_s']:.1f} s), first batch {row['first_batch_s']:.1f} s, push {row['push_ms']:.0f} ms, "
          f"shutdown {row['shutdown_s']:.2f} s, ranks exited {row['ranks_exited']}/{row['ranks']}, trainer fds "
          f"{o['fds']} ({o['sockets']} sockets, {o['threads']} threads), {row['mib_per_process']:.0f} MiB/process, "
          f"load {row['load']}", flush=True)


def sweep(net, sizes: list[tuple[int, int]], args, memory: dict) -> list[dict]:
    """Run ``sizes`` (ranks, per host) in order, stopping at the first that fails or would not fit."""
    rows = []
    for ranks, per_host in sizes:
        ok, why = fits(ranks, memory["per_process"])
        if not ok:
            rows.append({"ranks": ranks, "per_host": per_host, "refused": why})
            print(f"  {ranks:>4} ranks ({per_host}/host): not run, would not fit: {why}", flush=True)
            break
        row = run_size(net, ranks, per_host, args)
        rows.append(row)
        show(row)
        if "error" in row:
            break
        # the largest size's figure: fixed costs spread over the most processes
        if ranks >= memory.get("largest", (0, 1))[0]:
            memory["per_process"], memory["largest"] = row["mib_per_process"], (ranks, per_host)
    return rows


def report(results: dict) -> None:
    head = f"{'ranks':>6}{'/host':>6}{'hosts':>6}{'init s':>8}{'start-init s':>13}{'1st batch s':>12}" \
           f"{'push ms':>8}{'shutdown s':>11}{'exited':>8}{'fds':>6}{'sockets':>8}{'threads':>8}{'MiB/proc':>9}"
    for part, rows in results.items():
        print(f"\n== {part} ==\n{head}")
        for r in rows:
            if "refused" in r:
                print(f"{r['ranks']:>6}{r['per_host']:>6}  not run: {r['refused']}")
            elif "error" in r:
                print(f"{r['ranks']:>6}{r['per_host']:>6}{r['hosts']:>6}  FAILED: {r['error']}\n"
                      f"  trainer stderr tail:\n{r.get('trainer_stderr', '')[-1500:]}\n"
                      f"  first failed rank ({r.get('first_failed_rank')}) stderr tail:\n{r.get('rank_stderr', '')[-800:]}")
            else:
                o = r["open_after_pushes"]
                print(f"{r['ranks']:>6}{r['per_host']:>6}{r['hosts']:>6}{r['init_s']:>8.1f}{r['start_to_init_s']:>13.1f}"
                      f"{r['first_batch_s']:>12.1f}{r['push_ms']:>8.0f}{r['shutdown_s']:>11.2f}"
                      f"{r['ranks_exited']:>4}/{r['ranks']:<3}{o['fds']:>6}{o['sockets']:>8}{o['threads']:>8}"
                      f"{r['mib_per_process']:>9.0f}")
    ok = [r for rows in results.values() for r in rows if "init_s" in r]
    if len(ok) >= 2:
        fit = statistics.linear_regression([r["ranks"] for r in ok], [r["open_after_pushes"]["fds"] for r in ok])
        sockets = statistics.linear_regression([r["ranks"] for r in ok],
                                               [r["open_after_pushes"]["sockets"] for r in ok])
        print(f"\ntrainer's open files after the pushes = {fit.intercept:.0f} + {fit.slope:.2f} x ranks "
              f"(sockets {sockets.intercept:.0f} + {sockets.slope:.2f} x ranks)")
        worst = max(ok, key=lambda r: r["open_after_first_batch"]["fds"] / r["ranks"])
        print(f"most per rank at the first batch: {worst['open_after_first_batch']['fds']} at {worst['ranks']} ranks")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["hosts", "one-host", "grow", "nofile"],
                        choices=["hosts", "one-host", "grow", "nofile"])
    parser.add_argument("--per-host", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--one-host", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--grow", type=int, nargs="+", default=[5, 6, 8, 10, 12, 16],
                        help="ranks per host on 16 hosts, in order, until one fails")
    parser.add_argument("--rpc-timeout", type=float, default=60.0, help="the library's default")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds a size may take")
    parser.add_argument("--rank-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_case:
        rank_main(json.loads(args.rank_case))
        return
    if os.geteuid() != 0:
        sys.exit("rpc_limits.py needs root (network namespaces)")
    sys.path.insert(0, str(REPO / "tests"))
    import devcluster_module

    print(f"load average at the start: {load_average()}; MemAvailable {mem_available_mib():,.0f} MiB; "
          f"RLIMIT_NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)}", flush=True)
    results: dict[str, list[dict]] = {}
    memory = {"per_process": FIRST_GUESS_MIB}
    hosts_needed = 1 + max([*args.hosts, 16, 1])
    with devcluster_module.load().HostNetwork(hosts_needed, prefix=PREFIX, subnet=SUBNET) as net:
        if "hosts" in args.parts:
            print("running hosts ...", flush=True)
            results["hosts"] = sweep(net, [(h * k, k) for h in args.hosts for k in args.per_host], args, memory)
        if "one-host" in args.parts:
            print("running one-host ...", flush=True)
            results["one-host"] = sweep(net, [(n, n) for n in args.one_host], args, memory)
        if "grow" in args.parts:
            print("running grow ...", flush=True)
            results["grow"] = sweep(net, [(16 * k, k) for k in args.grow], args, memory)
        if "nofile" in args.parts and memory.get("largest"):
            ranks, per_host = memory["largest"]
            print(f"running nofile at {ranks} ranks ...", flush=True)
            ok = [r for rows in results.values() for r in rows if r.get("ranks") == ranks and "init_s" in r]
            need = ok[-1]["open_after_first_batch"]["fds"]
            limit = max(64, need // 2)
            rows = []
            for no_check in (False, True):
                row = run_size(net, ranks, per_host, args, {"nofile": limit, "no_check": no_check})
                rows.append(row)
                print(f"  RLIMIT_NOFILE {limit} (needs {need}), check {'off' if no_check else 'on'}: "
                      f"{row.get('error', 'ran')}\n{row.get('trainer_stderr', '')[-1200:]}", flush=True)
            results["nofile"] = rows
    report({k: v for k, v in results.items() if k != "nofile"})
    print(f"\nload average at the end: {load_average()}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
