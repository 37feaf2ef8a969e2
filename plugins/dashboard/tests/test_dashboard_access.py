"""Who may read a dashboard: loopback peers with the token, nobody else; and
nothing of the dashboard is imported or started unless asked for."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # the suite's helpers
from _helpers.testbed import netns  # noqa: E402,F401 - the testbed fixture

import monarch_dashboard


@pytest.fixture
def dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    d = monarch_dashboard.start(port=0)
    try:
        yield d
    finally:
        d.stop()


def _get(port: int, path: str, *, source: Optional[str] = None, host: Optional[str] = None,
         cookie: Optional[str] = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                      source_address=(source, 0) if source else None)
    headers = {"Host": host or f"127.0.0.1:{port}"}
    if cookie:
        headers["Cookie"] = cookie
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        body = r.read(4096) if r.status != 200 or "event-stream" not in (r.getheader("content-type") or "") \
            else r.read1(200)
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body.decode()
    finally:
        conn.close()


def test_the_url_is_loopback_with_a_long_token_and_one_dashboard_per_process(dash: Any) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{32}", dash.url)
    assert monarch_dashboard.start() is dash  # one per process, the URL is not printed again


def test_a_request_without_the_token_is_refused_and_told_what_to_do(dash: Any) -> None:
    for path in ("/", "/job", "/events?page=job", "/api/state", "/trace.json", "/static/dashboard.js",
                 "/job?token=", "/job?token=" + "x" * len(dash.token)):
        status, _h, body = _get(dash.port, path)
        assert status == 403, path
        assert "no valid token" in body and "monarch dashboard" in body, body
    status, _h, _b = _get(dash.port, "/job", cookie=f"monarch_dashboard_{dash.port}=wrong")
    assert status == 403


def test_the_token_in_the_url_gives_a_cookie_for_the_pages_and_the_stream(dash: Any) -> None:
    status, headers, _b = _get(dash.port, f"/?token={dash.token}")
    assert status == 303 and headers["location"] == "/job"
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    jar = cookie.split(";", 1)[0]
    for page in ("job", "endpoints", "failures", "logs", "timeline"):
        status, _h, body = _get(dash.port, f"/{page}", cookie=jar)
        assert status == 200 and 'id="live"' in body, page
    status, headers, body = _get(dash.port, "/events?page=job", cookie=jar)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.startswith("retry:")


def test_a_request_from_another_address_is_refused(dash: Any) -> None:
    # another loopback address of this machine: the peer check, token or not
    status, _h, body = _get(dash.port, f"/job?token={dash.token}", source="127.0.0.2")
    assert status == 403
    assert f"ssh -L {dash.port}:127.0.0.1:{dash.port}" in body
    # a page of another site (DNS rebinding): the Host header check
    status, _h, body = _get(dash.port, f"/job?token={dash.token}", host=f"evil.example:{dash.port}")
    assert status == 403 and "is not this dashboard's address" in body


def test_it_listens_on_loopback_only(dash: Any, netns: Any) -> None:
    """Not reachable at this machine's other addresses: its own, and the
    testbed's root-namespace address (``netns``: there is always one)."""
    import socket

    others = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    others.add("10.250.0.1")  # the testbed's root-namespace address
    for addr in others:
        if addr.startswith("127."):
            continue
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((addr, dash.port), timeout=5).close()


def test_another_host_cannot_connect(dash: Any, netns: Any) -> None:
    """From namespace host h4 of the testbed (the ``netns`` fixture: the
    testbed tier), the dashboard's port on this machine refuses."""
    probe = ("import socket,sys\ntry:\n socket.create_connection(('10.250.0.1', %d), timeout=5)\n"
             " print('connected')\nexcept OSError as e:\n print(type(e).__name__)\n") % dash.port
    res = subprocess.run(["ip", "netns", "exec", "rt-h4", sys.executable, "-c", probe], capture_output=True,
                         text=True, timeout=60)
    assert res.stdout.strip() == "ConnectionRefusedError", (res.stdout, res.stderr)


JOB = """
import sys
import monarch_core.actor as A
class E(A.Actor):
    @A.endpoint
    def one(self) -> int:
        return 1
pm = A.this_host().spawn_procs(per_host={"procs": 1})
assert pm.spawn("e", E).one.call_one().get(timeout=60) == 1
loaded = sorted(m for m in ("monarch_dashboard._dashboard", "monarch_dashboard._server", "starlette", "hypercorn")
                if m in sys.modules)
print("loaded", loaded, flush=True)
pm.stop().get(timeout=30)
"""


@pytest.mark.parametrize("on", [False, True])
def test_nothing_is_imported_or_started_unless_asked_for(on: bool, tmp_path: Path, plugin_env: dict[str, str]) -> None:
    env = {**plugin_env, "XDG_RUNTIME_DIR": str(tmp_path)}
    if on:
        env["MONARCH_DASHBOARD"] = "1"
    res = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    urls = re.findall(r"monarch dashboard: http://127\.0\.0\.1:\d+/\?token=\S+", res.stderr)
    if on:
        assert len(urls) == 1, res.stderr  # printed once
        assert "ssh -L" in res.stderr
        assert "'hypercorn'" in res.stdout and "'starlette'" in res.stdout
    else:
        assert urls == [], res.stderr
        assert "loaded []" in res.stdout, res.stdout


def test_monarch_dashboard_prints_the_running_urls(dash: Any, entry_point_dir: Optional[Path],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from monarch_core import cli

    if entry_point_dir is not None:
        monkeypatch.syspath_prepend(str(entry_point_dir))
    capsys.readouterr()
    assert cli.main(["dashboard"]) == 0
    out = capsys.readouterr().out
    assert dash.url in out and f"pid {os.getpid()}" in out and "ssh -L" in out
    dash.stop()
    assert cli.main(["dashboard"]) == 1
    assert "no dashboard runs" in capsys.readouterr().out


def test_the_with_block_serves_for_its_duration_and_puts_the_streams_back(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    out, err = sys.stdout, sys.stderr
    with monarch_dashboard.dashboard() as d:
        assert sys.stdout is not out  # the client's output is followed for the Logs page
        print("a line of the client")
        assert any(ln.text == "a line of the client" for ln in d.model.log_view())
        assert _get(d.port, f"/logs?token={d.token}")[0] == 200
    assert sys.stdout is out and sys.stderr is err
    assert monarch_dashboard.stop() is False
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", d.port), timeout=5).close()


def test_a_dashboard_that_never_recorded_leaves_nothing_in_the_temp_dir(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where mkdtemp would put a trace folder
    with monarch_dashboard.dashboard():
        pass
    assert list(scratch.iterdir()) == []  # a trace folder is made by the first recording only
