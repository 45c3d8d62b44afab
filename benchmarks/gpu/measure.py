"""The GPU measurements of issue 56 (benchmarks, not tests), each writing its figures into DIR/figures.json.

    python benchmarks/gpu/measure.py probe|batches|weights|policies [--out DIR] [--seconds S] [--budget S] [--dry-run]
    python benchmarks/gpu/measure.py summary --out DIR --steps "name=rc:seconds ..."

* ``probe``: what the driver and NCCL allow on this machine: CUDA in a process forked after
  ``torch.cuda.is_available()`` (without and with ``PYTORCH_NVML_BASED_CUDA_CHECK=1``), and one bare
  NCCL broadcast between two processes on the same GPU.
* ``batches``: 4x84x84 and 3x256x256 uint8 no-work envs (``_common.NoWorkEnv``, the sizes of
  benchmarks/data_plane.py), 2/4/8 async local workers, ``storing_device="cuda"`` against ``"cpu"``:
  frames/s, and the trainer's host-to-device GB/s (time in ``BatchPlane.to_storing_device``) against
  ``batch.pin_memory().to("cuda", non_blocking=True)`` of the same batch, and against that copy from
  memory pinned already, in the same process. Goals: cuda >= 0.95x the frames/s of cpu; GB/s >= 0.8x.
* ``weights``: benchmarks/weight_sync.py's MLP at 10M and 100M parameters, pushed to 4 CartPole workers
  whose policies are on the GPU: ``backend="nccl"`` against one bare NCCL broadcast of the same bytes
  among 5 processes (goal <= 1.2x), and the shared-memory transport into the same GPU policies; each
  push's version must be on every frame of the next batch.
* ``policies``: benchmarks/batched_inference.py's Nature-CNN on 4x84x84 in 8 and 16 async workers, on
  the GPU (``policy_device="cuda"``) against the CPU: frames/s and each worker's peak GPU memory
  (``torch.cuda.max_memory_allocated`` there, and nvidia-smi's per-process figure where it shows them);
  ``AsyncBatchedCollector`` with the CNN on the GPU and 8 / 16 env workers against the per-worker CPU cases.

Cases that can hang in C++ (NCCL) or must start from a fresh interpreter (the fork checks) run in
processes of their own (``_common.run_case``); the others one after another in this process. Each
case's figures are written as soon as it ends, so a step stopped at its limit keeps what it measured;
a case that fails records its error. Without a CUDA device a measurement stops at its first CUDA case
("no CUDA device"): with ``--dry-run`` that is the expected end (exit 0), else a failure.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the helpers below

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402

import _common  # noqa: E402
import data_plane  # noqa: E402
import weight_sync  # noqa: E402
from batched_inference import PIXELS, NatureCNN  # noqa: E402
from rpc_collectors.transport.rendezvous import free_port  # noqa: E402

VERSION = ("collector", "policy_version")
HIDDEN = {"10M": 3200, "100M": 32500}  # weight_sync.MLP widths: 9.8M and 100M parameters


class NoCuda(Exception):
    """This machine has no CUDA device: the measurement stops here."""


class Figures:
    """DIR/figures.json, one section per measurement, rewritten after every case."""

    def __init__(self, out: Path, section: str, budget: float, dry_run: bool) -> None:
        self.path, self.section, self.dry_run = out / "figures.json", section, dry_run
        self.deadline = time.monotonic() + budget
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.data[section] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, label: str, cuda: bool, needs_s: float, measure) -> dict | None:
        """``measure()``'s figures under ``label``, or its error; None once out of time or of CUDA."""
        if cuda and not torch.cuda.is_available():
            raise NoCuda(f"no CUDA device: {self.section} stops before {label!r}")
        if self.left() < needs_s:
            self.put(label, {"skipped": f"out of time ({self.left():.0f} s left, {needs_s:.0f} s needed)"})
            return None
        start = time.monotonic()
        try:
            figures = measure()
        except Exception as err:  # recorded: the other cases go on
            figures = {"error": _last_line(str(err))}
        figures["wall_s"] = round(time.monotonic() - start, 1)
        self.put(label, figures)
        return figures

    def put(self, label: str, figures: dict) -> None:
        self.data[self.section][label] = figures
        print(f"{self.section} | {label}: {json.dumps(figures)}", flush=True)
        self.path.write_text(json.dumps(self.data, indent=1))


