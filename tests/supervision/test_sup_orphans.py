"""No orphans: whether the client exits normally, crashes (raises), or is
SIGKILLed, every worker process it started -- grandchildren spawned by actors
included -- is gone within 5 s.  The client runs as a subprocess that prints
its workers' pids; the test polls /proc with a deadline."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time

import pytest

from _helpers.clients import child_env, write_script
from _helpers.procs import kill_pids, wait_pids_gone

ORPHAN_CLIENT = """
import json, os, sys, threading
from monarch_core.actor import Actor, endpoint, this_host

class Leaf(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

class Mid(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    async def grandchildren(self):
        self.pm = this_host().spawn_procs(per_host={"g": 1})
        self.leaf = self.pm.spawn("leaf", Leaf)
        return (await self.leaf.pid.call()).values()

pm = this_host().spawn_procs(per_host={"gpus": 2})
mid = pm.spawn("mid", Mid)
pids = list(mid.pid.call().get(timeout=30).values())
for gc in mid.grandchildren.call().get(timeout=30).values():
    pids.extend(gc)
print("PIDS " + json.dumps(pids), flush=True)
mode = sys.argv[1]
if mode == "raise":
    raise RuntimeError("the client crashed on purpose")
if mode == "sigkill":
    threading.Event().wait(60)   # the test SIGKILLs us while we wait
    print("NOT KILLED", flush=True)
print("NORMAL EXIT", flush=True)
"""


def _pids(stdout: str) -> list[int]:
    for ln in stdout.splitlines():
        if ln.startswith("PIDS "):
            return json.loads(ln[5:])
    raise AssertionError(f"the client printed no PIDS line:\n{stdout}")


@pytest.mark.parametrize("mode,rc", [("normal", 0), ("raise", 1)])
def test_no_orphans_after_client_exit(client_script, mode, rc) -> None:
    r = client_script(ORPHAN_CLIENT, mode)
    pids = _pids(r.stdout)
    assert len(pids) == 4  # 2 workers + 2 grandchildren
    try:
        assert r.returncode == rc, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
        if mode == "raise":
            assert "the client crashed on purpose" in r.stderr
        alive = wait_pids_gone(pids, 5.0)
        assert alive == [], f"worker pids still alive 5s after the client exited: {alive}"
    finally:
        kill_pids(pids)


def test_no_orphans_after_client_is_sigkilled(tmp_path) -> None:
    script = write_script(tmp_path, ORPHAN_CLIENT)
    p = subprocess.Popen(
        [sys.executable, str(script), "sigkill"],
        cwd=str(tmp_path),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    pids: list[int] = []
    try:
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        line = ""
        while not line.startswith("PIDS ") and time.monotonic() < deadline:
            if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = p.stdout.readline()
                if line == "":
                    break
        assert line.startswith("PIDS "), f"no PIDS line from the client (rc={p.poll()})"
        pids = json.loads(line[5:])
        assert len(pids) == 4
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(timeout=10) == -signal.SIGKILL
        alive = wait_pids_gone(pids, 5.0)
        assert alive == [], f"worker pids still alive 5s after the client was SIGKILLed: {alive}"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        kill_pids(pids)
