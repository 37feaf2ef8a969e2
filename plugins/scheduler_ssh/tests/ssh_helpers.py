"""Helpers of the SSH scheduler suite (the fixtures are in this folder's
``conftest.py``; tests import this module, never ``conftest``).

Hosts ``h1..h4`` are the testbed's network namespaces, each with a real
OpenSSH server (``_helpers.testbed``).  Clients run in their own
interpreters (a process enables one transport): :class:`Client` is an
interactive one that keeps a host mesh across tests (code in, JSON out).

Processes started on the hosts are found by a tag: every test's
``ssh_config`` sends ``SetEnv RT_TAG=<tag>`` (the testbed's sshd accepts
``RT_*``), so the bootstrap, the worker loop and its procs all carry it in
their environment; :func:`tagged` lists them by reading ``/proc/PID/environ``
of each namespace's processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _helpers import clients as _clients
from _helpers.clients import LineReader
from _helpers.config import toml_value
from _helpers.procs import kill_tree, pid_running
from _helpers.testbed import RT_RUN

HERE = Path(__file__).resolve().parent
PY = sys.executable
SSH_DIR = RT_RUN / "ssh"


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def remote_pythonpath() -> str:
    """What the worker loops import: this checkout (the code under test)."""
    return os.pathsep.join(_clients.code_roots())


def ssh_config(directory: Path, tag: str, extra: str = "") -> Path:
    """The testbed's ``ssh_config`` plus ``SetEnv RT_TAG=<tag>`` (and ``extra`` lines)."""
    base = (SSH_DIR / "ssh_config").read_text()
    text = base.replace("Host *\n", f"Host *\n  SetEnv RT_TAG={tag}\n", 1)
    assert f"RT_TAG={tag}" in text, "the testbed's ssh_config has no 'Host *' block"
    p = Path(directory) / f"ssh_config-{tag}"
    p.write_text(text + extra)
    return p


def entry(tag: str, directory: Path, **params: Any) -> dict[str, Any]:
    """An ``ssh`` entry's parameters for the testbed (tagged ssh_config, this
    checkout on the hosts' PYTHONPATH); ``params`` override."""
    out: dict[str, Any] = {"env": {"PYTHONPATH": remote_pythonpath()}, "connect_timeout": 5}
    out.update(params)
    if "ssh_config" not in params:
        out["ssh_config"] = str(ssh_config(directory, tag))
    return out


def write_config(directory: Path, entries: dict[str, dict[str, Any]]) -> Path:
    """``directory/monarch.toml`` with one ``[hosts.<name>]`` (scheduler ssh) per entry."""
    lines = []
    for name, params in entries.items():
        lines.append(f"[hosts.{name}]")
        lines.append('scheduler = "ssh"')
        lines += [f"{k} = {toml_value(v)}" for k, v in params.items()]
        lines.append("")
    p = Path(directory) / "monarch.toml"
    p.write_text("\n".join(lines))
    return p


# ---------------------------------------------------------------- processes on the hosts


def ns_pids(i: int) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", f"rt-h{i}"], capture_output=True, text=True, timeout=30, check=False)
    return [int(p) for p in res.stdout.split()]


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def tagged(tag: str, hosts: Iterable[int] = (1, 2, 3, 4)) -> dict[int, list[int]]:
    """Live processes carrying ``RT_TAG=<tag>`` in each host (empty hosts left out)."""
    needle = b"\0RT_TAG=" + tag.encode() + b"\0"
    out: dict[int, list[int]] = {}
    for i in hosts:
        found = [p for p in ns_pids(i) if needle in b"\0" + _environ(p) + b"\0" and pid_running(p)]
        if found:
            out[i] = found
    return out


