"""The documentation: every Python block of the guide runs, and the site builds with warnings as errors.

Each ```python block of docs/**/*.md and README.md runs as ``python -c`` would run it (this
checkout first on the path), in a process of its own and a session of its own, and must exit 0,
unless the line right before its fence is a marker saying what it needs that a test run does not have:

    <!-- needs: cluster -->   a torchrun/SLURM world or several hosts: only compiled here
    <!-- needs: slurm -->     a SLURM cluster to submit to: only compiled here
    <!-- needs: ray -->       the ray extra: runs where ray is installed (CI), skipped elsewhere

A marker that is not one of these, or that does not sit right before a ```python fence, fails
the test, and so does a Python block fenced as ```py or ```python3 (it would escape the check).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import select
import signal
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


# Forks a process per block from one that imported what the blocks share (torch alone takes seconds
# of CPU to import). Each child starts a session of its own, writes to its own files, runs its block
# as ``__main__`` (no ``__file__``: multiprocessing's spawn does not re-run it, as with ``python -c``)
# and exits through Python's normal exit; the zygote reports the child's pid, then its exit code,
# after killing whatever of the block's session outlived it.
ZYGOTE = r"""
import json, os, sys, types
import gymnasium, tensordict, torch, rpc_collectors
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        break
    print(pid, flush=True)
    status = os.waitpid(pid, 0)[1]
    try:
        os.killpg(pid, 9)
    except ProcessLookupError:
        pass
    print(os.waitstatus_to_exitcode(status), flush=True)
else:
    sys.exit(0)
os.setsid()
os.chdir(request["cwd"])
for fd, name in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
    os.dup2(os.open(name, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
main = types.ModuleType("__main__")
sys.modules["__main__"], sys.argv = main, ["-c"]
exec(compile(request.pop("code"), "<string>", "exec"), main.__dict__)
"""


def _reply(runner: subprocess.Popen, timeout: float) -> int | None:
    """The runner's next line as an int, or None if none came within ``timeout`` seconds."""
    if not select.select([runner.stdout], [], [], timeout)[0]:
        return None
    line = runner.stdout.readline()
    assert line, f"the block runner exited with {runner.wait(timeout=30)}"
    return int(line)


@pytest.fixture(scope="module")
def block_runner(tmp_path_factory):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    log = tmp_path_factory.mktemp("runner") / "stderr"
    with log.open("w") as stderr:
        runner = subprocess.Popen([sys.executable, "-c", ZYGOTE], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
    try:
        yield runner
        runner.stdin.close()
        assert runner.wait(timeout=60) == 0, log.read_text()
    finally:
        kill_sessions([runner])


@pytest.mark.timeout(240)
@pytest.mark.xdist_group("ray")  # one worker forks them all from its warmed runner; the ray blocks start a Ray
@pytest.mark.parametrize("block", RUNNABLE)
def test_block_runs(block: Block, tmp_path: Path, block_runner: subprocess.Popen) -> None:
    if block.needs == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install -e '.[ray]')")
    (tmp_path / "cwd").mkdir()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    request = {"code": block.code, "cwd": str(tmp_path / "cwd"), "stdout": str(out), "stderr": str(err)}
    block_runner.stdin.write(json.dumps(request) + "\n")
    block_runner.stdin.flush()
    pid = _reply(block_runner, 90)  # the first block also waits for the runner's imports
    assert pid is not None, f"{block.id}: the block runner did not start it"
    returncode = None
    try:
        returncode = _reply(block_runner, 110)
    finally:
        if returncode is None:  # it hung (or the test timed out): end its session, the block's workers too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            returncode = _reply(block_runner, 30)  # the runner reaps it: the next block's replies stay in step
    assert returncode == 0, f"{block.id} exited with {returncode}:\n{out.read_text()}\n{err.read_text()[-4000:]}"


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
