"""TorchRL's own example scripts and SOTA implementations, run with TorchRL's collectors and with ours.

The scripts come from a pytorch/rl source checkout (``examples/distributed/collectors/`` and
``sota-implementations/{impala,ppo}/``; ``--rev`` exports them from a git repository at that
commit into a temporary folder); the seed tutorial's PPO loop is ``examples/torchrl_ppo.py``
run with ``--collector torchrl``. Each runs twice, unchanged, in a fresh process group: once as
it is, once with TorchRL's collector names (``torchrl.collectors.Collector``, ...,
``torchrl.collectors.distributed.RPCCollector``, ...) rebound to rpc_collectors' classes by a
``sitecustomize`` put first on ``PYTHONPATH`` before the script starts. Only arguments or
hydra overrides that shorten the run and fit a CPU-only machine are added (``SCRIPTS`` below).

Prints one row per script: exit code, wall time, frames the script's loop received and their
rate (counted by the same ``sitecustomize``, which wraps the collectors' ``__iter__`` in the
script's own process: frames after the first batch over the time from the first batch to the
last), what the script itself reports, and the processes the run left behind (found by a marker
in their environment, then killed). Every run's output is kept in the printed log folder.

    python -m venv --system-site-packages .venv-torchrl && .venv-torchrl/bin/pip install torchrl==0.14.1
    .venv-torchrl/bin/pip install hydra-core ale-py 'mujoco<4' imageio ray   # the SOTA scripts' needs
    PYTHONPATH=$PWD .venv-torchrl/bin/python benchmarks/torchrl_examples.py RL_REPO --rev 373c31a85

``gym`` is imported by the distributed examples; where it is not installed, ``import gym`` gives
gymnasium (an alias module beside the ``sitecustomize``). TorchRL's ``Resize`` (IMPALA, PPO Atari)
needs torchvision; where it is not installed (PyPI has no build for a CPU-only torch), a stand-in
resizes with torch's ``interpolate``, antialiased as torchvision does. The submitit scripts need a SLURM
cluster: ``--slurm start`` (the default; root) starts ``slurm/devcluster.py``'s one-node cluster
once no other runs (it waits up to ``--slurm-wait`` s), ``--slurm env`` uses ``$SLURM_CONF``,
``--slurm skip`` leaves those scripts out.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SINGLE, MULTI = "examples/distributed/collectors/single_machine", "examples/distributed/collectors/multi_nodes"
CARTPOLE = ["--env", "CartPole-v1", "--frames_per_batch", "400", "--total_frames", "12000", "--num_nodes", "2"]
SLURM_ARGS = ["--slurm_partition", "debug", "--slurm_gpus_per_task", "0"]
IMPALA = ["collector.total_frames=40000", "collector.num_workers=2", "logger.backend=null"]
DELAYED = ["--partition", "debug", "--num_jobs", "2", "--gpus_per_node", "0", "--cpus_per_task", "1",
           "--frames_per_batch", "400", "--total_frames", "12000", "--time", "0:10:00"]


@dataclasses.dataclass(frozen=True)
class Script:
    path: str  # in the TorchRL checkout, or in this repository when ``ours_file``
    args: tuple[str, ...] = ()
    needs: str = ""  # "slurm" or "ray"
    ours_file: bool = False


# One worker per node: with more, the distributed examples put ``devices=`` in ``collector_kwargs``, which
# neither TorchRL 0.14.1's collectors nor ours accept. The rest shortens runs and fits one CPU-only host
# (SLURM refuses ``--gpus-per-task=0``, the least the multi_nodes scripts' integer option can ask for).
SCRIPTS = (
    Script(f"{SINGLE}/generic.py", (*CARTPOLE, "--backend", "gloo", "--num_workers", "1")),
    Script(f"{SINGLE}/rpc.py", (*CARTPOLE, "--num_workers", "1")),
    Script(f"{SINGLE}/sync.py", (*CARTPOLE, "--backend", "gloo", "--num_workers", "1")),
    Script(f"{MULTI}/generic.py", (*CARTPOLE, "--backend", "gloo", *SLURM_ARGS), "slurm"),
    Script(f"{MULTI}/rpc.py", (*CARTPOLE, *SLURM_ARGS), "slurm"),
    Script(f"{MULTI}/sync.py", (*CARTPOLE, "--backend", "gloo", *SLURM_ARGS), "slurm"),
    Script(f"{MULTI}/delayed_dist.py", (*DELAYED, "--num_workers", "1"), "slurm"),
    Script(f"{MULTI}/delayed_rpc.py", DELAYED, "slurm"),
    Script(f"{MULTI}/ray_collect.py", (), "ray"),
    Script(f"{MULTI}/ray_buffer_infra.py", (), "ray"),
    Script(f"{MULTI}/ray_train.py", (), "ray"),
    Script("sota-implementations/impala/impala_single_node.py", IMPALA),
    Script("sota-implementations/impala/impala_multi_node_ray.py", IMPALA, "ray"),
    Script("sota-implementations/impala/impala_multi_node_submitit.py",  # with 2 workers it passes devices= too
           ("collector.total_frames=20000", "collector.num_workers=1", "logger.backend=null",
            "slurm_config.slurm_partition=debug", "slurm_config.slurm_gpus_per_node=null"), "slurm"),
    Script("sota-implementations/ppo/ppo_mujoco.py",
           ("collector.total_frames=8192", "loss.ppo_epochs=2", "logger.backend=null")),
    Script("sota-implementations/ppo/ppo_atari.py",
           ("collector.total_frames=16384", "collector.frames_per_batch=1024", "env.num_envs=2",
            "loss.ppo_epochs=1", "loss.mini_batch_size=256", "logger.backend=null")),
    Script("examples/torchrl_ppo.py", ("--collector", "torchrl", "--workers", "2", "--frames-per-batch", "1024",
                                       "--total-frames", "8192", "--epochs", "2"), ours_file=True),
)

SITECUSTOMIZE = '''"""Rebinds TorchRL's collector names to rpc_collectors' (RPCC_EXAMPLES_CLASSES=ours) and counts the
frames of the batches the script iterates; in the script's own process only (its children skip it)."""
import os

