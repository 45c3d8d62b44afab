"""RayCollector throughput, side by side in one run: ours against the single-process ``Collector``,
our ``MultiCollector`` and TorchRL 0.14.1's ``RayCollector`` (run from its own venv when
``--torchrl-python`` names one), on the no-work env with 4x84x84 and 3x256x256 uint8
observations and on CartPole, 2 actors, sync and async.

TorchRL's cases run first, in a subprocess of its venv with a local Ray of its own (Ray's
workers run the Python of the driver that started it); then ours, on a fresh local Ray.
Goals: ours >= 3x TorchRL's frames/s on 4x84x84; ours >= 0.8x MultiCollector on one node.
Also time to first batch (constructor + first batch) and shutdown.

    python benchmarks/ray_collector.py [--seconds 3] [--envs 4x84x84,3x256x256,cartpole] [--object-store]
        [--torchrl-python /tmp/venv-torchrl/bin/python]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS = {"4x84x84": ((4, 84, 84), "uint8", 1000), "3x256x256": ((3, 256, 256), "uint8", 200), "cartpole": (None, None, 1000)}
WORKERS = 2
OBJECT_STORE = "RayCollector (store)"  # shared_memory=False: batches and weights through Ray's object store


def env_fn(name: str, torchrl: bool = False):
    """A factory of the env ``name``, wrapped for our collectors or (``torchrl``) for TorchRL's."""
    from _common import NoWorkEnv

    shape, dtype, _ = ENVS[name]
    if torchrl:
        from torchrl.envs import GymEnv as TorchRLGymEnv
        from torchrl.envs import GymWrapper

        if shape is None:
            return functools.partial(TorchRLGymEnv, "CartPole-v1")
        return lambda: GymWrapper(NoWorkEnv(shape, dtype))
    from rpc_collectors import GymEnv

    if shape is None:
        return functools.partial(GymEnv, "CartPole-v1")
    return lambda: GymEnv(NoWorkEnv(shape, dtype))


def measure(make, seconds: float) -> dict:
    """Frames/s of the collector ``make()`` builds, after its first batch; time to first batch; shutdown."""
    start = time.perf_counter()
    collector = make()
    it = iter(collector)
    next(it)
    first = time.perf_counter() - start
    frames, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        frames += next(it).numel()
    rate = frames / (time.perf_counter() - start)
    start = time.perf_counter()
    collector.shutdown()
    return {"fps": rate, "first_batch_s": first, "shutdown_s": time.perf_counter() - start}


def ours(env: str, kind: str, sync: bool, seconds: float) -> dict:
    from rpc_collectors import Collector, MultiCollector, RayCollector

    fn, fpb = env_fn(env), ENVS[env][2]
    if kind == "Collector":
        return measure(lambda: Collector(fn, None, frames_per_batch=fpb // WORKERS if sync else fpb), seconds)
    if kind == "MultiCollector":
        return measure(lambda: MultiCollector([fn] * WORKERS, None, frames_per_batch=fpb, sync=sync), seconds)
    store = kind == OBJECT_STORE  # the path of actors on other nodes
    return measure(lambda: RayCollector([fn] * WORKERS, None, frames_per_batch=fpb, sync=sync,
                                        shared_memory=not store), seconds)


def torchrl_cases(cases: list, seconds: float) -> list:
    """TorchRL's RayCollector on each case, on a local Ray of its own (run in TorchRL's venv)."""
    import ray
    from torchrl.collectors.distributed import RayCollector

    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp,
             log_to_driver=False)
    results = []
    for env, sync in cases:
        results.append(measure(lambda env=env, sync=sync: RayCollector(
            [env_fn(env, torchrl=True)] * WORKERS, None, frames_per_batch=ENVS[env][2], total_frames=10**9,
            sync=sync, remote_configs={"num_cpus": 1, "memory": 2 * 1024**3},
        ), seconds))
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
    return results


def run_torchrl(python: str, cases: list, seconds: float) -> list | None:
    """:func:`torchrl_cases` in a subprocess of TorchRL's venv; None if it failed."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([python, __file__, "--seconds", str(seconds), "--torchrl-cases", json.dumps(cases)],
                         capture_output=True, text=True, timeout=500, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    if not lines:
        print(f"TorchRL's RayCollector failed: {out.stderr[-1500:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--torchrl-python", default="/tmp/venv-torchrl/bin/python")
    parser.add_argument("--envs", default=",".join(ENVS))
    parser.add_argument("--object-store", action="store_true",
                        help="also RayCollector with shared_memory=False (the object-store path of other nodes)")
    parser.add_argument("--torchrl-cases", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torchrl_cases:
        print(json.dumps(torchrl_cases(json.loads(args.torchrl_cases), args.seconds)))
        return
    cases = [(env, sync) for env in args.envs.split(",") for sync in (True, False)]
    theirs = run_torchrl(args.torchrl_python, cases, args.seconds) if os.path.exists(args.torchrl_python) else None
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])  # actors import _common
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp,
             log_to_driver=False)
    print(f"{WORKERS} actors/workers, {args.seconds} s per case; frames/s, time to first batch, shutdown (s)")
    for n, (env, sync) in enumerate(cases):
        mode = "sync" if sync else "async"
        kinds = ["Collector", "MultiCollector", "RayCollector"] + ([OBJECT_STORE] if args.object_store else [])
        res = {k: ours(env, k, sync, args.seconds) for k in kinds}
        if theirs is not None:
            res["TorchRL RayCollector"] = theirs[n]
        for name, r in res.items():
            print(f"{env:10s} {mode:5s} {name:21s} {r['fps']:10.0f} fps  first {r['first_batch_s']:6.2f}  "
                  f"shutdown {r['shutdown_s']:5.2f}")
        ray_fps = res["RayCollector"]["fps"]
        ratios = [f"vs Collector {ray_fps / res['Collector']['fps']:.2f}x",
                  f"vs MultiCollector {ray_fps / res['MultiCollector']['fps']:.2f}x"]
        if theirs is not None:
            ratios.append(f"vs TorchRL RayCollector {ray_fps / res['TorchRL RayCollector']['fps']:.2f}x")
        print(f"{env:10s} {mode:5s} RayCollector " + ", ".join(ratios), flush=True)
        if args.object_store and theirs is not None:
            store_fps = res[OBJECT_STORE]["fps"]
            print(f"{env:10s} {mode:5s} {OBJECT_STORE} vs TorchRL RayCollector "
                  f"{store_fps / res['TorchRL RayCollector']['fps']:.2f}x", flush=True)
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
