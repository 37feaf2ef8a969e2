"""A host mesh of three SSH hosts (h1..h3, real sshd in each namespace)
from ``monarch.toml``, two procs per host, shared by the tests of this
module (one client interpreter holds it): calls across hosts, actors on
different hosts calling each other, strangers refused at the worker and proc
ports, credentials kept off command lines and disks, ``stop()`` keeping the
workers, ``sync_workspace`` into per-host directories, and ``shutdown()``
leaving nothing behind."""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ssh_helpers as H

HOSTS = ("h1", "h2", "h3")

PRELUDE = r'''
import asyncio, json, os, socket, time
from monarch_core.actor import Actor, Workspace, current_rank, endpoint, hosts_from_config


class Where(Actor):
    @endpoint
    def where(self):
        return [socket.gethostname(), os.getpid(), os.getcwd()]

    @endpoint
    def load(self, name):
        import importlib
        mod = importlib.import_module(name)
        return [mod.VALUE, mod.__file__, os.environ.get("PYTHONPATH", "")]


class Caller(Actor):
    @endpoint
    def ask(self, other):
        # an actor on one host calling actors on the others, proc to proc
        return [socket.gethostname(), other.where.call().get(timeout=60).values()]


t0 = time.monotonic()
hm = hosts_from_config("lab")
up_s = time.monotonic() - t0
pm = hm.spawn_procs(per_host={"gpus": 2})
where = pm.spawn("where", Where)
first = where.where.call().get(timeout=120).values()
first_reply_s = time.monotonic() - t0
'''


