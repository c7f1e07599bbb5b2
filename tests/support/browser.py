"""A real browser for the dashboard's tests, and a ``zkbeat dashboard`` process to point it at.

The browser is Debian's chromium (``/usr/bin/chromium``), headless, driven by
playwright's Python package over its own protocol. playwright never downloads
a browser here (no ``playwright install``): it is launched on the system's.
A missing chromium or playwright is a hard error naming the install command,
never a skip.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.helpers import wait_for
from tests.support.processes import ROOT, LoggedProcess
from tests.support.servers import free_port, require_binary

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_HINT = "apt-get install -y chromium"
PLAYWRIGHT_HINT = "pip install -e '.[test]' (playwright's Python package; never `playwright install`)"
#: Headless, offline, no first-run or background traffic: nothing leaves the machine.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def browser_page(viewport: dict[str, int] | None = None) -> Iterator[Any]:
    """A fresh page in a fresh chromium profile (its own user-data-dir), closed afterwards."""
    require_binary(CHROMIUM, CHROMIUM_HINT, what="chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise RuntimeError(f"playwright is not installed: run `{PLAYWRIGHT_HINT}` or `make test`") from None
    with tempfile.TemporaryDirectory(prefix="zkbeat-chromium-") as profile, sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=viewport or {"width": 1600, "height": 1000},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            yield page
        finally:
            context.close()


def http(url: str, data: dict | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, decoded JSON body) of a GET, or of a JSON POST when ``data`` is given."""
    body = json.dumps(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback only
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


class Dashboard(LoggedProcess):
    """``zkbeat -A tests.support.beatapp dashboard`` on a free port, under a cluster's environment."""

    def __init__(self, env: dict[str, str], log_dir: Path, secret: str | None = None, args: tuple = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / "dashboard.log"
        self.secret = secret
        command = [sys.executable, "-m", "zkbeat.ops.cli", "-A", "tests.support.beatapp", "dashboard",
                   "--port", str(self.port), *args]  # fmt: skip
        environ = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        environ.pop("ZKBEAT_DASHBOARD_SECRET", None)
        if secret is not None:
            environ["ZKBEAT_DASHBOARD_SECRET"] = secret
        self.spawn(command, cwd=ROOT, env=environ)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def state(self) -> dict[str, Any]:
        status, data = http(f"{self.url}/api/state")
        assert status == 200, data
        return data

    def wait_ready(self, timeout: float = 30) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            assert self.alive, f"the dashboard exited:\n{self.log()}"
            try:
                data = self.state()
            except OSError:
                return None
            return data if data["seq"] and data["shards"][0]["leader"] else None

        return wait_for(ready, timeout=timeout, message=self.log)

    def post(self, action: str, data: dict, secret: str | None = None, **headers: str) -> tuple[int, Any]:
        extra = dict(headers)
        if secret is not None:
            extra["X-Zkbeat-Secret"] = secret
        return http(f"{self.url}/api/{action}", data, extra)

    def stop(self) -> None:
        if self.alive:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait(10)
