"""Collection alone against Sample Factory 2.1.1's sampler: the same env classes, the same
networks, the same number of env processes.

Sample Factory's side is its own collect-only path, ``SyncSamplingAPI`` (its parallel sampler:
rollout worker processes, one inference worker process, no learner), with one env per worker
and with its double-buffered default (2 envs per worker stepped in 2 splits). Ours: the
``AsyncBatchedCollector`` (one batched forward pass in the trainer; with ``envs_per_worker=2``
where the collector accepts it) and the ``MultiSyncCollector``/``MultiAsyncCollector`` (a policy
copy in every worker). TorchRL 0.14's ``AsyncBatchedCollector`` runs in the same rounds.

Envs (``_sf_shared``): (a) CartPole-v1 with a 2-layer tanh MLP, (b) ``PixelEnv``, a no-work env
of 4x84x84 uint8 frames, with DQN's Nature CNN. Each case is a fresh process group (Sample
Factory's in its own venv, installed by this script on first use, since its pins differ from
ours: numpy<2, gymnasium<1; TorchRL's in the TorchRL venv); frames/s over ``--seconds`` after
``--warmup`` seconds, the cases interleaved round after round (ABAB...), medians; ratios are
ours / Sample Factory's. Every process of a case is killed when the case ends or on Ctrl-C.

    python benchmarks/vs_sample_factory.py [--procs 2] [--rounds 3] [--seconds 5] [--envs pixels,cartpole]
"""
from __future__ import annotations

import argparse
import functools
import inspect
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _sf_shared import FEATURES, GreedyPolicy, frames_per_second, make_env, trunk

SF_VERSION = "2.1.1"
HERE = Path(__file__).resolve().parent
# frames per batch of our collectors: per env process (Sample Factory's trajectories are 32 frames of one env)
FRAMES_PER_WORKER = {"pixels": 128, "cartpole": 512}


# ---- each side's setup: env factory, policy, collector; an iterator of batch sizes and a closer ----

def sample_factory_sampler(case: dict):
    from sample_factory.algo.sampling.simplified_sampling_api import SyncSamplingAPI
    from sample_factory.algo.utils.context import global_model_factory
    from sample_factory.algo.utils.env_info import obtain_env_info_in_a_separate_process
    from sample_factory.algo.utils.rl_utils import samples_per_trajectory
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env

    env, procs, envs_per_proc = case["env"], case["procs"], case["envs_per_proc"]
    register_env(env, sf_env)
    global_model_factory().register_encoder_factory(sf_encoder)
    # no input normalisation (the trunk scales the frames, as on our side); the rest is Sample
    # Factory's default: workers pinned to cores, one torch thread at niceness +2 for inference
    argv = [f"--env={env}", "--experiment=vs_sample_factory", f"--train_dir={case['tmp']}", "--device=cpu",
            f"--num_workers={procs}", f"--num_envs_per_worker={envs_per_proc}",
            f"--worker_num_splits={envs_per_proc}", "--use_rnn=False", "--normalize_input=False", "--obs_scale=1.0"]
    parser, _ = parse_sf_args(argv)
    cfg = parse_full_cfg(parser, argv)
    sampler = SyncSamplingAPI(cfg, obtain_env_info_in_a_separate_process(cfg))
    sampler.start()
    batches = (samples_per_trajectory(sampler.get_trajectories_sync()) for _ in itertools.count())
    return batches, sampler.stop


def ours_collector(case: dict):
    from rpc_collectors import AsyncBatchedCollector, MultiAsyncCollector, MultiSyncCollector

    env, procs, envs_per_proc = case["env"], case["procs"], case["envs_per_proc"]
    factory = functools.partial(our_env, env)
    per_worker = FRAMES_PER_WORKER[env]
    if case["kind"] == "batched":
        extra = {} if envs_per_proc == 1 else {"envs_per_worker": envs_per_proc}
        collector = AsyncBatchedCollector([factory] * procs * envs_per_proc, policy=GreedyPolicy(env),
                                          frames_per_batch=per_worker * procs, **extra)
    elif case["kind"] == "sync":
        collector = MultiSyncCollector([factory] * procs, GreedyPolicy(env), frames_per_batch=per_worker * procs)
    else:
        collector = MultiAsyncCollector([factory] * procs, GreedyPolicy(env), frames_per_batch=per_worker)
    it = iter(collector)
    return (next(it).numel() for _ in itertools.count()), collector.shutdown