def _last_line(text: str) -> str:
    """The telling line of an error (a traceback's last; for NCCL, its 'Last error' line)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    for line in lines:
        if "Duplicate GPU" in line or "re-initialize CUDA" in line:
            return line[:400]
    return (lines[-1] if lines else "?")[:400]


def case(kind: str, timeout: float, **fields) -> dict:
    """One case in a process of its own (this script with ``--case``): its JSON figures; a failure raises."""
    return _common.run_case(__file__, {"kind": kind, **fields}, timeout=timeout)


# ---------------------------------------------------------------- probe
def fork_case(c: dict) -> dict:
    """Call ``torch.cuda.is_available()``, fork, and use CUDA in the child (``nvml``: NVML's check)."""
    if c["nvml"]:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    assert torch.cuda.is_available()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            torch.zeros(1, device="cuda").add_(1)
            message = "ok"
        except Exception as err:
            message = _last_line(str(err))
        os.write(write, message.encode()[:1000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        message = f.read()
    os.waitpid(pid, 0)
    return {"child_cuda": message}


def probe(args: argparse.Namespace, fig: Figures) -> None:
    for nvml in (False, True):
        fig.run(f"fork after is_available, nvml={nvml}", True, 20, lambda nvml=nvml: case("fork", 30, nvml=nvml))
    fig.run("bare NCCL broadcast, 2 processes on one GPU", True, 25,
            lambda: case("bare_nccl", 30, nbytes=1 << 20, world=2, repeats=2))


# ---------------------------------------------------------------- bare NCCL broadcast (as weight_sync.bare_broadcast)
def nccl_group(rank: int, world: int, port: int) -> dist.ProcessGroup:
    torch.cuda.set_device(0)  # every process on the one GPU, as the workers of the collector are
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=30))
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=30)
    return dist.ProcessGroupNCCL(dist.PrefixStore("bare", store), rank, world, options)


