"""Where the tests' code lies: the shared helpers here in tests/, the test modules in folders that
mirror the package's (tests/collectors tests rpc_collectors/collectors, ...; tests/project the
repository as a whole), and the programs that tests run as subprocesses in tests/scripts.

Test modules and scripts import one another by module name (``from test_rpc_collector import
BiasPolicy``): tests/conftest.py puts every folder on pytest's ``sys.path``, and a subprocess that
imports them is given ``PYTHONPATH`` (the checkout first, then every folder).
"""
from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"
FOLDERS = [TESTS, *sorted(path for path in TESTS.iterdir() if path.is_dir() and not path.name.startswith(("_", ".")))]
PYTHONPATH = os.pathsep.join(str(path) for path in [REPO, *FOLDERS])
