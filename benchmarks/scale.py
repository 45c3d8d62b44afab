"""Cluster scale: how a run's start-up, rounds, weight pushes and the trainer's CPU grow with workers.

Parts (``--parts``, all by default), each case in fresh processes:

- ``local``: 8 node collectors x W local workers (``collector_class="sync"``,
  ``num_workers_per_collector=W``, local launcher), W = 1, 4, 8, 16, 32 (N = 8 ... 256 workers),
  sync; and N = 256 async (``collector_class="async"``, ``sync=False``: one local worker's batch
  per request). The env's step sleeps 50 ms (``_common.SleepEnv``): ideal = N / 0.05 frames/s.
- ``hosts``: 4 network-namespace hosts (root), the trainer in host 1, one node collector of W
  local workers in each of hosts 2-4 and ... (``--hosts`` nodes), W = 8 and 32, sync, over RPC
  and the data plane's TCP connections.
- ``ranks``: ``torchrun`` with N = 8, 16, 32, 64 flat collector ranks on this host.
- ``requests``: the trainer's CPU per request for small batches (1 step of a no-work env per
  worker) against the bare round trip of the same transport measured in the same process: a
  16-byte message to a child process and back on a pipe (local workers), a no-op ``rpc_sync``
  and a raw TCP message (ranks).

Per case, in the trainer: constructor to first batch; frames/s over ``--seconds`` after a warm-up
(ratio to ideal); the trainer's CPU (user + system, all threads) per round and per request;
``update_policy_weights_()`` of a 1M-parameter policy (median of 5; it returns when every node
or rank has the version, and a node's local workers copy it from shared memory before their next
batch); ``shutdown()`` time, its warnings, and the processes left; local workers' USS (private
memory) during collection; what each kind of process (local workers, node collectors, the spawners
that forked the workers, the trainer) had spent at the first batch: page faults, user and system
CPU. The policy: argmax of ``Linear(4, 2)`` plus a 1M-float table the
forward does not use, so the push moves 4 MB while a step costs what a small policy costs.

The cost model (``docs/scaling.md``) is fitted to the trainer's CPU per sync round of the
``local`` and ``hosts`` cases: ``a * requests + b * frames``, each point printed with the model's
value and the relative error; the push times give ``c * bytes + d * nodes``.

- ``wide`` (not run by default): 16 node collectors x 32 local workers (512) on a 100 ms env, sync
  (the frames/s 256 workers ask on the 50 ms env), beside 8 x 32 on the same env and 512 bare processes;
  each process's warnings kept, so a worker killed at shutdown is counted; first, the system time a
  page fault costs a forked child here, alone and with 32 faulting at once.
- ``pushes`` (not run by default): 8 x 32 local workers, the push of a 4 MB and a 40 MB policy.
- ``hostpushes`` (not run by default, root): one node collector of 32 local workers in each of
  ``--hosts`` namespace hosts, the same two pushes across the hosts.
- ``metrics`` (not run by default): the 8 x 32 ``local`` case with ``collector.metrics()`` on (the
  default) and off (``metrics=False``), ``--repeats`` of each, interleaved; the ratio of the medians.

    python benchmarks/scale.py [--parts local hosts ranks requests metrics wide pushes hostpushes] [--seconds 8]

``hosts`` and ``hostpushes`` need root and run under the cluster lock (``flock /tmp/rpc-cluster.lock``).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

import _common
from _common import children_of, emit, make_sleep_env, run_case, run_on_hosts

REPO = Path(__file__).resolve().parents[1]
STEP_S = 0.05
# the ``wide`` part's env: 512 workers ask what 256 on STEP_S ask
WIDE_STEP_S = 0.1
PUSHES = 5
PREFIX, SUBNET, HOST_PORT = "rpcc-sc", "10.89.0", 29789


class ScalePolicy(nn.Module):
    """argmax(Linear(4, 2)(observation)), carrying a 1M-float table that a weight push moves."""

    def __init__(self, table: int = 1_000_000) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.table = nn.Parameter(torch.zeros(table))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.linear(observation).argmax(-1)


def uss_mib(pid: int) -> float:
    """Private (unshared) memory of ``pid`` in MiB."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total / 1024


def local_worker_pids(collector) -> list[int]:
    return [pid for info in collector.infos for pid in info.get("local_pids", [info["pid"]])]