def torchrl_collector(case: dict):
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import AsyncBatchedCollector

    env, procs, envs_per_proc = case["env"], case["procs"], case["envs_per_proc"]
    factory = functools.partial(torchrl_env, env)
    policy = TensorDictModule(GreedyPolicy(env, one_hot=True), in_keys=["observation"], out_keys=["action"])
    collector = AsyncBatchedCollector([factory] * procs * envs_per_proc, policy=policy, transport="driver",
                                      frames_per_batch=FRAMES_PER_WORKER[env] * procs,
                                      env_backend="multiprocessing", envs_per_worker=envs_per_proc)
    it = iter(collector)
    return (next(it).numel() for _ in itertools.count()), collector.shutdown


# ---- the env and network factories each side's processes call (module level: picklable) ----

def sf_env(full_env_name: str, cfg=None, env_config=None, render_mode=None):
    return make_env(full_env_name)


def sf_encoder(cfg, obs_space):
    from sample_factory.model.encoder import Encoder

    class Trunk(Encoder):
        def __init__(self) -> None:
            super().__init__(cfg)
            self.trunk = trunk(cfg.env)

        def forward(self, obs_dict):
            return self.trunk(obs_dict["obs"])

        def get_out_size(self) -> int:
            return FEATURES[cfg.env]

    return Trunk()


def our_env(env: str):
    from rpc_collectors import GymEnv

    return GymEnv(make_env(env))


def torchrl_env(env: str):
    from torchrl.envs import GymWrapper

    return GymWrapper(make_env(env))


SETUPS = {"sf": sample_factory_sampler, "ours": ours_collector, "torchrl": torchrl_collector}


def run(case: dict) -> dict:
    """One case, in this process: frames/s, or the reason it cannot run."""
    if case["side"] == "ours" and case["kind"] == "batched" and case["envs_per_proc"] > 1:
        from rpc_collectors import AsyncBatchedCollector

        if "envs_per_worker" not in inspect.signature(AsyncBatchedCollector).parameters:
            return {"skip": "AsyncBatchedCollector takes no envs_per_worker"}
    with tempfile.TemporaryDirectory(prefix="vs-sf-") as tmp:
        try:
            batches, close = SETUPS[case["side"]]({**case, "tmp": tmp})
        except ValueError as err:  # a refusal before any process starts
            return {"skip": str(err).splitlines()[0]}
        try:
            return {"rate": frames_per_second(batches, case["warmup"], case["seconds"])}
        finally:
            close()


# ---- the driver: fresh process groups, interleaved rounds, medians, ratios ----

