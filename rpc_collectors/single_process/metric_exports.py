"""``metrics=``: where a collector writes its :class:`~rpc_collectors.core.metrics.Metrics`, and how often.

Every collector takes ``metrics=``: None (the default) or True keeps them for ``collector.metrics()``
and writes them nowhere; False turns them off; a target, a list of targets or an :class:`Export`
(targets and an interval) writes them there every ``seconds`` (default 10) or every ``batches``,
at the end of a batch, with the frames handed out as the step. Targets:

* :class:`TensorBoard` (a log dir: event files, ``pip install 'rpc_collectors[metrics]'``),
* :class:`Prometheus` (a port: an HTTP endpoint to scrape, same extra),
* :class:`JsonLines` (a file: one JSON object per export),
* any object with TorchRL's logger method ``log_scalar(name, value, step=...)`` (TorchRL's loggers),
* or the strings ``"tensorboard:DIR"``, ``"prometheus:PORT"``, ``"jsonl:PATH"``.

Each target is checked when the collector is built (its package, its directory, its port),
before any worker starts, and opened at the first batch. A target that fails later is warned
about once and collection goes on.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import warnings
from typing import Any

from rpc_collectors.core import checks
from rpc_collectors.core.metrics import Metrics

EXTRA = "pip install 'rpc_collectors[metrics]'"
DEFAULT_SECONDS = 10.0
STRINGS = ("tensorboard:DIR", "prometheus:PORT", "jsonl:PATH")
ACCEPTED = ("None, True, False, a target (TensorBoard, Prometheus, JsonLines, an object with log_scalar, "
            f"or one of the strings {', '.join(STRINGS)}), a list of targets, or an Export")


def _needs(module: str, target: str) -> None:
    """Import ``module`` now, or say which extra installs it."""
    try:
        __import__(module)
    except ImportError as err:
        raise ImportError(f"metrics={target} needs the {module.split('.')[0]} package: {EXTRA}") from err


class TensorBoard:
    """TensorBoard event files in ``log_dir`` (created), scalars named ``collector/<name>``."""

    def __init__(self, log_dir: str | os.PathLike) -> None:
        self.log_dir = os.fspath(log_dir)
        self._writer: Any = None

    def __repr__(self) -> str:
        return f"TensorBoard({self.log_dir!r})"

    def probe(self) -> None:
        _needs("tensorboard", repr(self))
        _writable_dir(self.log_dir, repr(self))

    def write(self, metrics: Metrics, step: int) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter
            self._writer = SummaryWriter(self.log_dir)
        for name, value in metrics.scalars().items():
            self._writer.add_scalar(f"collector/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class Prometheus:
    """An HTTP endpoint at ``address:port`` that Prometheus scrapes: each number a gauge named
    ``rpc_collectors_<group>_<name>``, a worker's ``rpc_collectors_worker_<name>{worker="<id>"}``."""

    def __init__(self, port: int, address: str = "127.0.0.1") -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"Prometheus(port={port!r}) is invalid; accepted: an int from 1 to 65535")
        self.port, self.address = port, address
        self.latest: Metrics | None = None
        self._server: Any = None

    def __repr__(self) -> str:
        return f"Prometheus({self.port!r}, address={self.address!r})"

    def probe(self) -> None:
        _needs("prometheus_client", repr(self))
        with socket.socket(socket.AF_INET6 if ":" in self.address else socket.AF_INET) as probe:
            try:
                probe.bind((self.address, self.port))
            except OSError as err:
                raise ValueError(f"metrics={self!r} cannot listen there ({err}); accepted: a free port") from None

    def write(self, metrics: Metrics, step: int) -> None:
        self.latest = metrics
        if self._server is None:
            from prometheus_client import CollectorRegistry, start_http_server
            registry = CollectorRegistry(auto_describe=False)
            registry.register(self)
            self._server, _ = start_http_server(self.port, self.address, registry)

    def collect(self) -> Any:
        """The gauges of the latest metrics (prometheus_client's collector interface)."""
        from prometheus_client.core import GaugeMetricFamily
        families: dict[str, GaugeMetricFamily] = {}
        for name, value in (self.latest.scalars() if self.latest is not None else {}).items():
            parts = name.split("/")
            worker = parts[0] == "workers"
            family = "rpc_collectors_" + ("worker_" + parts[2] if worker else "_".join(parts))
            gauge = families.setdefault(family, GaugeMetricFamily(family, family, labels=["worker"] if worker else []))
            gauge.add_metric([parts[1]] if worker else [], value)
        return iter(families.values())

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class JsonLines:
    """A file with one JSON object per export: ``{"step", "time", "metrics"}`` (the groups as objects)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._file: Any = None

    def __repr__(self) -> str:
        return f"JsonLines({self.path!r})"

    def probe(self) -> None:
        _writable_dir(os.path.dirname(os.path.abspath(self.path)), repr(self))  # made, as TensorBoard makes its log_dir
        checks.writable_file(f"metrics={self!r}: path", self.path)

    def write(self, metrics: Metrics, step: int) -> None:
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
        line = {"step": step, "time": time.time(), "metrics": dataclasses.asdict(metrics)}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Logger:
    """A logger with TorchRL's ``log_scalar(name, value, step=...)``, given scalars named ``collector/<name>``."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def __repr__(self) -> str:
        return f"{type(self.logger).__name__}()"

    def probe(self) -> None:
        """Nothing to check: the logger exists."""

    def write(self, metrics: Metrics, step: int) -> None:
        for name, value in metrics.scalars().items():
            self.logger.log_scalar(f"collector/{name}", value, step=step)

    def close(self) -> None:
        """The logger stays the user's to close."""


