"""``metrics=``: where a collector writes its :class:`~rpc_collectors.core.metrics.Metrics`, and how
often.

Every collector takes ``metrics=``: None (the default) or True keeps them for
``collector.metrics()`` and writes them nowhere; False turns them off; a target, a list of targets
or an :class:`Export` (targets and an interval) writes them there every ``seconds`` (default 10) or
every ``batches``, at the end of a batch, with the frames handed out as the step. Targets:

* :class:`TensorBoard` (a log dir: event files, ``pip install 'rpc_collectors[metrics]'``),
* :class:`Prometheus` (a port: an HTTP endpoint to scrape, same extra),
* :class:`PrometheusTextfile` (a folder: a file for node_exporter's textfile collector, same extra),
* :class:`JsonLines` (a file: one JSON object per export),
* any object with TorchRL's logger method ``log_scalar(name, value, step=...)`` (TorchRL's loggers),
* or the strings ``"tensorboard:DIR"``, ``"prometheus:PORT"``, ``"jsonl:PATH"``.

Each target is checked when the collector is built (its package, its directory, its port),
before any worker starts, opened at the first batch and closed with the collector; a later collector
opens it again. A target that fails later is warned about once per failure (until it works again)
and collection goes on. An ``Evaluator``'s ``metrics=`` takes the same targets, given each result's
numbers (each target's ``write_scalars``, which its ``write`` goes through).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
import warnings
from typing import Any, Callable

from rpc_collectors.core import checks
from rpc_collectors.core.metrics import Metrics
from rpc_collectors.single_process.prometheus_exposition import Endpoint, Gauges, serve

EXTRA = "pip install 'rpc_collectors[metrics]'"
DEFAULT_SECONDS = 10.0
AGAIN = (
    "collection goes on, and this export is tried again at each interval, "
    "without another warning until it works"
)
STRINGS = ("tensorboard:DIR", "prometheus:PORT", "jsonl:PATH")
ACCEPTED = ("None, True, False, a target (TensorBoard, Prometheus, PrometheusTextfile, JsonLines, "
            "an object with log_scalar, or one of the strings "
            f"{', '.join(STRINGS)}), a list of targets, or an Export")


def _needs(module: str, target: str) -> None:
    """Import ``module`` now, or say which extra installs it."""
    try:
        __import__(module)
    except ImportError as err:
        raise ImportError(f"metrics={target} needs the "
                          f"{module.split('.')[0]} package: {EXTRA}") from err


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
        self.write_scalars(_named("collector/", metrics), step)

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        """Each of ``values`` a scalar of that name at ``step``."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter
            self._writer = SummaryWriter(self.log_dir)
        for name, value in values.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer, writer = None, self._writer
            writer.close()


class Prometheus:
    """An HTTP endpoint at ``address:port`` that Prometheus scrapes: each number a gauge named
    ``rpc_collectors_<group>_<name>``, a worker's ``rpc_collectors_worker_<name>{worker="<id>"}``.
    It listens on loopback unless ``address`` says otherwise, serves at most ``connections``
    connections at once (one more is closed at once) and closes a connection that sends or takes
    nothing for ``timeout`` seconds."""

    def __init__(self, port: int, address: str = "127.0.0.1", *, connections: int = 16,
                 timeout: float = 10.0) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"Prometheus(port={port!r}) is invalid; "
                             "accepted: an int from 1 to 65535")
        self.port, self.address = port, address
        self.connections = checks.positive_int("Prometheus(connections)", connections)
        self.timeout = checks.timeout("Prometheus(timeout)", timeout)
        self.gauges = Gauges()
        self._server: Endpoint | None = None

    def __repr__(self) -> str:
        return f"Prometheus({self.port!r}, address={self.address!r})"

    def probe(self) -> None:
        """Bind the port as the endpoint will (``SO_REUSEADDR``: a just-closed
        endpoint's port is free), and let it go."""
        _needs("prometheus_client", repr(self))
        try:
            Endpoint(self.address, self.port, self.connections, self.timeout).server_close()
        except OSError as err:
            raise ValueError(f"metrics={self!r} cannot listen there "
                             f"({err}); accepted: a free port") from None

    def write(self, metrics: Metrics, step: int) -> None:
        self.write_scalars(metrics.scalars(), step)

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        """Serve ``values`` as the gauges (the latest write's alone)."""
        self.gauges.latest = dict(values)
        if self._server is None:
            self._server = serve(self.address, self.port, self.gauges.registry(), self.connections,
                                 self.timeout)

    def close(self) -> None:
        if self._server is not None:
            self._server, server = None, self._server
            server.close()


