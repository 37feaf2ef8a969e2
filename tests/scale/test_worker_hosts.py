"""The ``scale`` tier, many hosts: 64 worker loops over mutual TLS, attached by address.

Each worker loop is a "host" started the way a user starts one on a machine
they own (``python -m monarch_core.worker --address tls://127.0.0.1:0 --ca
--key``, a process group of its own).  One client attaches to all 64
(``attach_to_workers``), spawns one proc per host and one actor per proc,
calls every proc, SIGKILLs one worker loop during a ``call()`` to all (the
call must fail naming that host's rank, the other 63 must keep answering),
stops, and nothing of any host -- worker loop, fork server, proc -- may be
left.  Correctness and clean-up only, never timings: the waits are deadlines
far above what a loaded 2-core machine needed (the whole test: ~25 s at a
load average of 40-60).  64 hosts hold about 3 GiB (~48 MiB PSS per host:
worker loop, fork server, proc); ``bench/scale.py --hosts`` goes to 256.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from _helpers.clients import child_env, describe, run_code
from _helpers.procs import descendants, wait_pids_gone

pytestmark = pytest.mark.scale

HOSTS = 64
START_S = 300  # every worker loop listening
CLIENT_S = 400
READY = "monarch worker loop listening on "

CLIENT = r"""
import json, os, signal, sys, threading, time
import monarch_core.actor as api
from monarch_core.actor import Actor, enable_transport, endpoint
from monarch_core.worker import attach_to_workers

faults = []
api.unhandled_fault_hook = faults.append  # the killed host's proc: expected, checked below

class A(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def slow(self, s):
        time.sleep(s)
        return os.getpid()

cfg = json.load(open(sys.argv[1]))
n, wait = len(cfg["addresses"]), 240
enable_transport("tls://127.0.0.1:0")
hm = attach_to_workers(cfg["addresses"], ca=cfg["ca"], private_key=cfg["key"], timeout=wait)
pm = hm.spawn_procs(per_host={"gpus": 1})
a = pm.spawn("a", A)
first = list(a.pid.call().get(timeout=wait).values())
fut = a.slow.call(5.0)
threading.Timer(1.0, os.kill, (cfg["pids"][-1], signal.SIGKILL)).start()
try:
    fut.get(timeout=wait)
    lost = None
except Exception as e:
    lost = f"{type(e).__name__}: {e}"
rest = list(a.slice(hosts=slice(0, n - 1)).pid.call().get(timeout=wait).values())
pm.stop().get(timeout=wait)
hm.shutdown().get(timeout=wait)
print("RESULT " + json.dumps({"first": first, "lost": lost, "rest": rest,
                              "faults": [f.report() for f in faults]}), flush=True)
"""


def _pki(d: Path) -> dict[str, str]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA(organization_name="monarch scale test")
    paths = {"ca": str(d / "ca.pem")}
    (d / "ca.pem").write_bytes(ca.cert_pem.bytes())
    for name in ("worker", "client"):
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        p = d / f"{name}.pem"
        p.write_bytes(leaf.private_key_pem.bytes() + b"".join(b.bytes() for b in leaf.cert_chain_pems))
        p.chmod(0o600)
        paths[name] = str(p)
    return paths


@pytest.fixture
def worker_loops(tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen], list[str], dict[str, str]]]:
    """``HOSTS`` tls worker loops on 127.0.0.1 (all started at once, then
    waited for); their process groups are killed at teardown."""
    pki = _pki(tmp_path)
    procs: list[subprocess.Popen] = []
    try:
        for i in range(HOSTS):
            with open(tmp_path / f"worker{i}.out", "w") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "monarch_core.worker", "--address", "tls://127.0.0.1:0",
                     "--ca", pki["ca"], "--key", pki["worker"]],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                    start_new_session=True))
        addresses: list[str | None] = [None] * HOSTS
        deadline = time.monotonic() + START_S
        while None in addresses:
            for i, p in enumerate(procs):
                if addresses[i] is not None:
                    continue
                text = (tmp_path / f"worker{i}.out").read_text()
                line = next((ln for ln in text.splitlines() if ln.startswith(READY)), None)
                if line is not None:
                    addresses[i] = line[len(READY):].strip()
                elif p.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"worker loop {i} (pid {p.pid}) did not start (rc {p.poll()}):\n{text}")
            time.sleep(0.2)
        yield procs, [a for a in addresses if a is not None], pki
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait(timeout=30)


def test_64_tls_worker_loop_hosts_answer_survive_a_lost_host_and_stop_leaving_nothing(
    worker_loops: tuple[list[subprocess.Popen], list[str], dict[str, str]], tmp_path: Path
) -> None:
    procs, addresses, pki = worker_loops
    hosts_pids = {p.pid: descendants(p.pid) for p in procs}  # each worker loop's fork server
    cfg = tmp_path / "hosts.json"
    cfg.write_text(json.dumps({"addresses": addresses, "pids": [p.pid for p in procs], "ca": pki["ca"],
                               "key": pki["client"]}))
    res = run_code(CLIENT, str(cfg), timeout=CLIENT_S)
    assert res.returncode == 0, describe(res)
    out = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert len(out["first"]) == HOSTS and len(set(out["first"])) == HOSTS, out["first"]
    # the call() in flight failed, naming the killed host's rank; no other rank failed
    victim = f"'hosts': {HOSTS - 1}/{HOSTS}"
    assert out["lost"] is not None, "a call() to all succeeded although a worker loop was SIGKILLed during it"
    assert victim in out["lost"], out["lost"]
    assert out["faults"] and all(victim in f for f in out["faults"]), out["faults"]
    # the 63 others still answer, from the same procs
    assert sorted(out["rest"]) == sorted(out["first"][:-1]), (out["rest"], out["first"])
    # stopped: every worker loop, fork server and proc is gone
    everything = list(hosts_pids) + [q for qs in hosts_pids.values() for q in qs] + out["first"]
    assert wait_pids_gone(everything, 60.0) == []
    for p in procs:
        assert p.wait(timeout=30) is not None
