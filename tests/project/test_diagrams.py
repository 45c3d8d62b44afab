"""The documentation's diagrams: committed SVGs that docs/diagrams.py draws from the package.

The site must render offline (a cluster user's docs build may have no network): every diagram is
an SVG in docs/diagrams/, the script's output exactly, so the layer diagram cannot drift from the
package's layers and imports; and no page or mkdocs.yml loads a script, stylesheet or image from
another host. Fast: no site build, no network.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]
REMOTE = r"""["'(]?\s*(?:https?:)?//"""                     # a URL that names a host


@pytest.fixture(scope="module")
def diagrams() -> ModuleType:
    sys.path.insert(0, str(DOCS))                           # docs/diagrams.py imports docs/diagram_drawing.py
    try:
        spec = importlib.util.spec_from_file_location("diagrams", DOCS / "diagrams.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(DOCS))


def test_committed_diagrams_are_what_the_script_draws(diagrams: ModuleType) -> None:
    drawn = diagrams.render_all()
    committed = {path.name: path.read_text() for path in (DOCS / "diagrams").glob("*.svg")}
    assert sorted(committed) == sorted(drawn), "docs/diagrams/ holds an SVG the script does not draw, or lacks one"
    stale = [name for name in drawn if committed[name] != drawn[name]]
    assert not stale, f"{stale} differ from what the script draws now: run python docs/diagrams.py and commit them"


def test_every_diagram_is_shown_and_every_image_exists() -> None:
    shown = set()
    for page in PAGES:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", page.read_text()):
            path = (page.parent / target).resolve()
            assert path.is_file(), f"{page.relative_to(ROOT)} shows {target}, which does not exist"
            shown.add(path)
    svgs = set((DOCS / "diagrams").glob("*.svg"))
    assert svgs, "docs/diagrams/ holds no SVG"
    assert not svgs - shown, f"no page shows {sorted(p.name for p in svgs - shown)}"


def test_nothing_loads_from_another_host() -> None:
    assert importlib.util.find_spec("yaml") is not None, "PyYAML is missing: pip install -e '.[docs]'"
    import yaml

    class AnyTag(yaml.SafeLoader):
        """mkdocs.yml as data: a ``!!python/...`` tag reads as its text, nothing is imported."""

    AnyTag.add_multi_constructor("", lambda loader, suffix, node: f"!{suffix} {getattr(node, 'value', '')}")
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=AnyTag)
    for key in ("extra_javascript", "extra_css"):
        for entry in config.get(key, []):
            src = entry if isinstance(entry, str) else entry.get("path", "")
            assert not re.match(REMOTE, src), f"mkdocs.yml's {key} loads {src} from another host"
    assert config["theme"].get("font") is False, "mkdocs.yml: without theme.font: false the theme loads Google Fonts"
    assert "mermaid" not in (ROOT / "mkdocs.yml").read_text(), "mkdocs.yml: mermaid diagrams load mermaid.js from a CDN"
    loads = [
        r"^\s*```+\s*mermaid", r"class=[\"']?mermaid",                      # the theme fetches mermaid.js for these
        rf"<(?:script|img|iframe)\b[^>]*\bsrc={REMOTE}", rf"<link\b[^>]*\bhref={REMOTE}",
        rf"@import\s+(?:url\()?{REMOTE}", rf"!\[[^\]]*\]\({REMOTE}",
    ]
    for page in PAGES + sorted((DOCS / "diagrams").glob("*.svg")):
        text = page.read_text()
        for pattern in loads:
            found = re.search(pattern, text, re.MULTILINE | re.IGNORECASE)
            assert not found, f"{page.relative_to(ROOT)} loads from another host: {found.group(0)!r}"
    for svg in (DOCS / "diagrams").glob("*.svg"):
        assert not re.search(rf"\bhref={REMOTE}", svg.read_text()), f"{svg.name} refers to another host"


def _package(tmp_path: Path, modules: dict[str, str]) -> Path:
    """A checkout at ``tmp_path``: two layers, ``upper`` over ``lower``, and the given modules."""
    (tmp_path / "setup.cfg").write_text(
        "[importlinter:contract:layers]\ntype = layers\nlayers =\n    rpc_collectors.upper\n    rpc_collectors.lower\n")
    package = tmp_path / "rpc_collectors"
    files = {
        "__init__.py": '"""Trainer side: :mod:`~rpc_collectors.upper`. Both sides: :mod:`~rpc_collectors.lower`."""\n',
        "upper/__init__.py": "", "lower/__init__.py": "", **modules,
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return tmp_path


def test_layer_diagram_reads_every_import_between_layers(diagrams: ModuleType, tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "upper/a.py": "import rpc_collectors.lower.x\n",
        "upper/b.py": "from ..lower import x\n",                       # relative, from a module
        "upper/sub/__init__.py": "from ...lower.x import f\n",         # relative, from a package
        "upper/c.py": "from rpc_collectors.upper import a\n",           # inside its own layer: no arrow
        "lower/x.py": "def f():\n    pass\n",
    })
    layers = diagrams.read_layers(root)
    assert layers.rows == [["upper"], ["lower"]]
    assert layers.side == {"upper": "Trainer side", "lower": "Both sides"}
    assert layers.imports == {("upper", "lower"): 3}
    assert layers.modules == {"upper": 3, "lower": 1}                  # modules, less the packages' __init__


@pytest.mark.parametrize("modules, message", [
    ({"lower/x.py": "from rpc_collectors.upper import a\n", "upper/a.py": ""}, "not below it"),
    ({"lower/x.py": "from .. import stray\n", "stray/y.py": ""}, "must be a layer"),
    ({"__init__.py": '"""Trainer side: :mod:`~rpc_collectors.upper`."""\n'}, "names no process side"),
    ({"__init__.py": '"""Both sides: :mod:`~rpc_collectors.upper`. Trainer side: :mod:`~rpc_collectors.lower`."""\n'},
     "do not follow the layers"),
])
def test_layer_diagram_refuses_a_package_it_cannot_draw(diagrams: ModuleType, tmp_path: Path,
                                                       modules: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        diagrams.read_layers(_package(tmp_path, modules))