class PrometheusTextfile:
    """A file for node_exporter's textfile collector (``--collector.textfile.directory=directory``):
    ``<directory>/rpc_collectors_<name>.prom``, the endpoint's gauges, each labelled
    ``trainer="<name>"``, replaced whole at each export (prometheus_client's ``write_to_textfile``:
    a temporary file renamed over it) and removed at close. ``name`` defaults to
    ``<SLURM_JOB_ID>-<pid>`` (``<pid>`` outside a SLURM job), so that trainers sharing a node write
    files of their own; a process with several collectors gives each its own."""

    def __init__(self, directory: str | os.PathLike, name: str | None = None) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        name = name if name is not None else f"{job}-{os.getpid()}" if job else str(os.getpid())
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
            raise ValueError(f"PrometheusTextfile(name={name!r}) is invalid; accepted: "
                             "letters, digits, '_', '.' and '-'")
        self.directory, self.name = os.fspath(directory), name
        self.path = os.path.join(self.directory, f"rpc_collectors_{name}.prom")
        self.gauges = Gauges(trainer=name)

    def __repr__(self) -> str:
        return f"PrometheusTextfile({self.directory!r}, name={self.name!r})"

    def probe(self) -> None:
        _needs("prometheus_client", repr(self))
        _writable_dir(self.directory, repr(self))

    def write(self, metrics: Metrics, step: int) -> None:
        self.write_scalars(metrics.scalars(), step)

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        """Replace the file with ``values``' gauges."""
        from prometheus_client import write_to_textfile
        self.gauges.latest = dict(values)
        write_to_textfile(self.path, self.gauges.registry())

    def close(self) -> None:
        """Remove the file: node_exporter would go on exporting a finished run's last values."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)


class JsonLines:
    """A file with one JSON object per export: ``{"step", "time", "metrics"}`` (the groups as
    objects), or ``{"step", "time", "scalars"}`` for :meth:`write_scalars`, each line appended
    whole or not at all (what a failing write, on a full disk, wrote of it is cut off again)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._file: Any = None

    def __repr__(self) -> str:
        return f"JsonLines({self.path!r})"

    def probe(self) -> None:
        # made, as TensorBoard makes its log_dir
        _writable_dir(os.path.dirname(os.path.abspath(self.path)), repr(self))
        checks.writable_file(f"metrics={self!r}: path", self.path)

    def write(self, metrics: Metrics, step: int) -> None:
        self._append({"step": step, "time": time.time(), "metrics": dataclasses.asdict(metrics)})

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        """A line ``{"step", "time", "scalars": values}``."""
        self._append({"step": step, "time": time.time(), "scalars": dict(values)})

    def _append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115  (closed by close())
        line = json.dumps(record) + "\n"
        end = self._file.seek(0, os.SEEK_END)
        try:
            view = memoryview(line.encode())
            while view:
                view = view[self._file.write(view):]
        except BaseException:
            # whole lines or nothing
            self._file.truncate(end)
            raise

    def close(self) -> None:
        if self._file is not None:
            self._file, file = None, self._file
            file.close()