def start_costs(collector) -> dict:
    """What each kind of process had spent when the first batch came (:func:`_common.process_costs`):
    the local workers, the node collectors, the spawners that forked the workers, the trainer."""
    workers = local_worker_pids(collector)
    nodes = [info["pid"] for info in collector.infos if "local_pids" in info]
    spawners = {_common.parent_of(pid) for pid in workers} - {None, os.getpid(), *nodes}
    return {"workers": _common.process_costs(workers), "nodes": _common.process_costs(nodes),
            "spawners": _common.process_costs(sorted(spawners)), "trainer": _common.process_costs([os.getpid()])}


def measure(collector, seconds: float, requests_per_batch: int, t0: float) -> dict:
    """Everything a case reports, from a collector built at ``t0``."""
    it = iter(collector)
    next(it)
    first = time.perf_counter() - t0
    costs = start_costs(collector)
    warm = time.perf_counter()
    while time.perf_counter() - warm < min(3.0, seconds / 2):
        next(it)
    uss = [uss_mib(pid) for pid in local_worker_pids(collector)]
    frames, batches, start, c0 = 0, 0, time.perf_counter(), _common.own_cpu_seconds()
    while time.perf_counter() - start < seconds:
        frames += next(it).numel()
        batches += 1
    wall, cpu = time.perf_counter() - start, _common.own_cpu_seconds() - c0
    pushes = _common.push_seconds(collector, it, PUSHES)
    version = int(next(it)["collector", "policy_version"].min())  # every frame of the batch after the pushes
    workers_before = local_worker_pids(collector)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        begin = time.perf_counter()
        collector.shutdown()
        shutdown = time.perf_counter() - begin
    left = [pid for pid in workers_before if _common.alive(pid)]
    return {
        "first_batch_s": first, "frames_per_s": frames / wall, "batches": batches,
        "cpu_ms_per_round": 1e3 * cpu / batches, "cpu_us_per_request": 1e6 * cpu / (batches * requests_per_batch),
        "frames_per_request": frames / (batches * requests_per_batch), "push_ms": 1e3 * statistics.median(pushes),
        "version_after_pushes": version, "shutdown_s": shutdown, "shutdown_warnings": [str(w.message)[:200] for w in caught],
        "workers_left": len(left), "uss_mib_median": statistics.median(uss), "uss_mib_max": max(uss),
        "start": costs,
    }


def local_case(case: dict) -> dict:
    from rpc_collectors import RPCCollector

    _common.quiet()
    torch.set_num_threads(1)
    nodes, per, sync = case["nodes"], case["per"], case["sync"]
    kind = "single" if case.get("flat") else "sync" if sync else "async"
    t0 = time.perf_counter()
    collector = RPCCollector(
        functools.partial(make_sleep_env, case["step_s"]), ScalePolicy(case.get("table", 1_000_000)),
        num_collectors=nodes, launcher="local",
        collector_class=kind, num_workers_per_collector=per, sync=sync, rpc_timeout=120,
        frames_per_batch=(nodes * per if sync else 1) * case["steps"], track_policy_version=True,
        metrics=None if case.get("metrics", True) else False,
    )
    out = measure(collector, case["seconds"], nodes if sync else 1, t0)
    out["spawners_left"] = [pid for pid in children_of() if _common.alive(pid)]
    return out


def rank_trainer(case: dict) -> dict:
    """Rank 0 under torchrun or in a namespace host (the other ranks serve inside the constructor)."""
    from rpc_collectors import RPCCollector

    _common.quiet()
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    per = case.get("per", 1)
    t0 = time.perf_counter()
    collector = RPCCollector(
        functools.partial(make_sleep_env, case["step_s"]), ScalePolicy(case.get("table", 1_000_000)),
        launcher="torchrun", rpc_timeout=120,
        collector_class="sync" if per > 1 else "single", num_workers_per_collector=per, sync=True,
        frames_per_batch=(world - 1) * per * case["steps"], track_policy_version=True,
    )
    if not case.get("rtt"):
        return measure(collector, case["seconds"], world - 1, t0)
    return {**rank_round_trips(collector), **measure(collector, case["seconds"], world - 1, t0)}