@pytest.fixture(scope="module")
def lab(sshd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ssh-mesh")
    tag = H.new_tag()
    remote = d / "remote"
    H.write_config(d, {"lab": H.entry(tag, d, hosts=list(HOSTS), cwd=str(remote / "{host}"))})
    client = H.Client(PRELUDE, cwd=d, env={"MONARCH_CONFIG": str(d / "monarch.toml")})
    try:
        yield {"client": client, "tag": tag, "dir": d, "remote": remote}
    finally:
        client.close()
        H.wait_tagged_gone(tag, (1, 2, 3))


def test_one_rank_per_host_named_in_to_table(lab: dict[str, Any]) -> None:
    c = lab["client"]
    out = c.run("result = {'table': hm.to_table(), 'sizes': hm.sizes, 'hosts': [[h.name, h.address, dict(h.labels)] "
                "for h in hm.hosts], 'client': __import__('monarch_core._proc._state', fromlist=['x']).current()"
                ".kernel.address}")
    assert out["sizes"] == {"hosts": 3}
    for i, (name, address, labels) in enumerate(out["hosts"], 1):
        assert name == f"h{i}"
        assert address.startswith(f"tls://10.250.0.{10 + i}:"), address  # where the SSH connection reached
        assert labels["hostname"] == f"h{i}" and labels["address"] == f"10.250.0.{10 + i}", labels
        assert re.search(rf"\bh{i}\b.*hostname=h{i} address=10\.250\.0\.{10 + i}", out["table"]), out["table"]
    # found without settings: the local end of the route to the first host
    assert out["client"].startswith("tls://10.250.0.1:"), out["client"]


def test_calls_reach_every_host_and_procs_run_in_the_hosts_working_directory(lab: dict[str, Any]) -> None:
    first = lab["client"].run("result = first")
    assert [h for h, _, _ in first] == ["h1", "h1", "h2", "h2", "h3", "h3"]
    assert len({pid for _, pid, _ in first}) == 6
    for host, _, cwd in first:
        assert cwd == str(lab["remote"] / host)  # cwd = ".../{host}", made by the bootstrap
    again = lab["client"].run("result = where.slice(hosts=1).where.call().get(timeout=60).values()")
    assert [h for h, _, _ in again] == ["h2", "h2"]


def test_actors_on_different_hosts_call_each_other(lab: dict[str, Any]) -> None:
    out = lab["client"].run("""
        callers = pm.slice(hosts=0, gpus=0).spawn("caller", Caller)
        result = callers.ask.call_one(where.slice(hosts=slice(1, 3))).get(timeout=120)
    """)
    host, answers = out
    assert host == "h1"
    assert sorted(h for h, _, _ in answers) == ["h2", "h2", "h3", "h3"]


def _stranger(address: str, certfile: str | None, cafile: str | None) -> str:
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if certfile:
        ctx.load_cert_chain(certfile)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as s, ctx.wrap_socket(s) as t:
            t.settimeout(10)
            t.sendall(b"MONARCH\x00\x01" + b"\x00" * 64)
            data = t.recv(100)
            return f"got {data!r}" if data else "refused: closed without a byte"
    except (ssl.SSLError, OSError) as e:
        return f"refused: {type(e).__name__}"


def _listening_ports(host: int, pid: int) -> list[int]:
    out = subprocess.run(["ip", "netns", "exec", f"rt-h{host}", "ss", "-ltnpH"], capture_output=True, text=True, check=False,
                         timeout=30).stdout
    return [int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line]


def test_worker_and_proc_ports_refuse_strangers_while_the_mesh_keeps_working(lab: dict[str, Any], tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    c = lab["client"]
    hosts = c.run("result = [[h.address, int(h.labels['pid'])] for h in hm.hosts]")
    first = c.run("result = first")
    other = trustme.CA()
    leaf = other.issue_cert("rtctl", "10.250.0.1")
    pem = tmp_path / "stranger.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(pem))
    proc_pid = first[0][1]  # a proc on h1
    ports = _listening_ports(1, proc_pid)
    assert ports, f"proc {proc_pid} listens on no TCP port in h1"
    targets = [a for a, _ in hosts] + [f"tls://10.250.0.11:{p}" for p in ports]
    for address in targets:
        for cert in (None, str(pem)):
            verdict = _stranger(address, cert, None)
            assert verdict.startswith("refused"), f"{address} with {'a foreign' if cert else 'no'} certificate: {verdict}"
    after = c.run("result = where.where.call().get(timeout=60).values()")
    assert [pid for _, pid, _ in after] == [pid for _, pid, _ in first]


def _text(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_credentials_are_never_on_a_command_line_or_on_the_hosts_disks(lab: dict[str, Any]) -> None:
    c = lab["client"]
    workers = c.run("result = [int(h.labels['pid']) for h in hm.hosts]")
    procs = [pid for _, pid, _ in c.run("result = first")]
    for pid in workers + procs:
        cmdline = _text(f"/proc/{pid}/cmdline")
        assert cmdline, f"pid {pid} is gone"
        assert b"PRIVATE KEY" not in cmdline and b"MONARCH_TLS" not in cmdline, cmdline[:300]
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/") and os.path.isfile(target):
                assert b"PRIVATE KEY" not in _text(target)[:1 << 20], f"pid {pid} has {target} open, which holds a key"
        assert oct(os.stat(f"/proc/{pid}/environ").st_mode & 0o777) == "0o400"
    # the key reached the worker through the SSH channel, into its environment in memory (the
    # bootstrap applies it in-process), and the procs it started inherit it
    keys = c.run("class Key(Actor):\n"
                 "    @endpoint\n"
                 "    def key(self):\n"
                 "        return os.environ.get('MONARCH_TLS_KEY', '')[:40]\n"
                 "result = pm.spawn('key', Key).key.call().get(timeout=60).values()")
    assert len(keys) == len(procs) and all(k.startswith("-----BEGIN") for k in keys), keys
    for root, _, files in os.walk(lab["remote"]):
        for name in files:
            assert b"PRIVATE KEY" not in _text(os.path.join(root, name)), os.path.join(root, name)


def test_stop_keeps_the_workers_for_new_procs(lab: dict[str, Any]) -> None:
    c = lab["client"]
    before = c.run("result = [h.labels['pid'] for h in hm.hosts]")
    out = c.run("""
        hm.stop().get(timeout=60)
        pm = hm.spawn_procs(per_host={"gpus": 2})
        where = pm.spawn("where", Where)
        first = where.where.call().get(timeout=120).values()
        result = first
    """)
    assert [h for h, _, _ in out] == ["h1", "h1", "h2", "h2", "h3", "h3"]
    for pid in before:
        assert os.path.exists(f"/proc/{pid}"), f"worker {pid} did not survive HostMesh.stop()"


def test_sync_workspace_copies_only_changed_files_and_new_procs_import_them(lab: dict[str, Any]) -> None:
    c, tag, remote = lab["client"], lab["tag"], lab["remote"]
    src = lab["dir"] / "local" / "shipped"
    (src / "sub").mkdir(parents=True)
    mod = f"synced_{tag}"
    (src / f"{mod}.py").write_text("VALUE = 1\n")
    (src / "sub" / "data.txt").write_text("unchanged\n")
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    code = f"""
        asyncio.run(hm.sync_workspace(Workspace(dirs=[{str(src)!r}])))
        pm2 = hm.spawn_procs(per_host={{"gpus": 1}})
        result = pm2.spawn("w", Where).load.call({mod!r}).get(timeout=120).values()
        pm2.stop().get(timeout=60)
    """
    out = c.run(code)
    for i, (value, path, pythonpath) in enumerate(out, 1):
        assert value == 1
        assert path == str(remote / f"h{i}" / "shipped" / f"{mod}.py"), path  # the host's own copy
        assert pythonpath.split(os.pathsep)[0] == str(remote / f"h{i}" / "shipped"), pythonpath
    data = [remote / h / "shipped" / "sub" / "data.txt" for h in HOSTS]
    assert all(p.read_text() == "unchanged\n" for p in data)
    assert not any((remote / h / "shipped" / "__pycache__" / "junk.pyc").exists() for h in HOSTS)
    before = [(p.stat().st_ino, p.stat().st_ctime_ns) for p in data]
    (src / f"{mod}.py").write_text("VALUE = 2\n")  # same size, same second: the content decides
    out = c.run(code)
    assert [v for v, _, _ in out] == [2, 2, 2]
    assert [(p.stat().st_ino, p.stat().st_ctime_ns) for p in data] == before, "an unchanged file was copied again"
    for h in HOSTS:
        assert (remote / h / "shipped" / f"{mod}.py").read_text() == "VALUE = 2\n"


def test_sync_workspace_auto_reload_reloads_an_edited_module_in_running_procs(lab: dict[str, Any]) -> None:
    c, tag, remote = lab["client"], lab["tag"], lab["remote"]
    src = lab["dir"] / "local" / "reloaded"
    src.mkdir(parents=True)
    mod = f"reloaded_{tag}"
    (src / f"{mod}.py").write_text("VALUE = 1\n")
    out = c.run(f"""
        os.environ["MONARCH_AUTO_RELOAD_INTERVAL"] = "0.2"
        asyncio.run(hm.sync_workspace(Workspace(dirs=[{str(src)!r}]), auto_reload=True))
        pm3 = hm.spawn_procs(per_host={{"gpus": 1}})
        loader = pm3.spawn("loader", Where)
        result = loader.load.call({mod!r}).get(timeout=120).values()
    """)
    assert [v for v, _, _ in out] == [1, 1, 1]
    assert [p for _, p, _ in out] == [str(remote / h / "reloaded" / f"{mod}.py") for h in HOSTS]
    (src / f"{mod}.py").write_text("VALUE = 22\n")  # the running procs see it: synced, then reloaded
    out = c.run("""
        deadline = time.monotonic() + 60
        values = [v for v, _, _ in loader.load.call(%r).get(timeout=60).values()]
        while values != [22, 22, 22] and time.monotonic() < deadline:
            time.sleep(0.2)
            values = [v for v, _, _ in loader.load.call(%r).get(timeout=60).values()]
        pm3.stop().get(timeout=60)
        asyncio.run(hm.sync_workspace(Workspace(dirs=[%r])))  # auto_reload=False: the watcher ends
        result = [values, hm._shared["watcher"] is None]
    """ % (mod, mod, str(src)))
    assert out == [[22, 22, 22], True], out
    for h in HOSTS:
        assert (remote / h / "reloaded" / f"{mod}.py").read_text() == "VALUE = 22\n"


def test_sync_workspace_checks_its_arguments(lab: dict[str, Any]) -> None:
    c = lab["client"]
    res = c.request("asyncio.run(hm.sync_workspace(Workspace(dirs=['/nonexistent/dir'])))")
    assert res.get("type") == "FileNotFoundError" and "/nonexistent/dir" in res["message"], res
    res = c.request("asyncio.run(hm.sync_workspace('/some/dir'))")
    assert res.get("type") == "TypeError" and "Workspace(dirs=" in res["message"], res


def test_shutdown_ends_every_worker_and_proc(lab: dict[str, Any]) -> None:
    c, tag = lab["client"], lab["tag"]
    assert set(H.tagged(tag, (1, 2, 3))) == {1, 2, 3}  # workers and procs on all three
    c.run("hm.shutdown().get(timeout=60)")
    H.wait_tagged_gone(tag, (1, 2, 3))
