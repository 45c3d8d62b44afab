"""The documentation's diagrams, drawn as plain SVG into docs/diagrams/.

    python docs/diagrams.py            # (re)write every SVG
    python docs/diagrams.py --check    # exit 1, naming each SVG that differs from what this draws

The layer diagram is read from the package: the layers of setup.cfg's import-linter contract,
the imports found between the layers' packages (every ``import`` of ``rpc_collectors/``), and the
process side of each layer from ``rpc_collectors/__init__.py``'s docstring. The flows (one batch's
path, one failure's path, where a stream is cut) are data: ``FLOWS`` below. Nothing is fetched: the
pages render offline, and ``tests/project/test_diagrams.py`` holds the committed SVGs to this script.
"""
from __future__ import annotations

import argparse
import ast
import configparser
import re
import sys
from pathlib import Path

from diagram_drawing import Call, Chains, Flow, Layers, Loop, Reply, Sequence, draw_chains, draw_flow, draw_layers, draw_sequence

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "diagrams"
PACKAGE = "rpc_collectors"

# ---------------------------------------------------------------------------------------------
# The flows: edit here, then run `python docs/diagrams.py`.
# ---------------------------------------------------------------------------------------------

BATCH_PATH = Sequence(
    participants={
        "U": "trainer loop",
        "F": "trainer/schedule.py, roster.py",
        "P": "transport/data.py, layouts.py",
        "D": "transport/doorbell.py",
        "S": "worker/server.py, single.py",
        "R": "single_process/collector.py, rollout.py",
        "E": "single_process/envs.py",
    },
    steps=[
        Call("U", "F", "next(iter(collector)) via single_process/base_collector.py, trainer/collector_front.py"),
        Call("F", "F", "the worker's record: served? weights due? version v (trainer/roster.py)"),
        Call("F", "P", "slot_for(worker): a free slot s of the round buffer"),
        Call("F", "D", 'ring(worker, v, s): "slot s" down the request pipe'),
        Call("D", "S", "WorkerState.collect(v, s)"),
        Call("S", "S", "weights pushed since, or version v not held? apply them (transport/weight_sync.py)"),
        Call("S", "R", "collector.next(), rollout writes into slot s"),
        Loop("frames_per_batch / N steps", [Call("R", "E", "GymEnv.step_arrays(action)")]),
        Reply("S", "D", '"ready in slot s" up the answer pipe'),
        Reply("D", "F", "the request's future completes; trainer/waits.py wakes the front"),
        Call("F", "P", "round(): slot s as the [N, T] batch (a copy only if the user holds the slot's last one)"),
        Call("F", "F", "label worker ids, lay out cat_results (transport/layouts.py)"),
        Reply("F", "U", "the batch, after postproc (single_process/base_collector.py)"),
    ],
)

FAILURE_PATH = Flow(
    rows=[
        {"K": "worker process killed (SIGKILL)"},
        {"SP": "worker/spawner.py reports the exit status",
         "CH": "worker/channel.py and transport/doorbell.py: the pipes close"},
        {"LP": "pools/local.py: LocalPool._on_exit fails the worker's calls with the reason"},
        {"FD": "front: _on_death, trainer/roster.py records the death, trainer/waits.py wakes the wait"},
        {"W": "trainer/waits.py raises Failure(worker, reason) out of the wait"},
        {"R": "trainer/recovery.py: Recovery.recover, outside any wait"},
        {"RS": "WorkerRestartWarning; pool.replace starts a fresh process; set_up: ids, seed, weights, slots",
         "WE": "shutdown, then one WorkerError (core/errors.py)"},
        {"RD": "front asks the replacement for the batch its predecessor left, into the same slot"},
    ],
    edges=[
        ("K", "SP"), ("K", "CH"), ("SP", "LP"), ("CH", "LP"), ("LP", "FD"), ("FD", "W"), ("W", "R"),
        ("R", "RS", "restarts left"), ("R", "WE", "no restarts left"), ("RS", "RD"),
    ],
)

STREAM_CUTS = Chains([
    ("a batch dropped (max_policy_lag; a node's stale local batch)", [
        "batch k: id 7, t 3-9\nhanded out",
        "batch k+1: id 7, t 10-16\ndropped",
        "batch k+2: id 11, t 17-23\nsame env, not reset: a new id",
    ]),
    ("a worker replaced (max_worker_restarts; a node's local worker)", [
        "batch k: id 7, t 3-9\nhanded out",
        "the worker dies:\nits batch in\nprogress is lost",
        "replacement: a new env\nfrom a reset, ids above\nany its slot used",
    ]),
    ("an env restarted inside a batch (AsyncBatchedCollector)", [
        "steps before the cut, not handed out yet:\nthe last one truncated and done",
        "the restarted env:\nfrom a reset",
    ]),
    ("a resume (RunCheckpoint, load_state_dict)", [
        "batch k: the last before the checkpoint\n(later ones of a killed job are lost)",
        "every env from a reset,\nids in the new start's own range",
    ]),
])

