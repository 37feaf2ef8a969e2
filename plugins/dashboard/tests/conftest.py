"""Fixtures of the dashboard's tests.

* ``plugin_env``: the environment of a child interpreter that imports this
  checkout and finds the plugin through its entry points (when the
  distribution is not installed, a ``dist-info`` naming them is written to a
  temporary directory on its ``PYTHONPATH``: the real entry-point loader finds it).
* ``job``: a live job (``dashboard_job.py``: 2 hosts x 4 procs) started with
  ``MONARCH_DASHBOARD=1``; its printed URL, its commands.
* ``browser``: a real Chromium (Debian's ``chromium``) driven by Playwright;
  skips, saying why, where either is missing.
* ``screenshots``: where page screenshots go (``DASHBOARD_SCREENSHOT_DIR``,
  else the test's temporary directory).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent
REPO = PLUGIN.parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
URL = re.compile(r"monarch dashboard: (http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]+))")
ENTRY_POINTS = """[monarch]
dashboard = monarch_dashboard.plugin

[monarch.cli]
dashboard = monarch_dashboard._cli:register
"""


def pytest_report_header() -> str:
    import monarch_core
    import monarch_dashboard

    return (f"monarch code under test: {Path(monarch_core.__file__).parents[1]}, "
            f"dashboard: {Path(monarch_dashboard.__file__).parent}")


def _installed() -> bool:
    try:
        metadata.distribution("monarch-dashboard")
        return True
    except metadata.PackageNotFoundError:
        return False


def write_entry_points(directory: Path) -> Path:
    """A ``dist-info`` of monarch-dashboard with its entry points, in ``directory``."""
    info = directory / "monarch_dashboard-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: monarch-dashboard\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return directory


@pytest.fixture(scope="session")
def entry_point_dir(tmp_path_factory: pytest.TempPathFactory) -> Optional[Path]:
    """Where the plugin's entry points are found (None: it is installed)."""
    return None if _installed() else write_entry_points(tmp_path_factory.mktemp("entry-points"))


@pytest.fixture(scope="session")
def plugin_env(entry_point_dir: Optional[Path]) -> dict[str, str]:
    paths = [str(REPO), str(PLUGIN)] + ([str(entry_point_dir)] if entry_point_dir else [])
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class Job:
    """``dashboard_job.py`` in a child process (see its docstring)."""

    def __init__(self, directory: Path, env: dict[str, str]) -> None:
        (directory / "monarch.toml").write_text('[hosts.two]\nscheduler = "local"\nhosts = 2\n')
        env = {**env, "MONARCH_DASHBOARD": "1", "MONARCH_TELEMETRY_INTERVAL": "0.25", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(HERE / "dashboard_job.py")], cwd=directory, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._cond = threading.Condition()
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, lines), daemon=True).start()
        self.url, self.port, self.token = self._wait_url()
        self.wait_line(self.out, "ready", 120)

    def _read(self, stream: Any, lines: list[str]) -> None:
        for line in stream:
            with self._cond:
                lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, lines: list[str], pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        with self._cond:
            start = 0
            while True:
                for i in range(start, len(lines)):
                    m = rx.search(lines[i])
                    if m:
                        del lines[: i + 1]
                        return m
                start = len(lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"the job printed no line matching {pattern!r} within {timeout} s "
                                         f"(rc {self.proc.poll()}); stderr:\n" + "\n".join(self.err[-40:]))
                self._cond.wait(min(left, 0.5))

    def _wait_url(self) -> tuple[str, int, str]:
        m = self.wait_line(self.err, URL.pattern, 120)
        return m.group(1), int(m.group(2)), m.group(3)

    def do(self, command: str, timeout: float = 60) -> None:
        """Run ``command`` in the job and wait until it is done."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.wait_line(self.out, rf"^done {command.split()[0]}$", timeout)

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            self.proc.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def job(tmp_path: Path, plugin_env: dict[str, str]) -> Iterator[Job]:
    j = Job(tmp_path, plugin_env)
    try:
        yield j
    finally:
        j.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for this module's tests.  Module-scoped, not session-scoped:
    Playwright's sync API runs an asyncio loop on the calling (main) thread while it is open,
    and every later test on the same worker would find that loop "running" (``asyncio.run``
    refused, as two debugger tests were after these)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright (pip install playwright) is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; scripts/testbed/install.sh does)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("DASHBOARD_SCREENSHOT_DIR") or tmp_path / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d
