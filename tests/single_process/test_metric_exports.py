"""The ``metrics=`` targets on a shared node: a port free again as soon as its endpoint closed, targets
that a later collector reuses, an endpoint that idle connections cannot swell, failures warned about
once and no torn JSON line on a full disk, and node_exporter's textfile."""
from __future__ import annotations

import errno
import json
import os
import selectors
import socket
import threading
import time
import urllib.request
import warnings

from prometheus_client.parser import text_string_to_metric_families

from rpc_collectors import PrometheusTextfile
from rpc_collectors.single_process import metric_exports
from rpc_collectors.single_process.metric_exports import Export, JsonLines, Prometheus
from test_metrics import collector, free_port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        return answer.read().decode()


def samples(text: str) -> dict[str, float]:
    return {s.name + str(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_port_is_free_again_as_soon_as_its_scraped_endpoint_closed():
    port = free_port()
    for _ in range(2):  # the scrape leaves the server's side of its connection in TIME_WAIT
        with collector(metrics=Export(Prometheus(port), batches=1)) as c:
            list(c)
            assert samples(scrape(port))["rpc_collectors_frames[]"] == 50


def test_targets_given_to_a_later_collector_write_again(tmp_path):
    path, port = tmp_path / "m.jsonl", free_port()
    export = Export(JsonLines(path), Prometheus(port), seconds=3600)  # the first batch of each run only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with collector(metrics=export) as c:
            list(c)  # not scraped: a scraped endpoint's port is the test above's
        with collector(metrics=export) as c:
            list(c)
            assert samples(scrape(port))["rpc_collectors_frames[]"] == 10
    assert [w.message for w in caught] == []
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 10]


def test_idle_connections_are_bounded_and_closed_after_the_timeout():
    port, cap = free_port(), 4
    idle: list[socket.socket] = []
    try:
        with collector(metrics=Export(Prometheus(port, connections=cap, timeout=0.5), batches=1)) as c:
            list(c)
            threads = threading.active_count()  # the endpoint's own thread included
            with selectors.DefaultSelector() as waiting:
                for _ in range(50):
                    idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
                    waiting.register(idle[-1], selectors.EVENT_READ)
                deadline = time.monotonic() + 60
                while waiting.get_map() and time.monotonic() < deadline:
                    assert threading.active_count() <= threads + cap
                    for key, _ in waiting.select(timeout=1):
                        try:
                            assert key.fileobj.recv(1) == b""  # closed by the endpoint: at the cap, or silent too long
                        except ConnectionResetError:
                            pass
                        waiting.unregister(key.fileobj)
                assert not waiting.get_map(), f"{len(waiting.get_map())} idle connections still open"
            assert samples(scrape(port))["rpc_collectors_frames[]"] == 50
    finally:
        for each in idle:
            each.close()


class FillingDisk:
    """A file on a disk with ``room`` bytes left: a write beyond it writes what fits, then raises ENOSPC
    (as a buffered write does); closing it while full raises too (as the flush at close does)."""

    def __init__(self, file) -> None:
        self.file, self.room = file, 1 << 30

    def write(self, data):
        fits = data[:self.room]
        self.file.write(fits)
        self.room -= len(fits)
        if len(fits) < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(data)

    def close(self) -> None:
        self.file.close()
        if self.room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.file, name)


def filling_disk(monkeypatch) -> list[FillingDisk]:
    """The files ``JsonLines`` opens from now on, each on a :class:`FillingDisk`."""
    disks: list[FillingDisk] = []

    def on_disk(*args, **kwargs):
        disks.append(FillingDisk(open(*args, **kwargs)))  # noqa: SIM115  (the target closes it)
        return disks[-1]

    monkeypatch.setattr(metric_exports, "open", on_disk, raising=False)
    return disks


def test_a_full_disk_leaves_whole_lines_and_each_failure_is_warned_about_once(tmp_path, monkeypatch):
    path, disks = tmp_path / "m.jsonl", filling_disk(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with collector(metrics=Export(JsonLines(path), batches=1)) as c:
            for i, _ in enumerate(c):
                disks[0].room = 20 if i in (0, 2) else 1 << 30  # batches 2 and 4 meet a full disk, then it has room
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10, 30, 50]
    said = [str(w.message) for w in caught]
    assert len(said) == 2 and all("failed (OSError: [Errno 28]" in s for s in said), said


def test_a_target_failing_at_write_and_at_close_is_warned_about_once(tmp_path, monkeypatch):
    path, disks = tmp_path / "m.jsonl", filling_disk(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with collector(metrics=Export(JsonLines(path), batches=1)) as c:
            for i, _ in enumerate(c):
                if i == 0:
                    disks[0].room = 20  # full from the second batch on, and at close
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "tried again at each interval" in said[0], said
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [10]


def test_textfile_holds_the_endpoints_metrics_for_node_exporter(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    folder, port = tmp_path / "textfile", free_port()
    textfile = PrometheusTextfile(folder)
    with collector(metrics=Export(textfile, Prometheus(port), batches=1)) as c:
        list(c)
        files = os.listdir(folder)  # the temporary file is renamed: no other is left
        text, endpoint = (folder / files[0]).read_text(), scrape(port)
    assert files == [f"rpc_collectors_4242-{os.getpid()}.prom"]
    families = {f.name for f in text_string_to_metric_families(text)}
    assert families == {f.name for f in text_string_to_metric_families(endpoint)} and "rpc_collectors_frames" in families
    trainer = ("trainer", f"4242-{os.getpid()}")
    assert samples(text)[f"rpc_collectors_frames[{trainer}]"] == 50
    assert samples(text)[f"rpc_collectors_worker_frames[{trainer}, ('worker', '0')]"] == 50
    assert os.listdir(folder) == []  # removed at close: node_exporter exports no finished run
