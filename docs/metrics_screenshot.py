"""The TensorBoard screenshot of docs/observability.md: a demo run's metrics, as TensorBoard shows them.

    python docs/metrics_screenshot.py [--events DIR] [--out docs/images/tensorboard_demo.png]

Without ``--events``, runs ``rpc-collectors demo --async --workers 3 --total-frames 60000`` with
``--metrics tensorboard:DIR --metrics-batches 1`` first (a few minutes). Serves the event files with
``tensorboard`` on 127.0.0.1 (the ``metrics`` extra) and takes the PNG with headless Chromium (the
Debian package ``chromium``; see docs/screenshot.py): TensorBoard's time series of the run's
frames/s, lag, pushes, the trainer's wait and each worker's frames/s and idle time, drawn as SVG
(TensorBoard's ``forceSVG``: headless Chromium has no GPU for its WebGL charts).
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from screenshot import chromium

ROOT = Path(__file__).resolve().parents[1]
TAGS = "frames_per_s|idle_s|lag/mean|last_ack_s|rounds/wait_s"


def run_demo(events: Path) -> None:
    subprocess.run([sys.executable, "-m", "rpc_collectors.apps.cli", "demo", "--async", "--workers", "3",
                    "--total-frames", "60000", "--target-return", "1e9", "--metrics", f"tensorboard:{events}",
                    "--metrics-batches", "1", "--output-dir", str(events.parent / "run")], check=True, cwd=ROOT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(events: Path, port: int) -> subprocess.Popen:
    """TensorBoard on ``events``, once it has loaded their scalars."""
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(events), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as answer:
                if b"collector/frames_per_s" in answer.read():
                    return server
        except OSError:
            pass
        time.sleep(1)
    server.kill()
    raise RuntimeError(f"tensorboard showed no collector scalars of {events} within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=Path, help="a run's TensorBoard event files (default: run the demo)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "tensorboard_demo.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rpc-collectors-tb-") as tmp:
        events = args.events or Path(tmp) / "tb"
        if args.events is None:
            run_demo(events)
        port = free_port()
        server = serve(events, port)
        try:
            query = urllib.request.quote(TAGS, safe="")
            url = f"http://127.0.0.1:{port}/?darkMode=false&forceSVG=true&smoothing=0&tagFilter={query}#timeseries"
            args.out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            "--hide-scrollbars", "--virtual-time-budget=60000", f"--user-data-dir={tmp}/profile",
                            f"--screenshot={args.out}", "--window-size=1600,1500", url],
                           check=True, capture_output=True, timeout=600)
        finally:
            server.kill()
            server.wait()
    print(args.out)


if __name__ == "__main__":
    main()