def wait_tagged_gone(tag: str, hosts: Iterable[int] = (1, 2, 3, 4), timeout: float = 30.0) -> float:
    """Seconds until no process of ``tag`` runs on ``hosts``; after
    ``timeout`` s the leftovers are killed and the test fails, naming them."""
    hosts = tuple(hosts)
    t0 = time.monotonic()
    while True:
        left = tagged(tag, hosts)
        if not left:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            described = {i: [(p, _cmdline(p)) for p in ps] for i, ps in left.items()}
            for ps in left.values():
                for p in ps:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
            raise AssertionError(f"processes left on the hosts {timeout:.0f}s later (killed now): {described}")
        time.sleep(0.02)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def sshd_sessions(i: int, listener: int | None) -> list[int]:
    """sshd processes in host ``i`` other than its listener: one per open
    connection (and its privilege-separated child)."""
    out = []
    for p in ns_pids(i):
        if p == listener:
            continue
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "sshd" and pid_running(p):
                    out.append(p)
        except OSError:
            pass
    return out


def link_state(i: int) -> str:
    """``up`` or ``down``: host ``i``'s link (``netns-link.sh I status``)."""
    from _helpers.testbed import TESTBED

    res = subprocess.run([str(TESTBED / "netns-link.sh"), str(i), "status"], capture_output=True, text=True,
                         timeout=30, check=False)
    return res.stdout.strip()


def listener_pid(name: str) -> int | None:
    try:
        return int((RT_RUN / "pids" / f"sshd-{name}.pid").read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- clients

#: The interactive client: it reads JSON lines {"code": ...} on stdin, runs
#: each in one namespace, and answers {"ok": <the value of `result`>} or
#: {"error": <traceback>}.
SERVER = r'''
import json, sys, traceback
ns = {"__name__": "__main__"}
exec(compile(PRELUDE, "<prelude>", "exec"), ns)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    ns.pop("result", None)
    try:
        exec(compile(req["code"], "<test code>", "exec"), ns)
        out = {"ok": ns.get("result")}
    except BaseException as e:
        out = {"error": "".join(traceback.format_exception(type(e), e, e.__traceback__)), "type": type(e).__name__,
               "message": str(e)}
    print(json.dumps(out, default=str), flush=True)
'''


class Client:
    """An interactive client interpreter in the root namespace (see :data:`SERVER`)."""

    def __init__(self, prelude: str, *, cwd: Path, env: dict[str, str | None] | None = None,
                 stderr: Any = subprocess.PIPE, python: str = PY) -> None:
        code = f"PRELUDE = {textwrap.dedent(prelude)!r}\n" + SERVER
        self.popen = subprocess.Popen(
            [python, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env=_clients.child_env(env, path=[HERE], drop=("MONARCH_",)), cwd=str(cwd),
        )
        self.out = LineReader(self.popen.stdout, "ssh-client-out")
        self.err = LineReader(self.popen.stderr, "ssh-client-err") if stderr == subprocess.PIPE else None
        self._next = 0
        self._expect("ready", 120)

    def describe(self) -> str:
        err = self.err.text()[-6000:] if self.err is not None else "(not captured)"
        return f"rc={self.popen.poll()}\nstdout:\n{self.out.text()[-3000:]}\nstderr:\n{err}"

    def _expect(self, key: str | tuple[str, ...], timeout: float) -> dict[str, Any]:
        keys = (key,) if isinstance(key, str) else key

        def match(line: str) -> Any:
            try:
                obj = json.loads(line)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) and any(k in obj for k in keys) else None

        try:
            i, obj = self.out.wait_for(match, timeout, self._next)
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"ssh client: no answer ({e})\n{self.describe()}") from None
        self._next = i + 1
        return obj

    def request(self, code: str, timeout: float = 120) -> dict[str, Any]:
        """Run ``code``; the raw answer ({"ok": ...} or {"error": ...})."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps({"code": textwrap.dedent(code)}) + "\n")
        self.popen.stdin.flush()
        return self._expect(("ok", "error"), timeout)

    def run(self, code: str, timeout: float = 120) -> Any:
        """Run ``code``; the value it left in ``result`` (the test fails on an exception)."""
        res = self.request(code, timeout)
        if "error" in res:
            raise AssertionError(f"the client raised:\n{res['error']}")
        return res["ok"]

    def close(self, timeout: float = 60) -> None:
        if self.popen.poll() is None and self.popen.stdin is not None:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_tree(self.popen)
        self.out.join(5)

    def kill(self) -> None:
        kill_tree(self.popen)