if os.environ.get("RPCC_EXAMPLES_ROOT") == "":
    os.environ["RPCC_EXAMPLES_ROOT"] = str(os.getpid())
    import atexit
    import importlib
    import json
    import time
    import warnings

    NAMES = ("Collector", "AsyncCollector", "MultiSyncCollector", "MultiAsyncCollector", "MultiCollector",
             "AsyncBatchedCollector", "DistributedCollector", "DistributedSyncCollector", "RPCCollector",
             "RayCollector")
    MODULES = ("torchrl.collectors", "torchrl.collectors.distributed", "torchrl.collectors.distributed.generic",
               "torchrl.collectors.distributed.sync", "torchrl.collectors.distributed.rpc",
               "torchrl.collectors.distributed.ray")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modules = [importlib.import_module(name) for name in MODULES]
        classes = {getattr(m, n) for m in modules for n in NAMES if hasattr(m, n)}
        if os.environ["RPCC_EXAMPLES_CLASSES"] == "ours":
            import rpc_collectors
            for module in modules:
                for name in NAMES:
                    if hasattr(module, name):
                        setattr(module, name, getattr(rpc_collectors, name))
            classes |= {getattr(rpc_collectors, n) for n in NAMES}
    count = {"frames": 0, "batches": 0, "first_frames": 0, "t_first": None, "t_last": None}
    depth = [0]
    written = [0.0]

    def write(force=False):
        if force or time.monotonic() - written[0] > 1.0:
            written[0] = time.monotonic()
            with open(os.environ["RPCC_EXAMPLES_COUNT"] + ".tmp", "w") as f:
                json.dump(count, f)
            os.replace(os.environ["RPCC_EXAMPLES_COUNT"] + ".tmp", os.environ["RPCC_EXAMPLES_COUNT"])

    def counted(iterate):
        def __iter__(self):
            depth[0] += 1
            try:
                for batch in iterate(self):
                    if depth[0] == 1:
                        frames = batch.numel() if hasattr(batch, "numel") else 0
                        now = time.monotonic()
                        if count["t_first"] is None:
                            count["t_first"], count["first_frames"] = now, frames
                        count["frames"] += frames
                        count["batches"] += 1
                        count["t_last"] = now
                        write()
                    yield batch
            finally:
                depth[0] -= 1
        __iter__.counted = True
        return __iter__

    def family(cls):
        yield from cls.__mro__
        for sub in cls.__subclasses__():
            yield from family(sub)

    for cls in {k for c in classes for k in family(c)}:
        if "__iter__" in vars(cls) and not getattr(vars(cls)["__iter__"], "counted", False):
            cls.__iter__ = counted(vars(cls)["__iter__"])
    atexit.register(write, True)
'''

GYM_ALIAS = '''"""gym is not installed here: ``import gym`` gives gymnasium."""
import sys

import gymnasium

sys.modules[__name__] = gymnasium
'''

TORCHVISION_STANDIN = {  # TorchRL's Resize calls these two names only
    "torchvision/__init__.py": '"""torchvision is not installed here: a stand-in for TorchRL\'s Resize."""\n',
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": '''"""``resize`` by torch's ``interpolate`` (antialiased, as torchvision's)."""
import enum