FLOWS = {
    "batch_path.svg": (BATCH_PATH, draw_sequence, "One batch's path from env.step to the trainer loop"),
    "failure_path.svg": (FAILURE_PATH, draw_flow, "One failure's path: a local worker killed mid-batch"),
    "stream_cuts.svg": (STREAM_CUTS, draw_chains, "Where a worker's stream of steps is cut"),
}

# ---------------------------------------------------------------------------------------------
# The layers, read from the package.
# ---------------------------------------------------------------------------------------------

SIDES = ("Public API", "Trainer side", "Worker side", "Both sides")


def contract_rows(setup_cfg: Path) -> list[list[str]]:
    """The layers of setup.cfg's import-linter ``layers`` contract, top to bottom."""
    config = configparser.ConfigParser()
    config.read(setup_cfg)
    contracts = [s for s in config.sections() if config[s].get("type") == "layers"]
    if len(contracts) != 1:
        raise ValueError(f"{setup_cfg} has {len(contracts)} import-linter layers contracts; the diagram draws exactly one")
    rows = []
    for line in config[contracts[0]]["layers"].split("\n"):
        if line.strip():
            rows.append([name.strip().removeprefix(PACKAGE + ".") for name in re.split(r"[|:]", line)])
    return rows


def process_sides(package: Path) -> dict[str, str]:
    """Each layer's process side, from the ``Public API: ... Both sides: ...`` of the package docstring."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    parts = re.split(r"\b(" + "|".join(SIDES) + r"):", doc)
    sides = {}
    for label, text in zip(parts[1::2], parts[2::2]):
        for layer in re.findall(r":mod:`~?" + PACKAGE + r"\.(\w+)`", text):
            sides.setdefault(layer, label)
    return sides


def found_imports(package: Path) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """``(a, b) -> how many modules of layer a import from layer b``, and each layer's module count."""
    importers: dict[tuple[str, str], set[Path]] = {}
    modules: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if len(parts) < 3:
            continue                                        # the package's own public module paths
        layer = parts[1]
        modules[layer] = modules.get(layer, 0) + (parts[-1] != "__init__")
        here = list(parts[:-1])                             # the package a relative import starts from
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                module = base + ([node.module] if node.module else [])
                targets = [".".join(module + [alias.name]) for alias in node.names]
            else:
                continue
            for target in targets:
                names = target.split(".")
                if names[0] == PACKAGE and len(names) > 1 and names[1] != layer:
                    importers.setdefault((layer, names[1]), set()).add(path)
    return {edge: len(paths) for edge, paths in sorted(importers.items())}, modules


def read_layers(root: Path = ROOT) -> Layers:
    """The layers of the checkout at ``root``, their sides and the imports between them.

    A ``ValueError`` where these disagree: a layer with no side, sides out of the layers' order, an
    import that goes up or sideways, or into a package that is not a layer.
    """
    rows = contract_rows(root / "setup.cfg")
    names = [name for row in rows for name in row]
    sides = process_sides(root / PACKAGE)
    imports, modules = found_imports(root / PACKAGE)
    level = {name: i for i, row in enumerate(rows) for name in row}
    unsided = [name for name in names if name not in sides]
    if unsided:
        raise ValueError(f"{PACKAGE}/__init__.py's docstring names no process side ({', '.join(SIDES)}) for {unsided}")
    order = [SIDES.index(sides[name]) for name in names]
    if order != sorted(order):
        raise ValueError(f"the process sides {[sides[n] for n in names]} do not follow the layers {names} top to bottom")
    for a, b in imports:
        if a not in level or b not in level:
            raise ValueError(f"{PACKAGE}.{a} imports from {PACKAGE}.{b}: each must be a layer of setup.cfg's contract")
        if level[b] <= level[a]:
            raise ValueError(f"{PACKAGE}.{a} imports from {PACKAGE}.{b}, which is not below it (lint-imports says where)")
    return Layers(rows, {name: sides[name] for name in names}, modules, imports)


# ---------------------------------------------------------------------------------------------


def render_all() -> dict[str, str]:
    """Every diagram's SVG text, by file name under docs/diagrams/."""
    svgs = {"layers.svg": draw_layers(read_layers(), SIDES, "The layers of rpc_collectors and the imports between them")}
    for name, (data, draw, title) in FLOWS.items():
        svgs[name] = draw(data, title)
    return svgs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed SVG differs")
    args = parser.parse_args(argv)
    stale = []
    for name, svg in render_all().items():
        path = OUT / name
        if path.exists() and path.read_text() == svg:
            continue
        stale.append(name)
        if not args.check:
            OUT.mkdir(exist_ok=True)
            path.write_text(svg)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python docs/diagrams.py", file=sys.stderr)
        return 1
    for name in stale:
        print(OUT / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