def rank_round_trips(collector, calls: int = 300) -> dict:
    """Trainer CPU of a no-op ``rpc_sync`` to rank 1 and of a raw TCP round trip on loopback."""
    from torch.distributed import rpc

    from rpc_collectors.worker import rpc_rank as server

    name = collector.workers._name(0)
    rpc.rpc_sync(name, server.ping, args=(0,))
    c0 = _common.own_cpu_seconds()
    for _ in range(calls):
        rpc.rpc_sync(name, server.ping, args=(0,))
    rpc_us = 1e6 * (_common.own_cpu_seconds() - c0) / calls
    return {"rpc_noop_cpu_us": rpc_us, "tcp_cpu_us": tcp_round_trip(calls)}


def tcp_round_trip(calls: int) -> float:
    """Trainer CPU (us) of a 16-byte message to another process and back over loopback TCP."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    echo = subprocess.Popen([sys.executable, "-c", ECHO.format(port=port)])
    try:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return 1e6 * _round_trips(lambda: conn.sendall(b"x" * 16), lambda: conn.recv(16), calls)
    finally:
        echo.kill()
        echo.wait()
        listener.close()


ECHO = """
import socket
s = socket.create_connection(("127.0.0.1", {port}))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (data := s.recv(16)):
    s.sendall(data)
"""


def _round_trips(send, receive, calls: int) -> float:
    send()
    receive()
    c0 = _common.own_cpu_seconds()
    for _ in range(calls):
        send()
        receive()
    return (_common.own_cpu_seconds() - c0) / calls


def pipe_round_trip(calls: int = 20000) -> float:
    """Trainer CPU (us) of a 16-byte message to a child process and back on a pipe pair."""
    from_parent, to_child = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_child)
        os.close(from_child)
        while data := os.read(from_parent, 16):
            os.write(to_parent, data)
        os._exit(0)
    os.close(from_parent)
    os.close(to_parent)
    try:
        return 1e6 * _round_trips(lambda: os.write(to_child, b"x" * 16), lambda: os.read(from_child, 16), calls)
    finally:
        os.close(to_child)
        os.waitpid(pid, 0)
        os.close(from_child)


def requests_case(case: dict) -> dict:
    """Small batches from 8 local workers: the trainer's CPU per request against a pipe round trip."""
    from rpc_collectors import RPCCollector

    _common.quiet()
    torch.set_num_threads(1)
    bare = pipe_round_trip()
    workers = case["workers"]
    collector = RPCCollector(
        functools.partial(_common.make_no_work_env), _common.ArgmaxLinear(), num_collectors=workers, launcher="local",
        sync=case["sync"], frames_per_batch=(workers if case["sync"] else 1) * case["steps"], rpc_timeout=120,
    )
    calls, batches, cpu = [], 0, 0.0
    with collector:
        it = iter(collector)
        for _ in range(50):
            next(it)
        for _ in range(4):  # the no-op calls and the requests take turns, so both see the same machine
            calls.append(_round_trips(lambda: None, lambda: collector.workers.call(0, "weights_signature").wait(), 500))
            start, c0 = time.perf_counter(), _common.own_cpu_seconds()
            while time.perf_counter() - start < case["seconds"] / 4:
                next(it)
                batches += 1
            cpu += _common.own_cpu_seconds() - c0
    requests = batches * (workers if case["sync"] else 1)
    return {"pipe_cpu_us": bare, "call_cpu_us": 1e6 * statistics.mean(calls), "cpu_us_per_request": 1e6 * cpu / requests,
            "requests_per_s": requests / case["seconds"]}


