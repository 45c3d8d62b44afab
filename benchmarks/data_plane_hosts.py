"""Batches across hosts: two network-namespace hosts, one link, five ways to move 12 MB batches.

Host 1 (10.83.0.1) receives, host 2 (10.83.0.2) sends, over a veth pair through a bridge
(``slurm/devcluster.py``'s ``HostNetwork``). Each way runs for about ``--seconds``:

* raw TCP: one socket, ``sendall`` of a 12 MB buffer, ``recv_into`` a preallocated one (the link's ceiling);
* TensorPipe: ``rpc_sync`` returning a TensorDict of 12 MB (RPC over TensorPipe's TCP "uv" transport,
  what ``RPCCollector`` used for a worker on another host before the data plane's own connection);
* gloo: ``send`` / ``recv`` of a 12 MB uint8 tensor into a preallocated tensor (a process group);
* the data plane: the TCP doorbell of ``rpc_collectors.transport.doorbell`` with batches ready in the
  worker's slots: per batch a request, a "ready" and the slot's bytes received into the trainer's
  slot, then handed out, two requests in flight (what an async ``RPCCollector`` does for a
  worker on another host, minus the env);
* RPCCollector: trainer in host 1, one worker in host 2 (its own hostname, so a remote host to the
  collector), async, the no-work env with 4x84x84 uint8 observations (224 frames = 12.6 MB per
  batch) and with 3x256x256 ones (32 frames = 12.6 MB), each beside what one process makes of
  the same env on host 2 without any transfer (the most one worker can deliver).

The first four ways take ``--repeat`` turns, one after the other, and their median is printed.

Needs root; run under the cluster lock, as the namespace tests do:

    flock /tmp/rpc-cluster.lock python benchmarks/data_plane_hosts.py [--seconds 4]
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
PREFIX, SUBNET, PORT = "rpcc-dp", "10.83.0", 29683
NBYTES = 224 * 2 * 4 * 84 * 84  # one worker's 4x84x84 batch: observation + next observation
OBS = {"84": ((4, 84, 84), 224), "256": ((3, 256, 256), 32)}  # observation shape, frames per batch (12.6 MB)
GLOO_BATCHES = 100
WAYS = ("tcp", "tensorpipe", "gloo", "doorbell", "collector")


def peer(kind: str, rank: int, seconds: float) -> dict:
    """One side of one way of sending; rank 0 (host 1) receives and reports MB/s."""
    master, port = f"{SUBNET}.1", int(os.environ["MASTER_PORT"])
    if kind == "tcp":
        if rank == 0:
            server = socket.create_server((master, port))
            conn, _ = server.accept()
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            buf, total, start = bytearray(NBYTES), 0, time.perf_counter()
            view = memoryview(buf)
            while True:
                got = conn.recv_into(view)
                if not got:
                    break
                total += got
            return {"MBps": total / (time.perf_counter() - start) / 1e6}
        for _ in range(100):
            try:
                conn = socket.create_connection((master, port))
                break
            except OSError:
                time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        data, start = bytes(NBYTES), time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.sendall(data)
        conn.close()
        return {}
    if kind == "gloo":
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=60)
        store = dist.TCPStore(master, port, 2, rank == 0, timeout=timeout)
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(interface=os.environ["GLOO_SOCKET_IFNAME"])]
        group = dist.ProcessGroupGloo(store, rank, 2, options)
        buf = torch.zeros(NBYTES, dtype=torch.uint8)
        group.barrier().wait()
        n, start = GLOO_BATCHES, time.perf_counter()
        for _ in range(n):
            (group.send([buf], 0, 0) if rank == 1 else group.recv([buf], 1, 0)).wait()
        out = {"MBps": n * NBYTES / (time.perf_counter() - start) / 1e6} if rank == 0 else {}
        group.barrier().wait()
        return out
    if kind == "doorbell":
        import pickle

        from rpc_collectors.transport.data import IN_FLIGHT, SLOTS, SlotPool
        from rpc_collectors.transport.doorbell import Ready, answer
        from rpc_collectors.transport.layouts import BatchLayout
        from rpc_collectors.transport.socket_doorbell import SocketDoorbell
        from rpc_collectors.worker.single import SlotWriter

        store = torch.distributed.TCPStore(master, port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
        if rank == 1:
            spec = pickle.loads(store.get("spec"))
            writer = SlotWriter(spec)
            for target in writer.targets:
                target.update_(make_batch())
            answer(spec.doorbell, lambda _version, slot: Ready(slot), writer.memory)
            store.set("joined", b"1")
            store.wait(["done"])
            return {}
        pool = SlotPool(BatchLayout.of(make_batch()), 1, shared=False, slots=SLOTS + IN_FLIGHT - 1)
        bell = SocketDoorbell(master, pool.memory, 60)
        store.set("spec", pickle.dumps(pool.spec(0, bell.ends)))
        store.wait(["joined"])
        bell.opened()
        asked = collections.deque(bell.ring(pool.slot_for(0), 0) for _ in range(IN_FLIGHT))
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:  # as an async RPCCollector does: IN_FLIGHT requests at once
            batch = pool.hand_out(asked.popleft().wait().slot)
            asked.append(bell.ring(pool.slot_for(0), 0))
            n += 1
        out = {"MBps": n * batch.bytes() / (time.perf_counter() - start) / 1e6}
        bell.close()
        store.set("done", b"1")
        return out
    if kind == "tensorpipe":
        import torch.distributed.rpc as rpc

        options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{master}:{port}", _transports=["uv"], rpc_timeout=60)
        rpc.init_rpc(f"r{rank}", rank=rank, world_size=2, rpc_backend_options=options)
        out = {}
        if rank == 0:
            rpc.rpc_sync("r1", make_batch)
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                rpc.rpc_sync("r1", make_batch)
                n += 1
            out = {"MBps": n * NBYTES / (time.perf_counter() - start) / 1e6}
        rpc.shutdown()
        return out
    raise ValueError(kind)


def make_batch():
    """A 12.6 MB TensorDict shaped like one worker's 4x84x84 batch (fresh tensors, as a collector returns)."""
    from tensordict import TensorDict

    obs = torch.zeros(224, 4, 84, 84, dtype=torch.uint8)
    return TensorDict({"observation": obs, ("next", "observation"): obs.clone()}, batch_size=[224])