def run_case(python: str, case: dict, timeout: float) -> dict:
    """Run ``case`` with ``python`` in a process group of its own; kill the group when it ends."""
    env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([python, __file__, "--case", json.dumps(case)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc, grace=0)
        return {"error": f"ran past {timeout:.0f} s"}
    except BaseException:  # Ctrl-C, SIGTERM
        kill_group(proc, grace=0)
        raise
    left = kill_group(proc, grace=5)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit code {proc.returncode}: {(err.strip().splitlines() or [''])[-1][:100]}"}
    return {**json.loads(lines[-1]), "left": left}


def kill_group(proc: subprocess.Popen, grace: float) -> int:
    """SIGKILL every process still in ``proc``'s group after ``grace`` seconds (processes on
    their way out are given that long); return how many there were."""
    deadline = time.monotonic() + grace
    while (left := _group(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    return len(left)


def _group(pgrp: int) -> list[int]:
    """The living processes of process group ``pgrp``."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _pgrp(int(pid)) == pgrp]


def _pgrp(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[2])


def sample_factory_python(venv: Path) -> str:
    """The venv's python, with Sample Factory installed into it first if it is not there (over the
    system's packages, for torch; Sample Factory's pins go into the venv)."""
    python = venv / "bin" / "python"
    probe = f"import importlib.metadata as m; assert m.version('sample-factory') == '{SF_VERSION}'"
    if python.exists() and subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
        return str(python)
    print(f"installing Sample Factory {SF_VERSION} into {venv} (about a minute; log in {venv}/install.log)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
    with open(venv / "install.log", "w") as log:
        subprocess.run([python, "-m", "pip", "install", f"sample-factory=={SF_VERSION}"], stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    return str(python)


FIND_TORCHRL = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torchrl') is None)"


def torchrl_python(path: str | None) -> tuple[str | None, str]:
    """A python that imports torchrl (``path``, else the repository's .venv-torchrl, else this one)."""
    candidates = [path] if path else [str(HERE.parent / ".venv-torchrl" / "bin" / "python"), sys.executable]
    for python in candidates:
        if Path(python).exists() and subprocess.run([python, "-c", FIND_TORCHRL]).returncode == 0:
            return python, ""
    return None, f"TorchRL left out: no torchrl importable by {', '.join(candidates)} (--torchrl-python)"


CASES = [  # (side, kind, envs per process, label)
    ("sf", "sampler", 1, "Sample Factory SyncSamplingAPI, 1 env/proc"),
    ("sf", "sampler", 2, "Sample Factory SyncSamplingAPI, 2 envs/proc in 2 splits"),
    ("ours", "batched", 1, "ours AsyncBatchedCollector"),
    ("ours", "batched", 2, "ours AsyncBatchedCollector envs_per_worker=2"),
    ("ours", "sync", 1, "ours MultiSyncCollector, a policy per worker"),
    ("ours", "async", 1, "ours MultiAsyncCollector, a policy per worker"),
    ("torchrl", "batched", 1, "TorchRL AsyncBatchedCollector"),
    ("torchrl", "batched", 2, "TorchRL AsyncBatchedCollector envs_per_worker=2"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2, help="env processes on each side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured wall time per case")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds after the first batch before measuring")
    parser.add_argument("--envs", default="pixels,cartpole")
    parser.add_argument("--sf-venv", type=Path, default=HERE / ".venv-sf")
    parser.add_argument("--torchrl-python", help="a python that imports torchrl (default: .venv-torchrl's)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.procs < 1 or not set(args.envs.split(",")) <= {"pixels", "cartpole"}:
        parser.error(f"--procs {args.procs} --envs {args.envs}: accepted: --procs >= 1, --envs of pixels,cartpole")
    if args.case:
        print(json.dumps(run(json.loads(args.case))), flush=True)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks reap the case running

    pythons = {"sf": sample_factory_python(args.sf_venv.resolve()), "ours": sys.executable}
    pythons["torchrl"], note = torchrl_python(args.torchrl_python)
    cases = [c for c in CASES if pythons[c[0]]]
    print(f"{args.procs} env processes a side, {args.rounds} interleaved rounds of {args.seconds:.0f} s "
          f"after {args.warmup:.0f} s of warm-up, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start" + (f"\n{note}" if note else ""), flush=True)
    for env in args.envs.split(","):
        report(env, cases, *measure(env, cases, pythons, args), args.procs)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def measure(env: str, cases: list, pythons: dict, args: argparse.Namespace) -> tuple[dict, dict]:
    """Every case once a round, ``args.rounds`` rounds: each case's frames/s by round, and why a
    case stopped (a skip or a failure ends a case's rounds)."""
    rates: dict[tuple, list[float]] = {c: [] for c in cases}
    notes: dict[tuple, str] = {}
    for round_ in range(args.rounds):
        print(f"{env}: round {round_ + 1} of {args.rounds}, load average {os.getloadavg()[0]:.1f}", flush=True)
        for c in [c for c in cases if c not in notes]:
            case = {"side": c[0], "kind": c[1], "envs_per_proc": c[2], "env": env, "procs": args.procs,
                    "seconds": args.seconds, "warmup": args.warmup}
            result = run_case(pythons[c[0]], case, timeout=180 + args.warmup + args.seconds)
            if "rate" not in result:
                notes[c] = result.get("skip") or result["error"]
                continue
            rates[c].append(result["rate"])
            if result["left"]:
                print(f"  {c[3]}: {result['left']} processes left at its end, killed", flush=True)
    return rates, notes


def report(env: str, cases: list, rates: dict, notes: dict, procs: int) -> None:
    """Median frames/s of each case, and the medians of its per-round ratios to Sample Factory's two settings."""
    what = "4x84x84 uint8 no-work env, Nature CNN" if env == "pixels" else "CartPole-v1, 2-layer MLP"
    sf1, sf2 = cases[0], cases[1]
    print(f"\n{what}, {procs} env processes a side; a ratio is the case's f/s over Sample Factory's "
          "in the same round, median over rounds")
    print(f"{'case':<58} {'median f/s':>10} {'/ SF 1 env':>10} {'/ SF 2 splits':>13}  rounds f/s")
    for c in cases:
        if c in notes:
            print(f"{c[3]:<58} {'-':>10}  {notes[c]}")
            continue
        ratios = [_ratio(rates[c], rates[ref]) for ref in (sf1, sf2)]
        cells = [f"{r:.2f}" if r else "-" for r in ratios]
        rounds = " ".join(f"{r:,.0f}" for r in rates[c])
        print(f"{c[3]:<58} {statistics.median(rates[c]):>10,.0f} {cells[0]:>10} {cells[1]:>13}  {rounds}", flush=True)


def _ratio(ours: list[float], theirs: list[float]) -> float | None:
    pairs = [a / b for a, b in zip(ours, theirs)]  # round by round: a case runs from the first round on
    return statistics.median(pairs) if pairs else None


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted: the running case's processes are killed")
