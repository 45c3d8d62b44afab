"""The documentation: every Python block of the guide runs, and the site builds with warnings as errors.

Each ```python block of docs/**/*.md and README.md runs in a fresh Python process (this
checkout first on the path) and must exit 0, unless the line right before its fence is a marker
saying what it needs that a test run does not have:

    <!-- needs: cluster -->   a torchrun/SLURM world or several hosts: only compiled here
    <!-- needs: slurm -->     a SLURM cluster to submit to: only compiled here
    <!-- needs: ray -->       the ray extra: runs where ray is installed (CI), skipped elsewhere

A marker that is not one of these, or that does not sit right before a ```python fence, fails
the test, and so does a Python block fenced as ```py or ```python3 (it would escape the check).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from procs import kill_sessions

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
MARKERS = {
    "cluster": "needs a torchrun/SLURM world or several hosts",
    "slurm": "needs a SLURM cluster",
    "ray": "needs the ray extra",
}
COMPILED_ONLY = {"cluster", "slurm"}
MARKER = re.compile(r"^\s*<!--\s*needs:\s*(?P<name>[^>]*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>```+|~~~+)\s*(?P<lang>[^\s`{]*)")
# blocks that start worker processes (local workers, Ray actors): pytest's "multiprocess" marker
STARTS_WORKERS = re.compile(
    r"(Multi\w*Collector|AsyncBatchedCollector|RPCCollector|RayCollector|Distributed\w*Collector)\(|num_collectors"
)


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    needs: str | None  # the marker's name; None: no marker

    @property
    def id(self) -> str:
        return f"{_name(self.page)}:{self.line}"


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def blocks(page: Path) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a Markdown page, and what is wrong with its markers."""
    lines = page.read_text().splitlines()
    found, errors = [], []
    pending: tuple[int, str] | None = None  # a marker waiting for its fence
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        fence = FENCE.match(line)
        if marker:
            if pending is not None:
                errors.append(f"{_name(page)}:{pending[0]}: marker not right before a ```python fence")
            pending = (i + 1, marker["name"])
            if marker["name"] not in MARKERS:
                errors.append(f"{_name(page)}:{i + 1}: unknown marker 'needs: {marker['name']}'; "
                              f"known: {', '.join(sorted(MARKERS))}")
        elif fence:
            indent, ticks, lang = fence["indent"], fence["ticks"], fence["lang"].lower()
            body = []
            i += 1
            while i < len(lines) and not re.match(rf"^\s*{re.escape(ticks)}\s*$", lines[i]):
                body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
                i += 1
            start = i - len(body)
            needs = pending[1] if pending is not None else None
            if pending is not None and lang != "python":
                errors.append(f"{_name(page)}:{pending[0]}: marker not right before a ```python fence")
            if lang in {"py", "python3", "py3", "pycon"}:
                errors.append(f"{_name(page)}:{start}: fence it as ```python so that it is tested")
            found.append(Block(page, start, lang, "\n".join(body) + "\n", needs))
            pending = None
        elif line.strip() and pending is not None:
            errors.append(f"{_name(page)}:{pending[0]}: marker not right before a ```python fence")
            pending = None
        i += 1
    if pending is not None:
        errors.append(f"{_name(page)}:{pending[0]}: marker not right before a ```python fence")
    return found, errors


def python_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)[0] if b.lang == "python"]


def _param(block: Block) -> pytest.param:
    marks = [pytest.mark.multiprocess] if STARTS_WORKERS.search(block.code) else []
    return pytest.param(block, id=block.id, marks=marks)


RUNNABLE = [_param(b) for b in python_blocks() if b.needs not in COMPILED_ONLY]


def test_markers_are_known_and_placed() -> None:
    errors = [e for page in PAGES for e in blocks(page)[1]]
    assert not errors, "\n".join(errors)


def test_marker_check_catches_mistakes(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- needs: gpu -->\n```python\npass\n```\n\n<!-- needs: slurm -->\ntext\n\n"
                    "```py\npass\n```\n")
    _, errors = blocks(page)
    assert len(errors) == 3, errors
    assert "unknown marker 'needs: gpu'" in errors[0]
    assert "not right before" in errors[1] and "```python" in errors[2]


def test_every_python_block_is_run_or_marked() -> None:
    found = python_blocks()
    assert len(found) >= 10, f"only {len(found)} ```python blocks found in {len(PAGES)} pages"
    assert {b.needs for b in found} <= {None, *MARKERS}


@pytest.mark.parametrize("block", [b for b in python_blocks() if b.needs in COMPILED_ONLY], ids=lambda b: b.id)
def test_cluster_block_compiles(block: Block) -> None:
    compile(block.code, block.id, "exec")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("block", RUNNABLE)
def test_block_runs(block: Block, tmp_path: Path) -> None:
    if block.needs == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.Popen([sys.executable, "-c", block.code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill_sessions([proc])  # the block's workers too, if it hung
    assert proc.returncode == 0, f"{block.id} exited with {proc.returncode}:\n{out}\n{err[-4000:]}"


@pytest.mark.timeout(300)
def test_site_builds_strict() -> None:
    """``mkdocs build --strict``: a broken link, a docstring griffe cannot parse or a page left
    out of the navigation fails the build (and this test)."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):  # not skipped: CI installs them
        assert importlib.util.find_spec(module) is not None, f"{module} is missing: pip install -e '.[docs]'"
    with tempfile.TemporaryDirectory() as site:
        proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site],
                              cwd=ROOT, capture_output=True, text=True, timeout=280,
                              env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (Path(site) / "index.html").exists()
        assert (Path(site) / "reference" / "index.html").exists()
