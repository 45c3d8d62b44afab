"""``slurm/devcluster.py`` (a script, not a package) loaded as the module ``devcluster``."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PATH = Path(__file__).resolve().parents[1] / "slurm" / "devcluster.py"


def load() -> ModuleType:
    """The module, loaded once per process."""
    if "devcluster" not in sys.modules:
        spec = importlib.util.spec_from_file_location("devcluster", PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["devcluster"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["devcluster"]
