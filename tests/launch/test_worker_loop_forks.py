"""A tls worker loop given its credentials as arguments forks its procs from its fork server.

``python -m monarch_core.worker --address tls://... --ca --key`` (the way a
user starts one) hands its procs the credentials as ``MONARCH_TLS_*``
variables.  Those are start-up variables of a proc, so a fork server started
without them could fork none: every proc was exec'd (a fresh interpreter and
its imports each, about twice the memory per proc) beside a fork server that
sat idle.  The worker loop now starts its fork server with them; its procs
are the fork server's children, and they still speak tls.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers.clients import child_env, describe, run_code
from _helpers.procs import parent_of, wait_pids_gone

READY = "monarch worker loop listening on "

CLIENT = r"""
import json, os, sys
from monarch_core.actor import Actor, enable_transport, endpoint
from monarch_core.worker import attach_to_workers

class A(Actor):
    @endpoint
    def info(self):
        return {"pid": os.getpid(), "ppid": os.getppid(), "tls": "MONARCH_TLS_CA" in os.environ}

addr, ca, key = sys.argv[1:4]
enable_transport("tls://127.0.0.1:0")
hm = attach_to_workers([addr], ca=ca, private_key=key, timeout=120)
pm = hm.spawn_procs(per_host={"gpus": 2})
infos = list(pm.spawn("a", A).info.call().get(timeout=120).values())
print("RESULT " + json.dumps(infos), flush=True)
hm.shutdown().get(timeout=120)
"""


def test_a_tls_worker_loop_started_with_ca_and_key_forks_its_procs(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA(organization_name="monarch fork test")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem.bytes())
    for name in ("worker", "client"):
        leaf = ca.issue_cert("127.0.0.1")
        p = tmp_path / f"{name}.pem"
        p.write_bytes(leaf.private_key_pem.bytes() + b"".join(b.bytes() for b in leaf.cert_chain_pems))
        p.chmod(0o600)
    out = tmp_path / "worker.out"
    with open(out, "w") as f:
        w = subprocess.Popen(
            [sys.executable, "-m", "monarch_core.worker", "--address", "tls://127.0.0.1:0",
             "--ca", str(tmp_path / "ca.pem"), "--key", str(tmp_path / "worker.pem")],
            stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while READY not in out.read_text():
            assert w.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)
        addr = next(ln for ln in out.read_text().splitlines() if ln.startswith(READY))[len(READY):].strip()
        res = run_code(CLIENT, addr, str(tmp_path / "ca.pem"), str(tmp_path / "client.pem"), timeout=300)
        assert res.returncode == 0, describe(res)
        infos = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
        assert len(infos) == 2 and all(i["tls"] for i in infos), infos
        zygotes = {i["ppid"] for i in infos}
        # forked: their parent is the worker loop's fork server (a child of the worker loop), not the worker loop
        assert w.pid not in zygotes, f"the procs were exec'd by the worker loop {w.pid}: {infos}"
        assert len(zygotes) == 1 and all(parent_of(z) in (w.pid, None) for z in zygotes), (infos, w.pid)
        assert w.wait(timeout=60) == 0, out.read_text()
        assert wait_pids_gone([i["pid"] for i in infos] + sorted(zygotes), 30.0) == []
    finally:
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(timeout=30)