def timed_casts(group: dist.ProcessGroup, buffer: torch.Tensor, repeats: int) -> tuple[list[float], list[float]]:
    """``repeats + 1`` barriers alone, then ``barrier; broadcast; barrier``, each ended by a synchronize."""
    token = torch.zeros(1, device="cuda")
    barriers, casts = [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        group.allreduce([token]).wait()
        group.allreduce([token]).wait()
        torch.cuda.synchronize()
        barriers.append(time.perf_counter() - t0)
    for _ in range(repeats + 1):
        group.allreduce([token]).wait()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        group.broadcast(buffer, 0).wait()
        group.allreduce([token]).wait()
        torch.cuda.synchronize()
        casts.append(time.perf_counter() - t0)
    return barriers, casts


def bare_nccl_case(c: dict) -> dict:
    os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL's own reason, should it refuse
    port, world = free_port(), c["world"]
    peers = [subprocess.Popen([sys.executable, __file__, "--peer", json.dumps([r, world, port, c["nbytes"], c["repeats"]])],
                              preexec_fn=_die_with_parent) for r in range(1, world)]
    try:
        group = nccl_group(0, world, port)
        barriers, casts = timed_casts(group, torch.randint(0, 255, (c["nbytes"],), dtype=torch.uint8, device="cuda"),
                                      c["repeats"])
        barrier = statistics.median(barriers[1:]) / 2
        bcast = statistics.median(casts[1:]) - barrier
        with contextlib.suppress(Exception):
            group.shutdown()
        return {"bcast_ms": bcast * 1e3, "barrier_ms": barrier * 1e3, "GBps": c["nbytes"] / bcast / 1e9}
    finally:
        _common.reap(peers, 20)


def _die_with_parent() -> None:
    """A peer is killed with the case that started it (should that one be killed at its timeout)."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def bare_peer(rank: int, world: int, port: int, nbytes: int, repeats: int) -> None:
    group = nccl_group(rank, world, port)
    timed_casts(group, torch.empty(nbytes, dtype=torch.uint8, device="cuda"), repeats)
    with contextlib.suppress(Exception):
        group.shutdown()


# ---------------------------------------------------------------- weights
def weights_case(c: dict) -> dict:
    """MultiSyncCollector, 4 CartPole workers building the MLP (``policy_factory``: no 400 MB pickles),
    on ``c["device"]``; each push is ``update_policy_weights_(policy)`` until it returns and, where the
    trainer uses CUDA, its stream is done (an NCCL send is asynchronous to the host)."""
    from rpc_collectors import MultiSyncCollector

    _common.quiet()
    os.environ.setdefault("NCCL_DEBUG", "WARN")
    policy = weight_sync.MLP(c["hidden"])
    nccl = {"backend": "nccl"} if c["transport"] == "nccl" else {}
    collector = MultiSyncCollector(["CartPole-v1"] * 4, policy_factory=functools.partial(weight_sync.MLP, c["hidden"]),
                                   frames_per_batch=4 * 8, policy_device=c["device"], track_policy_version=True, **nccl)
    try:
        it = iter(collector)
        next(it)
        pushes, versions_ok = [], []
        for _ in range(c["repeats"] + 1):  # the first push lays the weight plane out: not counted
            with torch.no_grad():
                policy.net[0].bias.add_(1e-3)
            t0 = time.perf_counter()
            collector.update_policy_weights_(policy)
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            pushes.append(time.perf_counter() - t0)
            versions_ok.append(bool((next(it)[VERSION] == collector.last_batch.trainer_version).all()))
        out = {"push_ms": statistics.median(pushes[1:]) * 1e3, "push_max_ms": max(pushes[1:]) * 1e3,
               "first_push_ms": pushes[0] * 1e3, "next_batch_has_new_version": all(versions_ok),
               "transport": collector.weights.spec.kind, "nbytes": collector.weights.sender.flat.nbytes}
        if c["hidden"] <= HIDDEN["10M"]:  # every worker's weights against the trainer's (1.6 GB of pickles at 100M)
            trainer = policy.state_dict()
            out["workers_weights_equal"] = all(
                all(torch.equal(w["policy_state_dict"][k].cpu(), v) for k, v in trainer.items())
                for w in collector.state_dict()["workers"])
        return out
    finally:
        collector.shutdown()


def mlp_params(hidden: int) -> int:
    """``weight_sync.numel(hidden)`` without building the MLP (400 MB at 100M)."""
    return 4 * 1024 + 1024 + 1024 * hidden + hidden + hidden * 2048 + 2048 + 2048 * 2 + 2


def weights(args: argparse.Namespace, fig: Figures) -> None:
    """Bare broadcasts and the shared-memory cases first, NCCL's last: a hung NCCL set-up waits out its timeout."""
    def run(label: str, timeout: float, kind: str, **fields) -> dict | None:
        return fig.run(label, True, timeout, lambda: case(kind, timeout, **fields))

    repeats = {"10M": 10, "100M": 5}
    for size, hidden in HIDDEN.items():
        run(f"{size}: bare NCCL broadcast, 5 processes", 25, "bare_nccl", nbytes=mlp_params(hidden) * 4, world=5,
            repeats=repeats[size])
    for size, hidden in HIDDEN.items():
        run(f"{size}: shm, policies on cuda", 35, "weights", transport="shm", hidden=hidden, device="cuda",
            repeats=repeats[size])
    for size, hidden in HIDDEN.items():
        label = f"{size}: backend='nccl', policies on cuda"
        if size != "10M" and "push_ms" not in fig.data["weights"].get("10M: backend='nccl', policies on cuda", {}):
            fig.put(label, {"skipped": "the 10M case failed"})
            continue
        ours = run(label, 25, "weights", transport="nccl", hidden=hidden, device="cuda", repeats=repeats[size])
        bare = fig.data["weights"].get(f"{size}: bare NCCL broadcast, 5 processes", {})
        if ours and "push_ms" in ours and "bcast_ms" in bare:
            ours["x_bare"] = ours["push_ms"] / bare["bcast_ms"]
            fig.put(label, ours)


# ---------------------------------------------------------------- batches into GPU memory
def batches_case(obs: str, n: int, storing: str, seconds: float) -> dict:
    from rpc_collectors import MultiCollector

    shape, dtype, per_worker = data_plane.OBS[obs]
    make = functools.partial(_common.make_no_work_env, shape, dtype)
    collector = MultiCollector([make] * n, None, sync=False, frames_per_batch=per_worker, storing_device=storing)
    try:
        it = iter(collector)
        for _ in range(2 * n):  # every worker's first batch (it sets up its slots), and one more
            next(it)
        plane, spent, moved = collector.slots.plane, [0.0], [0]
        place = plane.to_storing_device

        def timed(batch):
            start = time.perf_counter()
            placed = place(batch)
            spent[0] += time.perf_counter() - start
            moved[0] += sum(v.numel() * v.element_size() for v in placed.values(True, True))
            return placed

        plane.to_storing_device = timed
        out = {"frames_per_s": _common.steady_rate(it, seconds, 0)}
        if storing == "cuda":
            assert spent[0] > 0, "BatchPlane.to_storing_device was never called: the timing misses the copy"
            out["h2d_GBps"] = moved[0] / spent[0] / 1e9
            out.update(plain_copies(next(it).cpu()))
            out["x_pin_then_copy"] = out["h2d_GBps"] / out["pin_then_copy_GBps"]
            out["x_pinned_copy"] = out["h2d_GBps"] / out["pinned_copy_GBps"]
        return out
    finally:
        collector.shutdown()


def plain_copies(batch, repeats: int = 10) -> dict:
    """``batch`` to the GPU as a user would copy it: pinned each time, and from memory pinned already."""
    nbytes = sum(v.numel() * v.element_size() for v in batch.values(True, True))
    pinned = batch.pin_memory()

    def rate(copy) -> float:
        copy()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            copy()
        torch.cuda.synchronize()
        return nbytes * repeats / (time.perf_counter() - start) / 1e9

    return {"pin_then_copy_GBps": rate(lambda: batch.pin_memory().to("cuda", non_blocking=True)),
            "pinned_copy_GBps": rate(lambda: pinned.to("cuda", non_blocking=True)), "batch_MB": nbytes / 1e6}


def batches(args: argparse.Namespace, fig: Figures) -> None:
    torch.set_num_threads(1)
    _common.quiet()
    cases = [(obs, n, storing) for storing in ("cpu", "cuda") for obs in ("84", "256") for n in (2, 4, 8)]
    for obs, n, storing in cases:  # the CPU ones first: a dry run gets that far
        label = f"{data_plane.LABEL[obs]}, {n} workers, storing_device={storing}"
        got = fig.run(label, storing == "cuda", args.seconds + 8,
                      lambda o=obs, k=n, s=storing: batches_case(o, k, s, args.seconds))
        cpu = fig.data["batches"].get(label.replace("=cuda", "=cpu"), {})
        if storing == "cuda" and got and "frames_per_s" in got and "frames_per_s" in cpu:
            got["x_cpu_frames"] = got["frames_per_s"] / cpu["frames_per_s"]
            fig.put(label, got)


# ---------------------------------------------------------------- policies on the GPU
class MeasuredCNN(NatureCNN):
    """The Nature-CNN, also writing its process's peak GPU memory (bytes; 0 on the CPU) with each action."""

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action = super().forward(obs)
        return action, torch.full_like(action, torch.cuda.max_memory_allocated() if action.is_cuda else 0)


def gpu_memory_by_pid() -> dict[int, float]:
    """nvidia-smi's memory (MiB, CUDA context included) of each process it shows; {} where it shows none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split(",") for line in out.strip().splitlines() if line.count(",") == 1]
    return {int(pid): float(mib) for pid, mib in rows if pid.strip().isdigit()}


def policies_case(kind: str, n: int, device: str, seconds: float) -> dict:
    from rpc_collectors import AsyncBatchedCollector, MultiCollector

    env = functools.partial(_common.make_no_work_env, PIXELS, "uint8")
    if kind == "batched":
        collector = AsyncBatchedCollector([env] * n, policy=NatureCNN(), device=device, frames_per_batch=256)
    else:
        policy = TensorDictModule(MeasuredCNN(), in_keys=["observation"], out_keys=["action", "gpu_mem"])
        collector = MultiCollector([env] * n, policy, sync=False, frames_per_batch=32, policy_device=device)
    try:
        it = iter(collector)
        out = {"frames_per_s": _common.steady_rate(it, seconds, 2 * n)}  # iter(it) is it
        if kind == "batched" and device == "cuda":
            out["trainer_peak_MiB"] = torch.cuda.max_memory_allocated() / 2**20
        elif device == "cuda":
            peaks = [next(it)["gpu_mem"].max().item() / 2**20 for _ in range(2 * n)]
            out["worker_peak_MiB"] = max(peaks)
            by_pid = gpu_memory_by_pid()
            out["nvidia_smi_worker_MiB"] = [by_pid[i["pid"]] for i in collector.infos if i and i["pid"] in by_pid]
        return out
    finally:
        collector.shutdown()


def policies(args: argparse.Namespace, fig: Figures) -> None:
    _common.quiet()
    cases = [("multi", 8, "cpu"), ("multi", 16, "cpu"), ("multi", 8, "cuda"), ("multi", 16, "cuda"),
             ("batched", 8, "cuda"), ("batched", 16, "cuda")]
    for kind, n, device in cases:
        label = (f"AsyncBatchedCollector, {n} env workers, CNN on {device}" if kind == "batched"
                 else f"MultiCollector async, {n} workers, a CNN each on {device}")
        got = fig.run(label, device == "cuda", args.seconds + 12,
                      lambda k=kind, m=n, d=device: policies_case(k, m, d, args.seconds))
        cpu = fig.data["policies"].get(f"MultiCollector async, {n} workers, a CNN each on cpu", {})
        if device == "cuda" and got and "frames_per_s" in got and "frames_per_s" in cpu:
            got["x_cpu_per_worker"] = got["frames_per_s"] / cpu["frames_per_s"]
            fig.put(label, got)


# ---------------------------------------------------------------- summary
GOALS = {"x_cpu_frames": (">=", 0.95), "x_pin_then_copy": (">=", 0.8), "x_bare": ("<=", 1.2),
         "next_batch_has_new_version": ("==", True), "workers_weights_equal": ("==", True)}


def summary(args: argparse.Namespace) -> int:
    """Each step's exit code and time, the tests' counts (junit.xml) and every figure; exit 1 if a step failed."""
    import xml.etree.ElementTree as ET

    steps = [s.split("=") for s in args.steps.split()]
    failed = [name for name, result in steps if result.split(":")[0] != "0"]
    print("steps: " + ", ".join(f"{name} exit {r.split(':')[0]} ({r.split(':')[1]} s)" for name, r in steps))
    junit = args.out / "junit.xml"
    if junit.exists():
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        outcome = {c.get("classname", "") + "::" + c.get("name", ""): next(
            (child.tag for child in c if child.tag in ("failure", "error", "skipped")), "passed") for c in cases}
        counts = {k: list(outcome.values()).count(k) for k in ("passed", "failure", "error", "skipped")}
        print(f"tests: {counts['passed']} passed, {counts['failure']} failed, {counts['error']} errors, "
              f"{counts['skipped']} skipped")
        for name, result in outcome.items():
            if result in ("failure", "error"):
                print(f"  {result}: {name}")
    figures = json.loads((args.out / "figures.json").read_text()) if (args.out / "figures.json").exists() else {}
    for section, entries in figures.items():
        print(f"{section}:")
        for label, values in entries.items():
            shown = []
            for key, value in values.items():
                text = f"{value:.3g}" if isinstance(value, float) else str(value)
                if key in GOALS:
                    op, goal = GOALS[key]
                    met = {">=": value >= goal, "<=": value <= goal, "==": value == goal}[op]
                    text += f" (goal {op} {goal}: {'met' if met else 'MISSED'})"
                shown.append(f"{key}={text}")
            print(f"  {label}: {', '.join(shown)}")
    print("FAILED steps: " + ", ".join(failed) if failed else "every step passed")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measurement", nargs="?", choices=["probe", "batches", "weights", "policies", "summary"])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
    parser.add_argument("--seconds", type=float, default=1.5, help="collection per frames/s case")
    parser.add_argument("--budget", type=float, default=70.0, help="seconds this measurement may take")
    parser.add_argument("--dry-run", action="store_true", help="no CUDA device is expected: stopping at one is success")
    parser.add_argument("--steps", default="", help="summary: the steps' results, 'name=rc:seconds ...'")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        bare_peer(*json.loads(args.peer))
        return
    if args.case:
        c = json.loads(args.case)
        _common.emit({"fork": fork_case, "bare_nccl": bare_nccl_case, "weights": weights_case}[c["kind"]](c))
        return
    if args.measurement == "summary":
        sys.exit(summary(args))
    args.out.mkdir(parents=True, exist_ok=True)
    fig = Figures(args.out, args.measurement, args.budget, args.dry_run)
    try:
        {"probe": probe, "batches": batches, "weights": weights, "policies": policies}[args.measurement](args, fig)
    except NoCuda as stop:
        fig.put("stopped", {"reason": str(stop)})
        print(stop, flush=True)
        sys.exit(0 if args.dry_run else 2)
    errors = [label for label, f in fig.data[args.measurement].items() if "error" in f or "skipped" in f]
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
