"""Screenshots of the built documentation site: its home page and one API page.

    python docs/screenshot.py [--out /tmp/shots] [--size 1280,900] [--page reference/index.html ...]

Builds the site (``mkdocs build --strict``) into a temporary folder, serves it on 127.0.0.1
from a thread with Python's ``http.server``, and takes one PNG per page with headless Chromium
(the Debian package ``chromium``: ``apt-get install -y chromium``). Nothing is fetched from
the network: the theme loads no web fonts (``theme.font: false`` in mkdocs.yml) and Chromium
runs with a fresh profile and its background networking off. Prints the PNGs' paths.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["index.html", "reference/collectors/index.html"]
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def build(site: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
                   cwd=ROOT, check=True, env=env)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` on a free port of 127.0.0.1 from a daemon thread; the server and its URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def chromium() -> str:
    for name in CHROMIUM:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: apt-get install -y chromium")


def screenshot(browser: str, url: str, png: Path, size: str = "1280,900") -> None:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", "--virtual-time-budget=5000", f"--user-data-dir={profile}",
            f"--screenshot={png}", f"--window-size={size}", url,
        ]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    if not png.exists() or png.stat().st_size == 0:
        raise RuntimeError(f"Chromium wrote no screenshot of {url}")


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/shots"), help="folder for the PNGs")
    parser.add_argument("--size", default="1280,900", help="window width,height in pixels (default 1280,900)")
    parser.add_argument("--page", action="append", help="a page of the site, e.g. guide/quickstart/index.html "
                        f"(default: {' and '.join(PAGES)})")
    args = parser.parse_args(argv)
    if any("#" in page for page in args.page or []):
        parser.error("--page takes a page, not an anchor: headless Chromium captures a scrolled page blank")
    args.out.mkdir(parents=True, exist_ok=True)
    browser = chromium()
    shots = []
    with tempfile.TemporaryDirectory(prefix="rpc-collectors-site-") as tmp:
        site = Path(tmp) / "site"
        build(site)
        server, base = serve(site)
        try:
            for page in args.page or PAGES:
                name = re.sub(r"[^\w.]+", "-", page.replace("index.html", "")).strip("-") or "home"
                png = args.out / f"{name}.png"
                screenshot(browser, base + page, png, args.size)
                shots.append(png)
                print(png)
        finally:
            server.shutdown()
            server.server_close()
    return shots


if __name__ == "__main__":
    main()