def _writable_dir(path: str, target: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ValueError(f"metrics={target} cannot be written ({err}); accepted: a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"metrics={target} cannot be written ({path} is not writable); accepted: a writable directory")


def target(value: Any) -> Any:
    """The export target ``value`` names (a target, a logger, or one of :data:`STRINGS`)."""
    if isinstance(value, (TensorBoard, Prometheus, JsonLines, Logger)):
        return value
    if callable(getattr(value, "log_scalar", None)):
        return Logger(value)
    if isinstance(value, str) and ":" in value:
        kind, _, where = value.partition(":")
        if kind == "tensorboard" and where:
            return TensorBoard(where)
        if kind == "jsonl" and where:
            return JsonLines(where)
        if kind == "prometheus" and where.isdigit():
            return Prometheus(int(where))
    raise ValueError(f"metrics={value!r} is invalid; accepted: {ACCEPTED}")


class Export:
    """Write a collector's metrics to ``targets`` every ``seconds`` (default 10) or every ``batches``."""

    def __init__(self, *targets: Any, seconds: float | None = None, batches: int | None = None) -> None:
        if seconds is not None and batches is not None:
            raise ValueError(f"Export(seconds={seconds!r}, batches={batches!r}): give one interval; accepted: "
                             "seconds=... or batches=...")
        if not targets:
            raise ValueError(f"Export() has no target; accepted: {ACCEPTED}")
        self.targets = [target(t) for t in targets]
        self.batches = None if batches is None else checks.positive_int("Export(batches)", batches)
        self.seconds = None if batches is not None else checks.timeout(
            "Export(seconds)", DEFAULT_SECONDS if seconds is None else seconds)
        self._next = 0.0  # when the next export is due (seconds: time.monotonic())
        self._failed: set[int] = set()

    def __repr__(self) -> str:
        every = f"batches={self.batches}" if self.batches is not None else f"seconds={self.seconds}"
        return f"Export({', '.join(map(repr, self.targets))}, {every})"

    def probe(self) -> None:
        """Check every target (its package, its directory, its port), before any worker starts."""
        for each in self.targets:
            each.probe()

    def due(self, rounds: int) -> bool:
        """Whether an export is due at the end of batch ``rounds`` (the first batch's always is)."""
        if self.batches is not None:
            return rounds == 1 or rounds % self.batches == 0
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.seconds
        return True

    def write(self, collector: Any) -> None:
        """Write ``collector.metrics()`` to every target; a failure is warned about once, and collection goes on."""
        try:
            metrics = collector.metrics()
        except Exception as err:  # e.g. a worker that died meanwhile: its recovery is the next batch's business
            self._warn(-1, "collector.metrics()", err)
            return
        for i, each in enumerate(self.targets):
            try:
                each.write(metrics, collector.frames)
            except Exception as err:
                self._warn(i, repr(each), err)

    def _warn(self, key: int, what: str, err: Exception) -> None:
        if key not in self._failed:
            self._failed.add(key)
            warnings.warn(f"metrics: {what} failed ({type(err).__name__}: {err}); collection goes on, and this "
                          "export is tried again at each interval without another warning", RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        for each in self.targets:
            try:
                each.close()
            except Exception as err:
                self._warn(id(each), f"closing {each!r}", err)


def check(value: Any) -> tuple[bool, Export | None]:
    """``metrics=``: whether metrics are kept, and where they are written (checked, before any worker starts)."""
    if value is None or value is True:
        return True, None
    if value is False:
        return False, None
    export = value if isinstance(value, Export) else Export(*(value if isinstance(value, (list, tuple)) else [value]))
    export.probe()
    return True, export
