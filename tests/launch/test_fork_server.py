"""The fork server ("zygote"): procs on this host are forked from a Python
process that has already imported trio and the kernel, instead of each
starting a fresh interpreter.

Real processes throughout.  What a forked proc must look like from the
outside is what an exec'd one looks like (environment, working directory,
exit statuses, supervision messages, no leftovers); what must differ is its
parent (the zygote) and how fast it starts.  Custom commands, start-up
variable overrides and ``MONARCH_FORK_SERVER=0`` keep the exec path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from monarch_core._launch import _fork_server
from monarch_core._launch._bootstrap import PROC_MODULE
from monarch_core.actor import (
    Actor,
    BootstrapCommand,
    ValueMesh,
    default_bootstrap_cmd,
    endpoint,
    this_host,
)
from monarch_core.errors import SupervisionError

from _helpers import client_runtime, poll_until
from _helpers.procs import children_of, parent_of, pid_gone, wait_pids_gone

T = 30.0
pytestmark = pytest.mark.skipif(not _fork_server.enabled() and os.environ.get(_fork_server.OPT_OUT_ENV) is None,
                                reason="no pidfd/SCM_RIGHTS support here")


class Probe(Actor):
    @endpoint
    def info(self) -> dict:
        import random

        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "sid": os.getsid(0),
            "random": random.random(),
            "cwd": os.getcwd(),
            "path": list(sys.path),
            "executable": sys.executable,
            "argv0": sys.argv[0],
        }

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def exit_now(self, code: int) -> None:
        sys.stdout.flush()
        os._exit(code)

    @endpoint
    def ok(self) -> str:
        return "ok"


@pytest.fixture(autouse=True)
def _fork_server_on(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(_fork_server.OPT_OUT_ENV, raising=False)


def _spawn(meshes: list, n: int = 2, **kw):  # type: ignore[no-untyped-def]
    pm = this_host().spawn_procs(per_host={"gpus": n}, **kw)
    meshes.append(pm)
    return pm, pm.spawn("probe", Probe)


def _infos(probe) -> list[dict]:  # type: ignore[no-untyped-def]
    return probe.info.call().get(timeout=T).values()


def _zygote_info() -> dict:
    """Ask the current zygote of this process what it has imported."""
    kernel = client_runtime().kernel

    async def ask() -> dict:
        z = _fork_server.server_of(kernel).start()
        assert z is not None, _fork_server.server_of(kernel).disabled
        return await z.info()

    return kernel.run(ask)


def test_many_concurrent_requests_to_one_zygote_are_all_answered() -> None:
    """Hundreds of procs spawned at once send their fork requests together:
    once the socket's buffer is full, each would wait for it to drain on the
    same fd, which trio refuses (``BusyResourceError``, 96 procs on one host
    failed that way).  Requests now queue for the socket one at a time."""
    import trio

    kernel = client_runtime().kernel

    async def ask_many(n: int) -> list:
        z = _fork_server.server_of(kernel).start()
        assert z is not None, _fork_server.server_of(kernel).disabled
        await z.ready.wait()
        answers: list = []

        async def one() -> None:
            answers.append(await z.info())

        with trio.fail_after(120):
            async with trio.open_nursery() as n_:
                for _ in range(n):
                    n_.start_soon(one)
        return answers

    answers = kernel.run(lambda: ask_many(2000))
    assert len(answers) == 2000 and all(isinstance(a, dict) for a in answers)


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def _kill_all(client: subprocess.Popen, pids: list[int]) -> None:
    """Clean-up after a test that ran a client: the client and ``pids``, if still there."""
    if client.poll() is None:
        client.kill()
        client.wait()
    for q in pids:
        try:
            os.kill(q, signal.SIGKILL)
        except OSError:
            pass


# ---------------------------------------------------------------------- forking


def test_procs_are_forked_from_a_zygote_that_imported_the_kernel_but_not_torch(meshes: list) -> None:
    pytest.importorskip("torch")  # imported here, in the client: the zygote must still not have it
    _pm, probe = _spawn(meshes, 3)
    infos = _infos(probe)
    zpid = infos[0]["ppid"]
    assert zpid != os.getpid()
    assert {i["ppid"] for i in infos} == {zpid}, infos
    assert _cmdline(zpid)[1:3] == ["-m", "monarch_core._launch._zygote"]
    assert parent_of(zpid) == os.getpid()
    # each proc leads its own session, as with start_new_session=True
    assert all(i["sid"] == i["pid"] for i in infos)
    info = _zygote_info()
    assert info["pid"] == zpid
    mods = set(info["modules"])
    for m in ("trio", "monarch_core._kernel._runtime", "monarch_core._proc._agent", "monarch_core._proc._serial",
              "monarch_core._proc._state", "monarch_core._proc._transport", "monarch_core._plugins", "asyncio"):
        assert m in mods, m
    assert "torch" not in mods and not any(m.startswith("torch.") for m in mods)
    assert info["threads"] == 1
    assert {i["pid"] for i in infos} <= set(info["children"])  # (procs of other tests too)


def test_actor_in_a_forked_proc_works_end_to_end(meshes: list) -> None:
    pm, probe = _spawn(meshes, 2)
    out = probe.ok.call().get(timeout=T)
    assert isinstance(out, ValueMesh)
    assert out.values() == ["ok", "ok"]
    assert probe.slice(gpus=1).ok.call_one().get(timeout=T) == "ok"
    pm.initialized.get(timeout=T)


def test_forked_procs_look_like_exec_ones(meshes: list, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # after the zygote started elsewhere
    pm, forked = _spawn(meshes, 2)
    pm.initialized.get(timeout=T)  # procs start on the kernel loop, which reads the environment then
    monkeypatch.setenv(_fork_server.OPT_OUT_ENV, "0")
    _pm2, execd = _spawn(meshes, 1)
    (ref,) = _infos(execd)
    assert ref["ppid"] == os.getpid()
    for i in _infos(forked):
        assert i["ppid"] != os.getpid()
        assert i["cwd"] == ref["cwd"] == str(tmp_path)
        assert i["path"] == ref["path"]
        assert i["executable"] == ref["executable"] == sys.executable
        assert i["argv0"] == ref["argv0"]


def test_two_forked_procs_get_different_random_numbers(meshes: list) -> None:
    _pm, probe = _spawn(meshes, 2)
    a, b = _infos(probe)
    assert a["ppid"] == b["ppid"] != os.getpid()
    assert a["random"] != b["random"]


def test_env_overrides_reach_forked_procs(meshes: list, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MC_FS_INHERITED", "from-client")  # set after the zygote started
    monkeypatch.setenv("MC_FS_REMOVED", "should-not-arrive")
    cmd = default_bootstrap_cmd().with_env(MC_FS_SET="hello world", MC_FS_REMOVED=None)
    _pm, probe = _spawn(meshes, 2, bootstrap_command=cmd)
    assert all(i["ppid"] != os.getpid() for i in _infos(probe))  # forked
    assert probe.env.call("MC_FS_SET").get(timeout=T).values() == ["hello world"] * 2
    assert probe.env.call("MC_FS_INHERITED").get(timeout=T).values() == ["from-client"] * 2
    assert probe.env.call("MC_FS_REMOVED").get(timeout=T).values() == [None, None]
    assert probe.env.call("MONARCH_PROC_BOOTSTRAP").get(timeout=T).values() == [None, None]


def test_a_changed_startup_variable_replaces_the_zygote(meshes: list, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _pm, probe = _spawn(meshes, 1)
    (before,) = _infos(probe)
    monkeypatch.setenv("MONARCH_FS_TEST_KNOB", "1")  # module constants read MONARCH_* at import
    _pm2, probe2 = _spawn(meshes, 1)
    (after,) = _infos(probe2)
    assert after["ppid"] not in (before["ppid"], os.getpid())
    assert probe2.env.call_one("MONARCH_FS_TEST_KNOB").get(timeout=T) == "1"
    # the old zygote still serves its live proc
    assert not pid_gone(before["ppid"]) and not pid_gone(before["pid"])
    meshes.pop(0).stop().get(timeout=T)
    assert wait_pids_gone([before["pid"]], 10.0) == []
    # the old zygote exits once it has no procs left (other tests' procs may still run on it)
    poll_until(lambda: pid_gone(before["ppid"]) or children_of(before["ppid"]), 10,
               what="the replaced zygote's exit after its last proc")


# ---------------------------------------------------------------------- exec path


def test_fork_server_opt_out_uses_exec(meshes: list, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(_fork_server.OPT_OUT_ENV, "0")
    _pm, probe = _spawn(meshes, 2)
    assert [i["ppid"] for i in _infos(probe)] == [os.getpid()] * 2


def test_custom_bootstrap_command_uses_exec(meshes: list) -> None:
    cmd = BootstrapCommand(program=sys.executable, args=("-X", "utf8", "-m", PROC_MODULE))
    _pm, probe = _spawn(meshes, 2, bootstrap_command=cmd)
    assert [i["ppid"] for i in _infos(probe)] == [os.getpid()] * 2


def test_overriding_a_startup_variable_for_a_proc_uses_exec(meshes: list) -> None:
    cmd = default_bootstrap_cmd().with_env(PYTHONHASHSEED="12345")
    _pm, probe = _spawn(meshes, 1, bootstrap_command=cmd)
    assert [i["ppid"] for i in _infos(probe)] == [os.getpid()]


# ---------------------------------------------------------------------- exits and failures


def test_sigkilled_forked_proc_is_reported_killed_by_sigkill(meshes: list, faults) -> None:  # type: ignore[no-untyped-def]
    _pm, probe = _spawn(meshes, 2)
    infos = _infos(probe)
    victim = infos[1]["pid"]
    assert infos[1]["ppid"] != os.getpid()
    os.kill(victim, signal.SIGKILL)
    exc = probe.slice(gpus=1).ok.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, exc
    assert f"(pid {victim}) was killed by SIGKILL" in str(exc)
    faults.wait_text(f"(pid {victim}) was killed by SIGKILL")
    assert probe.slice(gpus=0).ok.call_one().get(timeout=T) == "ok"
    assert wait_pids_gone([victim], 10.0) == []


def test_exit_code_of_a_forked_proc_is_reported(meshes: list, faults) -> None:  # type: ignore[no-untyped-def]
    _pm, probe = _spawn(meshes, 1)
    (info,) = _infos(probe)
    assert info["ppid"] != os.getpid()
    probe.exit_now.broadcast(7)
    exc = probe.ok.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, exc
    assert f"(pid {info['pid']}) exited with code 7" in str(exc)


KILL_ZYGOTE = """
import json, os, sys, time
import monarch_core.actor as monarch
from monarch_core.actor import Actor, endpoint, this_host