def bare_case(case: dict) -> dict:
    """No collector: N forked processes each sleeping ``steps`` x ``step_s`` per round (with a
    ``Linear(4, 2)`` call per step), a barrier ending every round: the best a sync round of N
    workers can do on this machine."""
    import multiprocessing

    torch.set_num_threads(1)
    ctx = multiprocessing.get_context("fork")
    workers, rounds = case["workers"], case["rounds"]
    barrier = ctx.Barrier(workers + 1)
    procs = [ctx.Process(target=_bare_worker, args=(barrier, case["steps"], case["step_s"], rounds)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=120)  # all started
        start = time.perf_counter()
        for _ in range(rounds):
            barrier.wait(timeout=120)
        wall = time.perf_counter() - start
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return {"ratio": rounds * case["steps"] * case["step_s"] / wall}


def _bare_worker(barrier, steps: int, step_s: float, rounds: int) -> None:
    policy, observation = nn.Linear(4, 2), torch.zeros(4)
    barrier.wait(timeout=120)
    for _ in range(rounds):
        for _ in range(steps):
            time.sleep(step_s)
            with torch.no_grad():
                policy(observation).argmax()
        barrier.wait(timeout=120)


# ------------------------------------------------------------------ launching ranks


def torchrun_case(ranks: int, args) -> dict:
    """``torchrun --nproc-per-node=ranks+1`` of this script's rank trainer."""
    torchrun = shutil.which("torchrun")
    case = {"step_s": STEP_S, "steps": args.steps, "seconds": args.seconds, "rtt": ranks == 8}
    cmd = [torchrun, f"--nproc-per-node={ranks + 1}", "--master-port", str(_free_port()), __file__,
           "--rank-case", json.dumps(case)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, start_new_session=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"torchrun with {ranks} ranks failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(lines[-1]), "ranks": ranks, "launch_to_exit_s": time.perf_counter() - start}


def _free_port() -> int:
    from rpc_collectors.transport.rendezvous import free_port

    return free_port()


def hosts_case(net, hosts: int, per: int, args, table: int = 1_000_000) -> dict:
    """The trainer in host 1, a node collector of ``per`` local workers in each other host; the policy
    holds a table of ``table`` floats (pushed with each update)."""
    case = {"step_s": STEP_S, "steps": args.steps, "seconds": args.seconds, "per": per, "table": table}
    env = {**os.environ, "WORLD_SIZE": str(hosts), "MASTER_ADDR": f"{SUBNET}.1", "MASTER_PORT": str(HOST_PORT),
           "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": f"{REPO}:{REPO / 'benchmarks'}:{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, __file__, "--rank-case", json.dumps(case)]
    result = run_on_hosts(net, argv, env, list(range(1, hosts + 1)), "sc-host", timeout=600)
    return {**result, "nodes": hosts - 1, "per": per}


# ------------------------------------------------------------------ the parts


def part_local(args) -> list[dict]:
    out = []
    for per in args.per_node:
        case = {"nodes": 8, "per": per, "sync": True, "step_s": STEP_S, "steps": args.steps, "seconds": args.seconds}
        out.append({**case, **run_case(__file__, case, timeout=600)})
    case = {"nodes": 8, "per": max(args.per_node), "sync": False, "step_s": STEP_S, "steps": args.steps,
            "seconds": args.seconds}
    out.append({**case, **run_case(__file__, case, timeout=600)})
    for workers in args.flat:  # flat local workers: a request per worker
        case = {"nodes": workers, "per": 1, "flat": True, "sync": True, "step_s": STEP_S, "steps": args.steps,
                "seconds": args.seconds}
        out.append({**case, **run_case(__file__, case, timeout=600)})
    bare = {"workers": 8 * max(args.per_node), "rounds": 8, "steps": args.steps, "step_s": STEP_S}
    print(f"{bare['workers']} bare processes, sync rounds of {args.steps} steps, no collector: "
          f"{run_case(__file__, bare, timeout=300)['ratio']:.2f} of ideal", flush=True)
    for row in out:
        row["workers"] = row["nodes"] * row["per"]
        row["ratio"] = row["frames_per_s"] / (row["workers"] / STEP_S)
        row["frames_per_round"] = row["workers"] * row["steps"] if row["sync"] else row["steps"]
        row["requests_per_round"] = row["nodes"] if row["sync"] else 1
    return out


def part_wide(args) -> list[dict]:
    """16 node collectors x 32 local workers (512) on a 100 ms env, sync, beside 8 x 32 on the same env
    (the trainer's CPU per round against nodes) and 512 bare processes; every warning of every process
    kept (a worker killed at shutdown says so)."""
    for processes in (1, 32):
        cow, zero = _common.fault_costs(processes)
        print(f"a page fault's system time here, {processes} process(es) faulting at once: copy-on-write "
              f"{cow:.1f} us, zero-fill {zero:.1f} us", flush=True)
    out = []
    for nodes in (8, 16):
        case = {"nodes": nodes, "per": 32, "sync": True, "step_s": WIDE_STEP_S, "steps": args.steps,
                "seconds": args.seconds}
        out.append({**case, **run_case(__file__, case, timeout=600, warnings=True)})
    bare = {"workers": 512, "rounds": 8, "steps": args.steps, "step_s": WIDE_STEP_S}
    print(f"512 bare processes, sync rounds of {args.steps} steps of {WIDE_STEP_S * 1e3:.0f} ms, no collector: "
          f"{run_case(__file__, bare, timeout=300)['ratio']:.3f} of ideal", flush=True)
    for row in out:
        row["workers"] = row["nodes"] * row["per"]
        row["ratio"] = row["frames_per_s"] / (row["workers"] / WIDE_STEP_S)
        row["frames_per_round"], row["requests_per_round"] = row["workers"] * row["steps"], row["nodes"]
        killed = [line for line in row["warnings"] if "SIGKILL" in line]
        print(f"{row['nodes']:>3} x 32 ({row['workers']}): {row['ratio']:.3f} of ideal, first batch "
              f"{row['first_batch_s']:.1f} s, trainer CPU {row['cpu_ms_per_round']:.2f} ms per round "
              f"({row['cpu_ms_per_round'] / row['nodes']:.3f} ms a node), push {row['push_ms']:.1f} ms, "
              f"shutdown {row['shutdown_s']:.2f} s, left {row['workers_left']}, kill warnings {len(killed)}, "
              f"other warnings {len(row['warnings']) - len(killed)}", flush=True)
        print_start(row)
    return out


def print_start(row: dict) -> None:
    """Where a case's start went (:func:`start_costs`): each kind of process's page faults and CPU."""
    cpu = 0.0
    for kind, costs in row["start"].items():
        n = costs["processes"]
        cpu += n * (costs["user_ms"] + costs["system_ms"]) / 1e3
        if n:
            print(f"    {kind} ({n}): {costs['faults']:,.0f} faults, {costs['user_ms']:.1f} ms user, "
                  f"{costs['system_ms']:.1f} ms system each ({1e3 * costs['system_ms'] / costs['faults']:.1f} us "
                  "of system time a fault)", flush=True)
    print(f"    their CPU to the first batch: {cpu:.1f} s", flush=True)


def part_pushes(args) -> list[dict]:
    """8 node collectors x 32 local workers (256), sync, on the 50 ms env: the push of a 4 MB and of a
    40 MB policy (a table of 1M and 10M floats), median of 5, each returning when every node has the
    version (its local workers copy it from shared memory before their next batch)."""
    out = []
    for table in (1_000_000, 10_000_000):
        case = {"nodes": 8, "per": 32, "sync": True, "step_s": STEP_S, "steps": args.steps, "seconds": args.seconds,
                "table": table}
        row = {**case, **run_case(__file__, case, timeout=600)}
        print(f"8 x 32 (256), {4 * table / 1e6:.0f} MB: push {row['push_ms']:.1f} ms (median of {PUSHES}), "
              f"{row['frames_per_s'] / (256 / STEP_S):.3f} of ideal, first batch {row['first_batch_s']:.1f} s, "
              f"shutdown {row['shutdown_s']:.2f} s", flush=True)
        out.append(row)
    return out


def part_metrics(args) -> list[dict]:
    """8 nodes x the most local workers, sync: metrics on (the default) against ``metrics=False``, interleaved."""
    out = []
    for repeat in range(args.repeats):
        for on in (True, False) if repeat % 2 == 0 else (False, True):  # alternated: neither always goes first
            case = {"nodes": 8, "per": max(args.per_node), "sync": True, "step_s": STEP_S, "steps": args.steps,
                    "seconds": args.seconds, "metrics": on}
            out.append({**case, **run_case(__file__, case, timeout=600)})
            print(f"  metrics={'on ' if on else 'off'} {out[-1]['frames_per_s']:,.0f} frames/s, "
                  f"{out[-1]['cpu_ms_per_round']:.2f} ms trainer CPU per round", flush=True)
    rate, cpu = ({m: statistics.median(r[key] for r in out if r["metrics"] is m) for m in (True, False)}
                 for key in ("frames_per_s", "cpu_ms_per_round"))
    print(f"8 x {max(args.per_node)} sync, medians of {args.repeats}: metrics on {rate[True]:,.0f} frames/s, off "
          f"{rate[False]:,.0f} (on/off {rate[True] / rate[False]:.4f}); trainer CPU per round on {cpu[True]:.2f} ms, "
          f"off {cpu[False]:.2f} ms", flush=True)
    return out


def part_hosts(args) -> list[dict]:
    sys.path.insert(0, str(REPO / "tests"))
    import devcluster_module

    out = []
    with devcluster_module.load().HostNetwork(args.hosts + 1, prefix=PREFIX, subnet=SUBNET) as net:
        for per in (1, 8, 32):
            row = hosts_case(net, args.hosts + 1, per, args)
            row.update(workers=row["nodes"] * per, sync=True, steps=args.steps, frames_per_round=row["nodes"] * per * args.steps,
                       requests_per_round=row["nodes"])
            row["ratio"] = row["frames_per_s"] / (row["workers"] / STEP_S)
            out.append(row)
    return out


def part_host_pushes(args) -> list[dict]:
    """One node collector of 32 local workers in each of ``--hosts`` namespace hosts, sync: the push of a
    4 MB and a 40 MB policy across the hosts (median of 5, returning when every node has the version)."""
    sys.path.insert(0, str(REPO / "tests"))
    import devcluster_module

    out = []
    with devcluster_module.load().HostNetwork(args.hosts + 1, prefix=PREFIX, subnet=SUBNET) as net:
        for table in (1_000_000, 10_000_000):
            row = hosts_case(net, args.hosts + 1, 32, args, table)
            workers = row["nodes"] * 32
            print(f"{row['nodes']} hosts x 32 ({workers}), {4 * table / 1e6:.0f} MB: push {row['push_ms']:.1f} ms "
                  f"(median of {PUSHES}), {row['frames_per_s'] / (workers / STEP_S):.3f} of ideal, first batch "
                  f"{row['first_batch_s']:.1f} s, shutdown {row['shutdown_s']:.2f} s", flush=True)
            out.append({**row, "table": table, "workers": workers})
    return out


def part_ranks(args) -> list[dict]:
    out = []
    for ranks in args.ranks:
        row = torchrun_case(ranks, args)
        row.update(workers=ranks, ratio=row["frames_per_s"] / (ranks / STEP_S))
        out.append(row)
    return out


def part_requests(args) -> list[dict]:
    return [{**case, **run_case(__file__, case, timeout=300)}
            for case in ({"requests": 1, "workers": 8, "sync": True, "steps": 1, "seconds": args.seconds},
                         {"requests": 1, "workers": 8, "sync": False, "steps": 1, "seconds": args.seconds})]


def fit(rows: list[dict]) -> list[float]:
    """Least squares ``cpu_ms_per_round = c + a * requests + b * frames`` over ``rows``: ``[c, a, b]`` in ms."""
    x = torch.tensor([[1, r["requests_per_round"], r["frames_per_round"]] for r in rows], dtype=torch.float64)
    y = torch.tensor([r["cpu_ms_per_round"] for r in rows], dtype=torch.float64)
    return torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()


TITLES = {"local": "8 node collectors x W local workers (and flat local workers)",
          "hosts": "one node collector of W local workers in each namespace host"}


def report(results: dict) -> None:
    head = f"{'N':>5}{'mode':>7}{'ratio':>7}{'first s':>9}{'cpu ms/round':>14}{'us/request':>12}{'push ms':>9}" \
           f"{'shutdown s':>11}{'left':>6}{'USS MiB':>9}"
    for part in ("local", "hosts"):
        rows = results.get(part)
        if not rows:
            continue
        print(f"\n== {part}: {TITLES[part]}, 50 ms env ==\n{head}")
        for r in rows:
            mode = "flat" if r.get("flat") else "sync" if r["sync"] else "async"
            print(f"{r['workers']:>5}{mode:>7}{r['ratio']:>7.2f}{r['first_batch_s']:>9.1f}"
                  f"{r['cpu_ms_per_round']:>14.2f}{r['cpu_us_per_request']:>12.0f}{r['push_ms']:>9.1f}"
                  f"{r['shutdown_s']:>11.2f}{r['workers_left']:>6}{r['uss_mib_median']:>9.1f}")
    if results.get("ranks"):
        print(f"\n== ranks: torchrun, N flat collector ranks, 50 ms env ==\n"
              f"{'N':>5}{'ratio':>7}{'first s':>9}{'cpu ms/round':>14}{'push ms':>9}{'shutdown s':>11}{'torchrun s':>11}")
        for r in results["ranks"]:
            print(f"{r['ranks']:>5}{r['ratio']:>7.2f}{r['first_batch_s']:>9.1f}{r['cpu_ms_per_round']:>14.2f}"
                  f"{r['push_ms']:>9.1f}{r['shutdown_s']:>11.2f}{r['launch_to_exit_s']:>11.1f}")
        rtt = [r for r in results["ranks"] if "rpc_noop_cpu_us" in r]
        for r in rtt:
            print(f"ranks={r['ranks']}: trainer CPU per request {r['cpu_us_per_request']:.0f} us "
                  f"({r['frames_per_request']:.0f} frames); no-op rpc_sync {r['rpc_noop_cpu_us']:.0f} us, "
                  f"raw TCP round trip {r['tcp_cpu_us']:.0f} us")
    for r in results.get("requests", []):
        print(f"\n== requests: 8 local workers, 1-step batches, {'sync' if r['sync'] else 'async'} ==\n"
              f"trainer CPU per request {r['cpu_us_per_request']:.0f} us; a no-op call on the worker's pipe "
              f"{r['call_cpu_us']:.0f} us ({r['cpu_us_per_request'] / r['call_cpu_us']:.1f}x); 16 bytes there and back "
              f"on a bare pipe {r['pipe_cpu_us']:.1f} us; {r['requests_per_s']:.0f} requests/s")
    rounds = [r for r in results.get("local", []) if r["sync"]]
    if len({r["requests_per_round"] for r in rounds}) >= 2 and len(rounds) >= 3:
        c, a, b = fit(rounds)
        print(f"\n== cost model (local workers): trainer CPU per sync round = {c:.2f} ms + {a:.3f} ms x requests "
              f"+ {1e3 * b:.3f} us x frames ==")
        for r in rounds:
            model = c + a * r["requests_per_round"] + b * r["frames_per_round"]
            print(f"  N={r['workers']:>4} requests={r['requests_per_round']:>3} frames={r['frames_per_round']:>6}: "
                  f"measured {r['cpu_ms_per_round']:.2f} ms, model {model:.2f} ms ({model / r['cpu_ms_per_round'] - 1:+.0%})")
        results["model"] = {"ms_per_round": c, "ms_per_request": a, "ms_per_frame": b}
    for part in ("hosts", "ranks"):  # a request's cost over RPC: the slope of CPU per round against requests
        rows = results.get(part, [])
        if len(rows) >= 2:
            requests = [r.get("requests_per_round", r["workers"]) for r in rows]
            cpu = [r["cpu_ms_per_round"] for r in rows]
            if len(set(requests)) > 1:
                slope = statistics.linear_regression(requests, cpu)
                print(f"{part}: trainer CPU per sync round = {slope.intercept:.2f} ms + {slope.slope:.3f} ms x requests")
            else:
                print(f"{part}: trainer CPU per request {statistics.mean(c / n for c, n in zip(cpu, requests)):.2f} ms "
                      f"({requests[0]} requests per round, {min(r['frames_per_round'] for r in rows)}-"
                      f"{max(r['frames_per_round'] for r in rows)} frames)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["local", "hosts", "ranks", "requests"],
                        choices=["local", "hosts", "ranks", "requests", "metrics", "wide", "pushes", "hostpushes"])
    parser.add_argument("--repeats", type=int, default=5, help="metrics: runs with metrics on, and as many off")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=20, help="steps per worker per batch")
    parser.add_argument("--per-node", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--flat", type=int, nargs="+", default=[32, 64], help="flat local workers (no nodes)")
    parser.add_argument("--hosts", type=int, default=4, help="node collector hosts (besides the trainer's)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--rank-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        case = json.loads(args.case)
        emit(requests_case(case) if "requests" in case else bare_case(case) if "rounds" in case else local_case(case))
        return
    if args.rank_case:
        result = rank_trainer(json.loads(args.rank_case))
        if int(os.environ.get("RANK", "0")) == 0:
            emit(result)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    parts = {"local": part_local, "hosts": part_hosts, "ranks": part_ranks, "requests": part_requests,
             "metrics": part_metrics, "wide": part_wide, "pushes": part_pushes, "hostpushes": part_host_pushes}
    results = {}
    for name in args.parts:
        print(f"running {name} ...", flush=True)
        results[name] = parts[name](args)
    report(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