import torch.nn.functional as F


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


def resize(img, size, interpolation=InterpolationMode.BILINEAR, antialias=True):
    mode = InterpolationMode(interpolation).value
    flat = img.reshape(-1, *img.shape[-3:])
    out = F.interpolate(flat.float(), size=list(size), mode=mode, antialias=antialias and mode != "nearest")
    return out.to(img.dtype).reshape(*img.shape[:-2], *out.shape[-2:])
''',
}

REPORTS = (re.compile(r"rate: ([\d.]+) fps"), re.compile(r"Training took ([\d.]+) seconds"),
           re.compile(r"frames\s+\d+\s+reward\s+\S+\s+fps\s+(\d+)"))
REPORT_FORMATS = ("{:.0f} fps", "training {:.1f} s", "{:.0f} fps")
FAILURE = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b.*$", re.M)


def marked_processes(marker: str) -> list[int]:
    """Pids of processes whose environment holds ``RPCC_EXAMPLES_RUN=marker``."""
    needle = f"RPCC_EXAMPLES_RUN={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def cancel_slurm_jobs(env: dict[str, str]) -> None:
    """Cancel every job of the run's cluster (only set up when the cluster is this script's own)."""
    if env.get("RPCC_EXAMPLES_OWN_CLUSTER"):
        subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True, timeout=30, check=False)


def run_one(script: Script, path: Path, classes: str, env: dict[str, str], timeout: float, logs: Path) -> dict:
    """One run of ``path`` with ``classes`` ("theirs" or "ours"); everything it started is ended."""
    marker = uuid.uuid4().hex
    name = f"{script.path.replace('/', '_')}.{classes}"
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=logs))
    count_file = workdir / "frames.json"
    run_env = dict(env, RPCC_EXAMPLES_CLASSES=classes, RPCC_EXAMPLES_COUNT=str(count_file),
                   RPCC_EXAMPLES_ROOT="", RPCC_EXAMPLES_RUN=marker)
    log = logs / f"{name}.log"
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, str(path), *script.args], cwd=workdir, env=run_env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code: int | str = proc.wait(timeout)
        except BaseException as err:  # the timeout, or this script told to stop: end the run's group
            code = "timeout"
            if not isinstance(err, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                raise
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(5)
                    break
                except subprocess.TimeoutExpired:
                    continue
    wall = time.monotonic() - start
    if script.needs == "slurm":
        cancel_slurm_jobs(run_env)
    time.sleep(3)  # processes that end right after the script are not counted as left behind
    left = marked_processes(marker)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30  # gone before the next run starts (a Ray left here must not be joined)
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    text = log.read_text(errors="replace")
    count = json.loads(count_file.read_text()) if count_file.exists() else {}
    span = (count.get("t_last") or 0) - (count.get("t_first") or 0)
    fps = (count["frames"] - count["first_frames"]) / span if span > 0 else None
    says = ""
    for pattern, fmt in zip(REPORTS, REPORT_FORMATS):
        found = pattern.findall(text)
        if found:
            says = fmt.format(float(found[-1]))
            break
    failures = [m.group(0) for m in FAILURE.finditer(text)] or text.strip().splitlines()[-1:]
    why = f"ran past {timeout:.0f} s" if code == "timeout" else failures[-1].strip()[:160] if code != 0 and failures else ""
    return {"code": code, "wall": wall, "frames": count.get("frames", 0), "fps": fps, "says": says,
            "left": len(left), "why": why, "log": str(log)}


def export_checkout(source: Path, rev: str | None, into: Path) -> Path:
    """The folder holding ``examples/`` and ``sota-implementations/``: ``source`` itself, or ``rev`` of the
    git repository ``source`` exported into ``into``."""
    if rev is None:
        return source
    archive = subprocess.run(["git", "-C", str(source), "archive", rev, "examples/distributed/collectors",
                              "sota-implementations/impala", "sota-implementations/ppo"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start_cluster(mode: str, wait_s: float, workdir: Path):
    """(cluster or None, environment additions, why the slurm scripts are left out or "")."""
    if mode == "skip":
        return None, {}, "--slurm skip"
    if mode == "env":
        return (None, {}, "") if os.environ.get("SLURM_CONF") else (None, {}, "--slurm env without SLURM_CONF")
    deadline = time.monotonic() + wait_s
    while subprocess.run(["pgrep", "-x", "slurmctld"], capture_output=True).returncode == 0:
        if time.monotonic() > deadline:
            return None, {}, f"another SLURM cluster ran for {wait_s:.0f} s"
        time.sleep(10)
    spec = importlib.util.spec_from_file_location("devcluster", REPO / "slurm" / "devcluster.py")
    devcluster = importlib.util.module_from_spec(spec)
    sys.modules["devcluster"] = devcluster
    spec.loader.exec_module(devcluster)
    workdir.chmod(0o755)  # MariaDB runs as user mysql
    try:
        cluster = devcluster.start(1, workdir / "cluster")
    except devcluster.ClusterError as err:
        return None, {}, f"the cluster did not start: {str(err).splitlines()[0]}"
    return (devcluster, cluster), {"SLURM_CONF": str(cluster.slurm_conf), "RPCC_EXAMPLES_OWN_CLUSTER": "1"}, ""


def cells(theirs: dict | None, ours: dict | None) -> list[str]:
    """The table's cells of one script, each "TorchRL's / ours"."""
    def values(result: dict | None) -> list[str]:
        if result is None:
            return ["-"] * 6
        fps = f"{result['fps']:,.0f}" if result["fps"] else "-"
        return [str(result["code"]), f"{result['wall']:.1f}", f"{result['frames']:,}", fps, result["says"] or "-",
                str(result["left"])]
    return [f"{a} / {b}" for a, b in zip(values(theirs), values(ours))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="pytorch/rl checkout (or git repository, with --rev)")
    parser.add_argument("--rev", help="export the scripts from this commit of the git repository SOURCE")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    parser.add_argument("--only", nargs="*", default=(), help="run the scripts whose path contains one of these")
    parser.add_argument("--classes", nargs="+", choices=("theirs", "ours"), default=("theirs", "ours"))
    parser.add_argument("--slurm", choices=("start", "env", "skip"), default="start")
    parser.add_argument("--slurm-wait", type=float, default=900, help="seconds to wait for another cluster to stop")
    parser.add_argument("--logs", type=Path, help="folder for each run's output (default: a new one in /tmp)")
    args = parser.parse_args()
    scripts = [s for s in SCRIPTS if not args.only or any(word in s.path for word in args.only)]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="torchrl_examples_"))
    logs.mkdir(parents=True, exist_ok=True)
    checkout = export_checkout(args.source.resolve(), args.rev, Path(tempfile.mkdtemp(prefix="rl_", dir=logs)))
    overlay = logs / "overlay"
    overlay.mkdir(exist_ok=True)
    (overlay / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if importlib.util.find_spec("gym") is None:
        (overlay / "gym.py").write_text(GYM_ALIAS)
    if importlib.util.find_spec("torchvision") is None:
        for name, text in TORCHVISION_STANDIN.items():
            (overlay / name).parent.mkdir(parents=True, exist_ok=True)
            (overlay / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(overlay), str(REPO),
                                                                     os.environ.get("PYTHONPATH")))))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a run and the cluster are ended below
    results: dict[tuple[str, str], dict] = {}

    def run_all(selected: list[Script]) -> None:
        for script in selected:
            path = (REPO if script.ours_file else checkout) / script.path
            for classes in args.classes:
                results[script.path, classes] = result = run_one(script, path, classes, env, args.timeout, logs)
                print(f"{script.path} [{classes}]: exit {result['code']}, {result['wall']:.1f} s", flush=True)

    run_all([s for s in scripts if s.needs != "slurm"])  # first: the cluster may have to wait for another
    on_slurm = [s for s in scripts if s.needs == "slurm"]
    skip_slurm = ""
    if on_slurm:
        cluster, extra, skip_slurm = start_cluster(args.slurm, args.slurm_wait, logs)
        env.update(extra)
        try:
            if not skip_slurm:
                run_all(on_slurm)
        finally:
            if cluster is not None:
                devcluster, started = cluster
                devcluster.stop(started.workdir)
    head = ["exit", "wall s", "frames", "frames/s", "script says", "processes left"]
    print("\nEach cell: with TorchRL's classes / with ours.\n\n| script | " + " | ".join(head) + " |")
    print("|" + " --- |" * (1 + len(head)))
    for script in scripts:
        if script.needs == "slurm" and skip_slurm:
            print(f"| {script.path} | not run: {skip_slurm} |")
            continue
        row = cells(results.get((script.path, "theirs")), results.get((script.path, "ours")))
        print(f"| {script.path} | " + " | ".join(row) + " |")
    print(f"\narguments and overrides added: see SCRIPTS in {Path(__file__).name}; logs in {logs}")
    for (path, classes), result in results.items():
        if result["code"] != 0:
            print(f"  {path} [{classes}]: {result['why']}")


if __name__ == "__main__":
    main()
