"""The package's public paths, and its shape: modules a reader can take in at once."""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import rpc_collectors

PACKAGE = Path(rpc_collectors.__file__).parent
MAX_LINES = 400


def test_public_names_and_module_paths_stay_where_users_import_them():
    from rpc_collectors import distributed, slurm

    for name in rpc_collectors.__all__:
        assert getattr(rpc_collectors, name) is not None, name
    assert distributed.DistributedCollector is rpc_collectors.DistributedCollector
    assert distributed.RPCCollector is rpc_collectors.RPCCollector
    assert distributed.RayCollector is rpc_collectors.RayCollector
    for name in ("submit", "SlurmConfig", "result", "run_script", "sbatch_script", "setup_distributed_env"):
        assert callable(getattr(slurm, name)), name


def test_collector_dispatch_is_wired_when_the_package_is_imported():
    """``Collector(..., num_collectors=N)`` builds a multi-worker class without starting it when
    the arguments are wrong: the dispatch reaches the class the backend names."""
    import pytest

    with pytest.raises(ValueError, match="backend='nope' is not supported by Collector"):
        rpc_collectors.Collector("CartPole-v1", None, num_collectors=2, backend="nope", frames_per_batch=8)


def test_every_module_is_at_most_400_lines_and_every_package_says_what_it_holds():
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().count("\n")
        assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines; at most {MAX_LINES}"
        if path.name == "__init__.py":
            assert path.read_text().lstrip().startswith('"""'), f"{path.relative_to(PACKAGE)} has no docstring"


def test_every_package_names_each_of_its_modules():
    """A reader finds every module from its package's docstring (``:mod:`.name```)."""
    for package in [rpc_collectors, *(importlib.import_module(p.name) for p in pkgutil.walk_packages(
            rpc_collectors.__path__, "rpc_collectors.") if p.ispkg)]:
        names = [m.name for m in pkgutil.iter_modules(package.__path__)]
        doc = package.__doc__ or ""
        unnamed = [n for n in names if f":mod:`.{n}`" not in doc and f"rpc_collectors.{n}" not in doc]
        assert not unnamed, f"{package.__name__}'s docstring does not name {unnamed}"
