"""Helpers of the security suite (its fixtures are in ``conftest.py``): a
second local user, and Python children that run as that user.

The interpreter of the test venv lives under ``/root`` (mode 0700), which
another user cannot even enter, so a child cannot simply be exec'd as that
user (``subprocess(user=...)``, ``setpriv``): :func:`run_as` starts the
child as root, lets it import what the attack needs, and then drops to the
other user's uid and gid (``setresgid``/``setresuid``, no groups) before it
runs the attack code.  From then on the child is that user in everything the
kernel checks (``SO_PEERCRED``, file permissions).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from _helpers.clients import child_env

HERE = Path(__file__).resolve().parent
PY = sys.executable
#: The throwaway user the tests create (a system user: no home, no login shell).
OTHER = "monarch-test-other"

#: What the attack code may need, imported while still root.
PRELOAD = """
import json, os, sys, time, socket, struct, marshal, uuid, traceback, pickle, selectors, threading
import trio, pluggy
import monarch_core.worker, monarch_core.actor
from monarch_core import actor as _a, worker as _w
from monarch_core._actor import _attach, _host_mesh, _proc_mesh, _actor_mesh, _mesh
from monarch_core._proc import _transport, _state, _agent
from monarch_core._kernel import _runtime, _wire, _poller, _inbound, _outbound
from monarch_core._builtins import _ipc, _local
from monarch_core._plugins import registry as _registry
_registry().transport("ipc")
import attack_actors
"""


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def other_user() -> OtherUser:
    """A second local user (created once, idempotently; left in place: a
    system account without home or shell)."""
    if os.geteuid() != 0:
        pytest.skip("a second local user can only be created as root")
    try:
        pw = pwd.getpwnam(OTHER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not installed: no second local user")
        r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER],
                           capture_output=True, text=True, timeout=60)
        if r.returncode not in (0, 9):  # 9: made meanwhile by another run
            pytest.skip(f"useradd {OTHER} failed: {r.stderr.strip()}")
        pw = pwd.getpwnam(OTHER)
    return OtherUser(OTHER, pw.pw_uid, pw.pw_gid)


def security_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """A child's environment: this checkout's code, this folder (the attack's
    actors), no MONARCH_* of the outer run."""
    return child_env(extra, path=[HERE], drop=("MONARCH_",))


def run_as(user: OtherUser, code: str, *, env: dict[str, str | None] | None = None,
           timeout: float = 90) -> dict[str, Any]:
    """Run ``code`` in a child as ``user`` (see the module docstring); it
    reports with ``report(**fields)``; the fields it reported, plus ``rc``
    and ``stderr``."""
    prog = (PRELOAD
            + "def report(**kw):\n    print('REPORT ' + json.dumps(kw), flush=True)\n"
            + f"os.setgroups([]); os.setresgid({user.gid}, {user.gid}, {user.gid}); "
            + f"os.setresuid({user.uid}, {user.uid}, {user.uid}); os.chdir('/')\n"
            + f"assert os.getuid() == {user.uid} and os.geteuid() == {user.uid}\n"
            + code)
    e = security_env({"HOME": "/", **(env or {})})
    r = subprocess.run([PY, "-c", prog], capture_output=True, text=True, timeout=timeout, env=e, cwd="/")
    out: dict[str, Any] = {}
    for line in r.stdout.splitlines():
        if line.startswith("REPORT "):
            out.update(json.loads(line[len("REPORT "):]))
    out["rc"], out["stderr"] = r.returncode, r.stderr
    return out


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder both users can write (a marker there proves who ran code)."""
    d = Path(tempfile.mkdtemp(prefix="mc-sec-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)