class Logger:
    """A logger with TorchRL's ``log_scalar(name, value, step=...)``, given
    scalars named ``collector/<name>``."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger

    def __repr__(self) -> str:
        return f"{type(self.logger).__name__}()"

    def probe(self) -> None:
        """Nothing to check: the logger exists."""

    def write(self, metrics: Metrics, step: int) -> None:
        self.write_scalars(_named("collector/", metrics), step)

    def write_scalars(self, values: dict[str, float], step: int) -> None:
        """``log_scalar(name, value, step=step)`` for each of ``values``."""
        for name, value in values.items():
            self.logger.log_scalar(name, value, step=step)

    def close(self) -> None:
        """The logger stays the user's to close."""


def _named(prefix: str, metrics: Metrics) -> dict[str, float]:
    return {f"{prefix}{name}": value for name, value in metrics.scalars().items()}


def _writable_dir(path: str, target: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise ValueError(f"metrics={target} cannot be written ({err}); "
                         "accepted: a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"metrics={target} cannot be written ({path} is not "
                         "writable); accepted: a writable directory")


def target(value: Any) -> Any:
    """The export target ``value`` names (a target, a logger, or one of :data:`STRINGS`)."""
    if isinstance(value, (TensorBoard, Prometheus, PrometheusTextfile, JsonLines, Logger)):
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
    """Write a collector's metrics to ``targets`` every ``seconds`` (default 10)
    or every ``batches``."""

    def __init__(self, *targets: Any, seconds: float | None = None,
                 batches: int | None = None) -> None:
        if seconds is not None and batches is not None:
            raise ValueError(f"Export(seconds={seconds!r}, batches={batches!r}): give one "
                             "interval; accepted: seconds=... or batches=...")
        if not targets:
            raise ValueError(f"Export() has no target; accepted: {ACCEPTED}")
        self.targets = [target(t) for t in targets]
        self.batches = None if batches is None else checks.positive_int("Export(batches)", batches)
        self.seconds = None if batches is not None else checks.timeout(
            "Export(seconds)", DEFAULT_SECONDS if seconds is None else seconds)
        # when the next export is due (seconds: time.monotonic())
        self._next = 0.0
        # the targets (their index; -1: collector.metrics()) failing since last warned
        self._failing: set[int] = set()

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
        """Write ``collector.metrics()`` to every target; a failure is warned about once, until that
        target works again, and collection goes on."""
        try:
            metrics = collector.metrics()
        except Exception as err:
            # e.g. a worker that died meanwhile: its recovery is the next batch's business
            self._failed(-1, "collector.metrics()", err)
            return
        self._failing.discard(-1)
        self._each(lambda each: each.write(metrics, collector.frames), AGAIN)

    def write_scalars(self, values: dict[str, float], step: int, then: str = AGAIN) -> None:
        """Write ``values`` at ``step`` to every target; a failure is warned about once, until that
        target works again (``then`` says what happens meanwhile)."""
        self._each(lambda each: each.write_scalars(values, step), then)

    def _each(self, write: Callable[[Any], None], then: str) -> None:
        for i, each in enumerate(self.targets):
            try:
                write(each)
            except Exception as err:
                self._failed(i, repr(each), err, then)
            else:
                self._failing.discard(i)

    def _failed(self, key: int, what: str, err: Exception, then: str = AGAIN) -> None:
        if key not in self._failing:
            self._failing.add(key)
            warnings.warn(f"metrics: {what} failed ({type(err).__name__}: {err}); {then}",
                          RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        """Close every target (a target failing since its last write is not warned about again); the
        next collector given this export starts afresh."""
        for i, each in enumerate(self.targets):
            try:
                each.close()
            except Exception as err:
                self._failed(i, f"closing {each!r}", err, "it is not tried again")
        self._failing.clear()
        self._next = 0.0


def check(value: Any) -> tuple[bool, Export | None]:
    """``metrics=``: whether metrics are kept, and where they are written
    (checked, before any worker starts)."""
    if value is None or value is True:
        return True, None
    if value is False:
        return False, None
    export = (value if isinstance(value, Export)
              else Export(*(value if isinstance(value, (list, tuple)) else [value])))
    export.probe()
    return True, export
