"""Session credentials: a client with no TLS material of its own allocates
hosts through a scheduler that declares ``transport = "tls"``; the core
enables tls at the scheduler's ``client_address`` and asks for session
credentials, so the client holds a CA in memory and every worker loop gets a
certificate of its own (``launch.credentials_for(host)``).  Real worker loops
on this machine, real TLS; strangers (no certificate, another CA's) are
refused while the mesh keeps working.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cryptography")
trustme = pytest.importorskip("trustme")

CLIENT = r'''
import json, os, socket, ssl, subprocess, sys, tempfile
from monarch_core._actor import _mesh
from monarch_core._launch import _start
from monarch_core._proc import _state
from monarch_core._launch import _alloc
from monarch_core.actor import Actor, endpoint
from monarch_core.hookspecs import Allocation, AllocationRequest, HostHandle, Scheduler, wait_worker_address
from cryptography import x509

assert not any(k.startswith("MONARCH_TLS_") for k in os.environ), "the test must start without TLS material"


class Alloc(Allocation):
    def __init__(self, procs, hosts):
        self.procs, self.hosts, self.extent = procs, hosts, {"hosts": len(hosts)}

    def release(self):
        for p in self.procs:
            p.kill()
            p.wait()


class TlsLocal(Scheduler):
    name = "tlslocal"
    transport = "tls"

    def client_address(self, request):
        return "tls://127.0.0.1:0"

    def allocate(self, request, launch):
        self.envs, procs, hosts = [], [], []
        for i in range(2):
            env = launch.environment(host="127.0.0.1")
            self.envs.append(env)
            p = subprocess.Popen(launch.command("127.0.0.1"), env=env, stdout=subprocess.PIPE)
            procs.append(p)
            hosts.append(HostHandle(f"w{i}", wait_worker_address(p.stdout, 60, host=f"w{i}", forward=2)))
        return Alloc(procs, hosts)


class Echo(Actor):
    @endpoint
    def where(self, x):
        return [x, os.getpid()]


sched = TlsLocal()
request = AllocationRequest(name="t", params={}, source="<test>")
_alloc.prepare_transport(sched, request)
_start.ensure_runtime()
rt = _state.current()
record = _alloc.allocate(sched, request, rt, 90)
hm = _mesh.host_mesh_of(record, "t")
pm = hm.spawn_procs(per_host={"gpus": 2})
echo = pm.spawn("echo", Echo)
out = {"first": echo.where.call("a").get(timeout=60).values(), "client": rt.kernel.address}

def subject(pem):
    c = x509.load_pem_x509_certificate(pem.encode())
    sans = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {"cn": c.subject.rfc4514_string(), "issuer": c.issuer.rfc4514_string(),
            "sans": [str(v) for v in sans.get_values_for_type(x509.IPAddress)] + sans.get_values_for_type(x509.DNSName)}

out["workers"] = [subject(e["MONARCH_TLS_CERT"]) for e in sched.envs]
out["keys_differ"] = sched.envs[0]["MONARCH_TLS_KEY"] != sched.envs[1]["MONARCH_TLS_KEY"]
out["same_ca"] = sched.envs[0]["MONARCH_TLS_CA"] == sched.envs[1]["MONARCH_TLS_CA"]

# strangers at a worker's port: no certificate, and a certificate of another CA
host, port = record.hosts[0].address.split("://")[1].rsplit(":", 1)
def stranger(certfile=None):
    ctx = ssl.create_default_context(cafile=sys.argv[1])
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if certfile:
        ctx.load_cert_chain(certfile)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            with ctx.wrap_socket(s) as t:
                t.settimeout(10)
                t.sendall(b"MONARCH\x00\x01" + b"\x00" * 64)
                data = t.recv(100)
                return "got %r" % (data,)
    except (ssl.SSLError, OSError) as e:
        return "refused: %s" % (type(e).__name__,)
out["no_cert"] = stranger()
out["other_ca"] = stranger(sys.argv[2])
out["after"] = echo.where.call("b").get(timeout=60).values()
hm.shutdown().get(timeout=60)
print(json.dumps(out))
'''


def test_a_scheduler_client_without_tls_material_gets_session_credentials_and_strangers_are_refused(
    client_script, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    other = trustme.CA()
    stranger = other.issue_cert("127.0.0.1", "localhost")
    stranger_pem = tmp_path / "stranger.pem"
    stranger.private_key_and_cert_chain_pem.write_to_path(str(stranger_pem))
    other_ca = tmp_path / "other-ca.pem"
    other.cert_pem.write_to_path(str(other_ca))
    env = {k: None for k in ("MONARCH_TLS_CA", "MONARCH_TLS_CERT", "MONARCH_TLS_KEY")}
    res = client_script(CLIENT, str(other_ca), str(stranger_pem), env=env, timeout=180)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert [x for x, _ in out["first"]] == ["a"] * 4
    assert len({pid for _, pid in out["first"]}) == 4
    assert out["client"].startswith("tls://127.0.0.1:"), out["client"]  # the scheduler's client_address
    # one certificate per worker, from one session CA, valid for the address it listens on
    assert out["keys_differ"] and out["same_ca"]
    for w in out["workers"]:
        assert w["issuer"] == "CN=monarch session", w
        assert "127.0.0.1" in w["sans"], w
    assert out["workers"][0]["cn"].startswith("CN=monarch worker")
    assert out["no_cert"].startswith("refused"), out["no_cert"]
    assert out["other_ca"].startswith("refused"), out["other_ca"]
    assert out["after"] == [["b", pid] for _, pid in out["first"]]


CHECK_OVER_TLS = r'''
import os, signal
from monarch_core._builtins._local import LocalScheduler
from monarch_core._plugins import registry
from monarch_core.actor import enable_transport
from monarch_core.hookspecs import SESSION_CREDENTIALS
from monarch_core.testing import check_scheduler

enable_transport("tls://127.0.0.1:0")
registry().transport("tls").set_credentials(ca=SESSION_CREDENTIALS)
check_scheduler(LocalScheduler(), {"hosts": 2}, bad_params={"hosts": 0},
                lose_host=lambda h: os.kill(int(h.labels["pid"]), signal.SIGKILL), timeout=120)
print("conformant over tls")
'''


def test_the_local_scheduler_passes_check_scheduler_over_tls_with_session_credentials(client_script) -> None:  # type: ignore[no-untyped-def]
    env = {k: None for k in ("MONARCH_TLS_CA", "MONARCH_TLS_CERT", "MONARCH_TLS_KEY")}
    res = client_script(CHECK_OVER_TLS, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert res.stdout.strip().splitlines()[-1] == "conformant over tls"
