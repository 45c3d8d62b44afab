"""TorchRL's own collector tests run against rpc_collectors' classes, beside TorchRL's own.

TorchRL's ``test/test_collectors.py`` (and the ``test/conftest.py`` beside it) come from a
pytorch/rl checkout at the release the environment has (0.14.x for torchrl 0.14.1); they are not
in the torchrl wheel. The test module imports ``Collector``, ``MultiSyncCollector``,
``MultiAsyncCollector``, ``AsyncCollector``, ``MultiCollector``, ``RPCCollector`` and
``split_trajectories`` from TorchRL's modules; for "ours" a conftest rebinds those names to
rpc_collectors' classes before the module is imported, and nothing else changes. Prints, per
test class, how many of the tests that pass with TorchRL's classes pass with ours.

    python -m venv --system-site-packages .venv-torchrl && .venv-torchrl/bin/pip install torchrl==0.14.1
    git -C rl show <0.14 release commit>:test/test_collectors.py > /tmp/trl/test_collectors.py
    git -C rl show <0.14 release commit>:test/conftest.py > /tmp/trl/conftest.py
    PYTHONPATH=$PWD .venv-torchrl/bin/python benchmarks/torchrl_tests.py /tmp/trl

Takes about 30 minutes on 2 cores (TorchRL's classes take most of it); ``--save FILE`` keeps
TorchRL's outcomes, ``--theirs FILE`` reuses them (ours alone: about 12 minutes);
``benchmarks/torchrl_tests_theirs.json`` holds TorchRL 0.14.1's outcomes at commit 373c31a85.

The parity issues' "194-test selection" (about shapes, keys, traj ids, ``split_trajs``, weights and
versions, ``max_frames_per_traj``, ``init_random_frames``, replay buffers, ``start()``) was never
written down; the last line gives the range over every union of up to 7 keywords from that list
whose tests number 194 with 184 passing with TorchRL's classes, as that selection had.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REBIND = '''import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torchrl.collectors as _tc
    import torchrl.collectors._multi_base as _mb
    import torchrl.collectors.distributed.rpc as _rpc
    import torchrl.collectors.utils as _utils
import rpc_collectors as _ours
for _name in ("Collector", "MultiSyncCollector", "MultiAsyncCollector", "AsyncCollector", "split_trajectories"):
    setattr(_tc, _name, getattr(_ours, _name))
_mb.MultiCollector = _ours.MultiCollector
_rpc.RPCCollector = _ours.RPCCollector
_utils.split_trajectories = _ours.split_trajectories
'''


def run(source: str, ours: bool, timeout: int) -> dict[str, str]:
    """Each test's outcome ("pass", "fail" or "skip") with TorchRL's classes or ours."""
    folder = tempfile.mkdtemp(prefix="torchrl_tests_")
    try:
        shutil.copy(os.path.join(source, "test_collectors.py"), folder)
        conftest = open(os.path.join(source, "conftest.py")).read().replace("from __future__ import annotations", "")
        with open(os.path.join(folder, "conftest.py"), "w") as f:
            f.write((REBIND if ours else "") + conftest)
        report = os.path.join(folder, "report.xml")
        subprocess.run([sys.executable, "-m", "pytest", "test_collectors.py", "-q", "-p", "no:cacheprovider",
                        f"--timeout={timeout}", f"--junitxml={report}"], cwd=folder, check=False)
        outcomes = {}
        for case in ET.parse(report).iter("testcase"):
            tags = {child.tag for child in case}
            name = f"{case.get('classname').split('.')[-1]}::{case.get('name')}"
            outcomes[name] = "fail" if tags & {"failure", "error"} else "skip" if "skipped" in tags else "pass"
        return outcomes
    finally:
        shutil.rmtree(folder, ignore_errors=True)


KEYWORDS = ("shape", "keys", "traj", "split", "weight", "version", "max_frames", "maxframes", "init_random", "rb",
            "replay", "start", "batch_size", "output", "consistency", "update", "buffer", "reset", "frames_per_batch",
            "policy", "seed", "next", "reloading", "truncated", "multi", "sync", "async", "collector")


def selections(theirs: dict[str, str], ours: dict[str, str], size: int = 194, passing: int = 184) -> list[int]:
    """How many tests pass with ours in each keyword selection of ``size`` tests of which ``passing``
    pass with TorchRL's classes (test names as bits of an int, one mask per keyword)."""
    names = list(theirs)
    masks = {k: sum(1 << i for i, n in enumerate(names) if k in n.lower()) for k in KEYWORDS}
    theirs_mask = sum(1 << i for i, n in enumerate(names) if theirs[n] == "pass")
    ours_mask = sum(1 << i for i, n in enumerate(names) if theirs[n] == "pass" and ours.get(n) == "pass")
    found = []
    for r in range(1, 8):
        for combo in itertools.combinations(KEYWORDS, r):
            mask = 0
            for k in combo:
                mask |= masks[k]
            if mask.bit_count() == size and (mask & theirs_mask).bit_count() == passing:
                found.append((mask & ours_mask).bit_count())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="folder with TorchRL's test_collectors.py and conftest.py")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test")
    parser.add_argument("--save", help="write TorchRL's outcomes to this JSON file")
    parser.add_argument("--theirs", help="TorchRL's outcomes from an earlier --save, instead of running them")
    args = parser.parse_args()
    if args.theirs:
        with open(args.theirs) as f:
            theirs = json.load(f)
    else:
        theirs = run(args.source, False, args.timeout)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(theirs, f)
    ours = run(args.source, True, args.timeout)
    passing = [name for name, outcome in theirs.items() if outcome == "pass"]
    by_class = collections.defaultdict(lambda: [0, 0])
    for name in passing:
        counts = by_class[name.split("::")[0]]
        counts[0] += 1
        counts[1] += ours.get(name) == "pass"
    for name, (total, passed) in sorted(by_class.items(), key=lambda item: -item[1][0]):
        print(f"{name:36s} {passed:4d} / {total}")
    print(f"{'all':36s} {sum(ours.get(n) == 'pass' for n in passing):4d} / {len(passing)} "
          f"(of {len(theirs)} tests; TorchRL's classes pass {len(passing)})")
    scores = selections(theirs, ours)
    if scores:
        print(f"the 194-test selection: {min(scores)}-{max(scores)} / 184 over its {len(scores)} keyword reconstructions")
    for name in passing:
        if ours.get(name) != "pass":
            print(f"  not with ours: {name}")


if __name__ == "__main__":
    main()
