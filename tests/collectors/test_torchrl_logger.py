"""``metrics=`` given a TorchRL logger, the real torchrl 0.14.1's ``CSVLogger``: the collector's scalars land
in its CSV files, read back here. Runs where ``torchrl`` is installed (``.ci/run`` makes a venv with it);
elsewhere skipped, unless ``RPC_COLLECTORS_REQUIRE_TORCHRL=1`` says it must run."""
from __future__ import annotations

import os
import warnings

import pytest

if os.environ.get("RPC_COLLECTORS_REQUIRE_TORCHRL"):
    import torchrl  # noqa: F401  (must be importable: CI runs this module for real)
else:
    pytest.importorskip("torchrl")

with warnings.catch_warnings():  # torchrl 0.14.1 deprecates some of its own classes as it imports them
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl.record.loggers import CSVLogger

from conftest import CountEnv  # noqa: E402
from rpc_collectors import Collector, Export, MultiSyncCollector  # noqa: E402


def read_scalar(logger: CSVLogger, name: str) -> list[tuple[int, float]]:
    """The ``(step, value)`` rows of scalar ``name`` in the logger's CSV file."""
    logger.experiment.files[os.path.join(logger.experiment.log_dir, "scalars", f"{name}.csv")].flush()
    with open(os.path.join(logger.experiment.log_dir, "scalars", f"{name}.csv")) as f:
        return [(int(step), float(value)) for step, value in (line.strip().split(",") for line in f if line.strip())]


def test_a_torchrl_logger_gets_the_metrics_of_a_single_process_collector(tmp_path):
    logger = CSVLogger("run", log_dir=str(tmp_path))
    with Collector(CountEnv, None, frames_per_batch=10, total_frames=50, metrics=Export(logger, batches=2)) as c:
        list(c)
    assert read_scalar(logger, "collector/frames") == [(10, 10.0), (20, 20.0), (40, 40.0)]
    assert read_scalar(logger, "collector/workers/0/frames") == [(10, 10.0), (20, 20.0), (40, 40.0)]


@pytest.mark.multiprocess
@pytest.mark.usefixtures("no_leftover_processes")
def test_a_torchrl_logger_gets_every_workers_metrics(tmp_path):
    logger = CSVLogger("run", log_dir=str(tmp_path))
    with MultiSyncCollector([CountEnv] * 2, None, frames_per_batch=20, total_frames=40, metrics=logger) as c:
        list(c)  # every 10 s by default: the first batch's
    assert read_scalar(logger, "collector/rounds/rounds") == [(20, 1.0)]
    assert read_scalar(logger, "collector/workers/1/frames") == [(20, 10.0)]