faults = []
monarch.unhandled_fault_hook = lambda failure: faults.append(failure.report())  # handled: recorded


class P(Actor):
    @endpoint
    def info(self):
        return {"pid": os.getpid(), "ppid": os.getppid()}

    @endpoint
    def ok(self):
        return "ok"


def spawn():
    return this_host().spawn_procs(per_host={"gpus": 2}).spawn("p", P)


probe = spawn()
print("INFOS " + json.dumps(probe.info.call().get(timeout=30).values()), flush=True)
reason = sys.stdin.readline().strip()  # the test has killed the zygote: what the failures must say
deadline = time.monotonic() + 30
while not any(reason in f for f in faults) and time.monotonic() < deadline:
    time.sleep(0.02)  # polling the recorded faults with a deadline
exc = probe.ok.call().exception(timeout=30)
probe2 = spawn()
print("RESULT " + json.dumps({"faults": faults, "exc_type": type(exc).__name__, "exc": str(exc),
                              "infos2": probe2.info.call().get(timeout=30).values(),
                              "ok2": probe2.ok.call().get(timeout=30).values()}), flush=True)
"""


def test_killing_the_zygote_fails_its_procs_and_the_next_spawn_gets_a_new_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """In a client of its own: the zygote killed here must not be the one this
    test process shares with the other tests of its xdist worker (their
    module- and session-scoped procs were forked from it)."""
    script = tmp_path / "kill_zygote.py"
    script.write_text(textwrap.dedent(KILL_ZYGOTE))
    env = {k: v for k, v in os.environ.items() if k != _fork_server.OPT_OUT_ENV}
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("INFOS "), line + p.stderr.read()[-3000:]  # type: ignore[union-attr]
        infos = json.loads(line[len("INFOS "):])
        zpid = infos[0]["ppid"]
        assert zpid != p.pid and {i["ppid"] for i in infos} == {zpid}
        os.kill(zpid, signal.SIGKILL)
        # its procs die of their parent-death signal a moment later
        reason = f"was killed by SIGKILL (the fork server that started it (pid {zpid}) was killed by SIGKILL"
        out, err = p.communicate(reason + "\n", timeout=120)
        assert p.returncode == 0, err[-3000:]
        res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
        assert any(reason in f for f in res["faults"]), res["faults"]
        assert res["exc_type"] == "SupervisionError", res
        assert reason in res["exc"], res["exc"]
        assert wait_pids_gone([i["pid"] for i in infos] + [zpid], 10.0) == []
        infos2 = res["infos2"]
        assert {i["ppid"] for i in infos2} - {zpid, p.pid} == {infos2[0]["ppid"]}
        assert res["ok2"] == ["ok", "ok"]
    finally:
        _kill_all(p, [])  # its zygote, if alive, dies with it (parent-death signal); the killed one is gone


def test_stopped_forked_procs_are_gone_and_reaped(meshes: list) -> None:
    pm, probe = _spawn(meshes, 2)
    pids = [i["pid"] for i in _infos(probe)]
    pm.stop().get(timeout=T)
    meshes.remove(pm)
    for p in pids:  # reaped by the zygote before the stop is reported
        assert not os.path.exists(f"/proc/{p}"), p


CLIENT = """
import json, os, sys
from monarch_core.actor import Actor, endpoint, this_host