def collector_rank(seconds: float, single: bool, obs: str) -> dict:
    """RPCCollector in torchrun mode (rank 0 reports MB/s of the remote worker's batches), or
    with ``single`` the same env in one process: what one worker can produce at most."""
    import functools

    sys.path.insert(0, str(REPO / "benchmarks"))
    import _common
    from rpc_collectors import Collector, RPCCollector

    _common.quiet()
    torch.set_num_threads(1)
    shape, frames = OBS[obs]
    make = functools.partial(_common.make_no_work_env, shape, "uint8")
    frame_bytes = 2 * int(torch.Size(shape).numel())  # observation + next observation
    if single:
        c = Collector(make, None, frames_per_batch=frames)
        rate = _common.steady_rate(c, seconds, 3)
        return {"MBps": rate * frame_bytes / 1e6, "rate": rate}
    c = RPCCollector(make, None, frames_per_batch=frames, sync=False, launcher="torchrun", rpc_timeout=60)
    try:
        rate = _common.steady_rate(c, seconds, 3)
        return {"MBps": rate * frame_bytes / 1e6, "rate": rate, "path": c.slots.plane.path_of(0)}
    finally:
        c.shutdown()


def run_pair(net, argv_of, port: int, timeout: float = 120) -> dict:
    procs = []
    for rank in (0, 1):
        argv = argv_of(rank)
        if rank == 1:  # a host of its own name, so a collector sees it as another machine
            argv = ["unshare", "--uts", "sh", "-c", 'hostname dp-h2 && exec "$@"', "sh", *argv]
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
               "TORCH_CPP_LOG_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore",
               "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": f"{SUBNET}.1", "MASTER_PORT": str(port)}
        procs.append(net.popen(rank + 1, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"{argv_of(0)} failed: {err[-2000:]}")
        outs.append(out)
    lines = [line for line in outs[0].splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3, help="turns of each transport way (the median is printed)")
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated subset of {','.join(WAYS)} (tcp always runs)")
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--obs", default="84", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer in ("collector", "single"):
        # ranks != 0 serve inside the constructor and exit there
        out = collector_rank(args.seconds, args.peer == "single", args.obs)
        print(json.dumps(out), flush=True)
        return
    if args.peer:
        print(json.dumps(peer(args.peer, args.rank, args.seconds)), flush=True)
        return

    import devcluster_module

    devcluster = devcluster_module.load()
    me = [sys.executable, str(Path(__file__).resolve())]
    ways = {"tcp", *args.ways.split(",")}
    with devcluster.HostNetwork(2, prefix=PREFIX, subnet=SUBNET) as net:
        rates: dict[str, list[float]] = {}
        for _ in range(args.repeat):  # the ways take turns, so a slow spell of the machine hits them all
            for i, kind in enumerate(WAYS[:-1]):
                if kind in ways:
                    argv = [*me, "--peer", kind, "--seconds", str(args.seconds)]
                    run = run_pair(net, lambda r, argv=argv: [*argv, "--rank", str(r)], PORT + i)
                    rates.setdefault(kind, []).append(run["MBps"])
        results = {kind: {"MBps": statistics.median(r), "runs": r} for kind, r in rates.items()}
        for i, obs in enumerate(OBS if "collector" in ways else ()):
            argv = [*me, "--peer", "collector", "--seconds", str(args.seconds), "--obs", obs]
            results[f"collector{obs}"] = run_pair(net, lambda r, argv=argv: argv, PORT + 4 + i)
            argv = [*me, "--peer", "single", "--seconds", str(args.seconds), "--obs", obs]
            single = net.popen(2, argv, stdout=subprocess.PIPE, text=True)
            results[f"single{obs}"] = json.loads(single.communicate(timeout=120)[0].strip().splitlines()[-1])
    tcp = results["tcp"]["MBps"]
    print(f"two namespace hosts, one veth link, 12.6 MB batches, {args.seconds:.0f} s per way, "
          f"median of {args.repeat} turns, load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{'way':<54} {'MB/s':>8} {'x raw TCP':>10}")
    for kind, label in (("tcp", "raw TCP stream (recv_into)"), ("tensorpipe", "TensorPipe rpc_sync returning a TensorDict"),
                        ("gloo", "gloo send/recv into a preallocated tensor"),
                        ("doorbell", "data plane: TCP doorbell, batches ready in the slots")):
        if kind in results:
            turns = ", ".join(f"{r:,.0f}" for r in results[kind]["runs"])
            print(f"{label:<54} {results[kind]['MBps']:>8,.0f} {results[kind]['MBps'] / tcp:>10.2f}   turns: {turns}")
    for obs, label in (("84", "4x84x84"), ("256", "3x256x256")) if "collector" in ways else ():
        c, one = results[f"collector{obs}"], results[f"single{obs}"]
        name = f"RPCCollector, remote worker ({c['path']}), async, {label}"
        print(f"{name:<54} {c['MBps']:>8,.0f} {c['MBps'] / tcp:>10.2f}"
              f"   {c['rate']:,.0f} frames/s = {c['rate'] / one['rate']:.2f}x one process on host 2:")
        print(f"{'Collector, one process on host 2, ' + label:<54} {one['MBps']:>8,.0f} {one['MBps'] / tcp:>10.2f}"
              f"   {one['rate']:,.0f} frames/s (no transfer)")


if __name__ == "__main__":
    main()
