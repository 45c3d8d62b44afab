"""The package's public paths, and its shape: modules a reader can take in at once; the tests' tree
mirrors it."""
from __future__ import annotations

import importlib
import io
import pkgutil
import tokenize
from pathlib import Path

import rpc_collectors

PACKAGE = Path(rpc_collectors.__file__).parent
MAX_LINES = 400
# a module ends at least this far below the cap: split along a seam before it is packed to it
ROOM = 10
# at most this share of the package's comments trail code; the others stand above what they explain
MOST_TRAILING = 0.4
TESTS = Path(__file__).resolve().parents[1]
NOT_PACKAGES = {"project": "the repository as a whole", "scripts": "the programs tests run as subprocesses"}


def test_public_names_and_module_paths_stay_where_users_import_them():
    from rpc_collectors import distributed, slurm

    for name in rpc_collectors.__all__:
        assert getattr(rpc_collectors, name) is not None, name
    assert distributed.DistributedCollector is rpc_collectors.DistributedCollector
    assert distributed.RPCCollector is rpc_collectors.RPCCollector
    assert distributed.RayCollector is rpc_collectors.RayCollector
    for name in ("submit", "SlurmConfig", "result", "run_script", "sbatch_script", "setup_distributed_env"):
        assert callable(getattr(slurm, name)), name


def test_every_public_class_shows_its_options_to_help_and_editors():
    """``inspect.signature`` (``help()``, editors, notebooks) of each public class shows every option of
    its ``__init__``, also where a metaclass chooses the class (``MultiCollector(sync=...)``); ``Collector``
    adds its dispatch's keywords."""
    import inspect

    for name in rpc_collectors.__all__:
        cls = getattr(rpc_collectors, name)
        if not inspect.isclass(cls) or not getattr(cls.__init__, "__module__", "").startswith("rpc_collectors"):
            continue
        shown = inspect.signature(cls).parameters
        options = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert all(shown.get(p.name) == p for p in options), name


def test_collector_dispatch_is_wired_when_the_package_is_imported():
    """``Collector(..., num_collectors=N)`` builds a multi-worker class without starting it when
    the arguments are wrong: the dispatch reaches the class the backend names."""
    import pytest

    with pytest.raises(ValueError, match="backend='nope' is not supported by Collector"):
        rpc_collectors.Collector("CartPole-v1", None, num_collectors=2, backend="nope", frames_per_batch=8)


def test_every_module_stays_10_lines_below_400_and_every_package_says_what_it_holds():
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().count("\n")
        most = MAX_LINES - ROOM
        assert lines < most, f"{path.relative_to(PACKAGE)} has {lines} lines; fewer than {most} ({MAX_LINES} - {ROOM})"
        if path.name == "__init__.py":
            assert path.read_text().lstrip().startswith('"""'), f"{path.relative_to(PACKAGE)} has no docstring"


def test_comments_stand_on_their_own_lines_not_trailing_code():
    trailing = comments = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.COMMENT:
                comments += 1
                trailing += bool(token.line[:token.start[1]].strip())
    assert comments and trailing <= MOST_TRAILING * comments, f"{trailing} of {comments} comments trail code"


def test_every_package_names_each_of_its_modules():
    """A reader finds every module from its package's docstring (``:mod:`.name```)."""
    for package in [rpc_collectors, *(importlib.import_module(p.name) for p in pkgutil.walk_packages(
            rpc_collectors.__path__, "rpc_collectors.") if p.ispkg)]:
        names = [m.name for m in pkgutil.iter_modules(package.__path__)]
        doc = package.__doc__ or ""
        unnamed = [n for n in names if f":mod:`.{n}`" not in doc and f"rpc_collectors.{n}" not in doc]
        assert not unnamed, f"{package.__name__}'s docstring does not name {unnamed}"


def test_no_two_modules_share_a_name_and_package_names_differ_by_more_than_two_letters():
    """A module's name alone says where it is, and no two packages read alike."""
    modules = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    by_name: dict[str, list[str]] = {}
    for path in modules:
        by_name.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    assert not {n: p for n, p in by_name.items() if len(p) > 1}
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    for i, a in enumerate(packages):
        for b in packages[i + 1:]:
            assert _edit_distance(a, b) > 2, (a, b)


def test_every_test_folder_names_a_package_and_every_test_module_is_in_one():
    """tests/<package>/ tests rpc_collectors/<package>/ (tests/project and tests/scripts excepted): a
    folder whose package is gone or renamed fails here, no test module lies outside the mirror, and no
    two share a name (pytest imports each by its name alone)."""
    folders = [p for p in TESTS.rglob("*") if p.is_dir() and not p.name.startswith(("_", "."))]
    for folder in folders:
        relative = folder.relative_to(TESTS)
        if relative.parts[0] not in NOT_PACKAGES:
            assert (PACKAGE / relative / "__init__.py").exists(), f"tests/{relative} names no package rpc_collectors/{relative}"
    outside = [p.name for p in [*TESTS.glob("test_*.py"), *(TESTS / "scripts").rglob("test_*.py")]]
    assert not outside, f"test modules outside the folders that mirror the package: {outside}"
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def _edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


# TorchRL 0.14's collector hierarchy (torchrl/collectors, torchrl/collectors/distributed): each class's base
TORCHRL_BASES = {
    "Collector": "BaseCollector", "MultiCollector": "BaseCollector", "MultiSyncCollector": "MultiCollector",
    "MultiAsyncCollector": "MultiCollector", "AsyncCollector": "MultiAsyncCollector",
    "AsyncBatchedCollector": "BaseCollector", "RPCCollector": "BaseCollector", "RayCollector": "BaseCollector",
    "DistributedCollector": "BaseCollector", "DistributedSyncCollector": "BaseCollector",
}
MAX_CHAIN = 3


def _torchrl_ancestors(name: str) -> list[str]:
    """The collector classes above ``name`` in TorchRL, ``BaseCollector`` last."""
    base = TORCHRL_BASES[name]
    return [base] if base == "BaseCollector" else [base, *_torchrl_ancestors(base)]


def test_inheritance_chains_are_at_most_three_classes_where_torchrl_allows():
    """A public collector's behaviour is read in at most 3 of this package's classes (its own, the
    front, ``BaseCollector``); only where TorchRL puts more collector classes above it
    (``AsyncCollector`` < ``MultiAsyncCollector`` < ``MultiCollector``) does its chain hold those too,
    and one class of its own at most (the front). Every relation of TorchRL's holds, and no other."""
    from rpc_collectors.collectors.ray import RayCollector

    classes = {name: getattr(rpc_collectors, name, RayCollector) for name in TORCHRL_BASES}
    classes["BaseCollector"] = rpc_collectors.BaseCollector
    assert classes["RayCollector"] is RayCollector
    for name in TORCHRL_BASES:
        chain = [c.__name__ for c in classes[name].__mro__ if c.__module__.startswith("rpc_collectors.")]
        ancestors = _torchrl_ancestors(name)
        own = [c for c in chain[1:] if c not in ancestors]
        assert len(own) <= 1 and len(chain) <= max(MAX_CHAIN, 1 + len(ancestors) + len(own)), f"{name}: {chain}"
        related = {other for other, cls in classes.items() if other != name and issubclass(classes[name], cls)}
        assert related == set(ancestors), f"{name}: {chain}"