class P(Actor):
    @endpoint
    def ids(self):
        return os.getpid(), os.getppid()

pm = this_host().spawn_procs(per_host={"gpus": 2})
ids = pm.spawn("p", P).ids.call().get(timeout=60).values()
print("IDS " + json.dumps(ids), flush=True)
if sys.argv[1] == "stop":
    pm.stop().get(timeout=30)
    print("STOPPED", flush=True)
elif sys.argv[1] == "hang":
    import threading
    threading.Event().wait(60)
"""


@pytest.mark.parametrize("mode", ["stop", "exit", "sigkill"])
def test_no_zygote_or_proc_is_left_behind(tmp_path, mode: str) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(CLIENT))
    env = {k: v for k, v in os.environ.items() if k != _fork_server.OPT_OUT_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    p = subprocess.Popen([sys.executable, str(script), "hang" if mode == "sigkill" else mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
    pids: list[int] = []
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("IDS "), (line, p.stderr.read() if p.poll() is not None else "")  # type: ignore[union-attr]
        ids = json.loads(line[4:])
        pids = sorted({x for pair in ids for x in pair})
        zpid = ids[0][1]
        assert zpid != p.pid and parent_of(zpid) == p.pid
        if mode == "sigkill":
            p.kill()
        _out, err = p.communicate(timeout=60)
        if mode != "sigkill":
            assert p.returncode == 0, err[-3000:]
        assert wait_pids_gone(pids, 10.0) == [], f"left behind after the client ended ({mode})"
    finally:
        _kill_all(p, pids)


EARLY = """
import os, sys
from monarch_core.actor import this_host
this_host()
print("PID", os.getpid(), flush=True)
sys.stdin.readline()
"""


def test_this_host_starts_the_zygote_before_any_spawn_and_exit_stops_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent(EARLY))
    env = {k: v for k, v in os.environ.items() if k != _fork_server.OPT_OUT_ENV}
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    zygotes: list[int] = []
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("PID "), line
        deadline = time.monotonic() + 10
        while not zygotes:
            zygotes = [c for c in children_of(p.pid) if "monarch_core._launch._zygote" in _cmdline(c)]
            assert time.monotonic() < deadline, "this_host() started no fork server"
            time.sleep(0.02)  # polling /proc with a deadline
        assert len(zygotes) == 1
        _out, err = p.communicate("\n", timeout=60)
        assert p.returncode == 0, err[-3000:]
        assert wait_pids_gone(zygotes, 10.0) == []
    finally:
        _kill_all(p, zygotes)


THREADED = """
import json, logging, os
from monarch_core.actor import Actor, endpoint, this_host

# the fork server's whole path (started, adopted, broken, exec instead) in stderr, for a failure's message
logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)6.0f %(name)s %(levelname)s %(message)s")
logging.getLogger("monarch.proc").setLevel(logging.DEBUG)

class P(Actor):
    @endpoint
    def ppid(self):
        return os.getppid()

pm = this_host().spawn_procs(per_host={"gpus": 2})
print("PPIDS " + json.dumps(pm.spawn("p", P).ppid.call().get(timeout=60).values()), flush=True)
print("CLIENT " + str(os.getpid()), flush=True)
"""


def test_a_zygote_with_threads_refuses_to_fork_and_procs_are_execd(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Something imported at start-up (here a sitecustomize) starts a thread:
    forking would be unsafe, so the zygote says why and the procs are exec'd."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
    )
    script = tmp_path / "threaded.py"
    script.write_text(textwrap.dedent(THREADED))
    env = {k: v for k, v in os.environ.items() if k != _fork_server.OPT_OUT_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                       cwd=str(tmp_path), check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert json.loads(lines["PPIDS"]) == [int(lines["CLIENT"])] * 2, r.stderr[-3000:]
    assert "cannot fork procs: it has 2 threads after its imports" in r.stderr, r.stderr[-3000:]
    assert "starting procs with exec" in r.stderr, r.stderr[-3000:]
