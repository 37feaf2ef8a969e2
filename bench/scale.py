"""What many procs on one host, and many actors in one proc mesh, cost (monarch-core only).

    python bench/scale.py                          # procs N = 4,16,64,128,256; actors M = 1000,5000,10000,20000
    python bench/scale.py --procs 4,16 --actors 1000,5000 --md scale.md
    python bench/scale.py --procs '' --actors '' --hosts 16,64,256   # worker loops over tls only
    python bench/scale.py --procs 32,64,128,256 --actors 1000,5000 --hosts '' --ssh-hosts '' \
        --reference-python /path/to/torchmonarch-venv/bin/python     # side by side with torchmonarch

Each measurement runs in a fresh client process (its own fork server and
procs), so one size's leftovers or memory do not leak into the next.

Procs axis: ``this_host().spawn_procs(per_host={"p": N})`` with one actor per
proc: *spawn + first call* (``spawn_procs`` until the actor mesh's first
``call()`` returned every rank), *call()* (a second ``call()`` to all N),
*stop* (``ProcMesh.stop()``), *left* (proc pids still running 15 s after stop).

Actors axis: one proc mesh of 8 procs (a probe actor on each first, for their
pids) and M actors as M/8 actor meshes of 8:
*spawn rate* (actors per second, spawn of every mesh until each answered its
first ``call()``), *call-all* (one more ``call()`` on every mesh, all issued
before any is awaited), *stop*, *client RSS per actor* (the client's RSS
growth from before the spawns to after the calls, divided by M), *left*.  After the
actors table, each M's spawn rate against its bare-Python floor
(``floors.spawn_actors``: the same M actors on 8 processes, a thread each,
one call each), measured in the same run.

Side by side (``--reference-python PYTHON``, an interpreter with torchmonarch
installed): the procs and actors axes run each size once more, right after
ours, with the same script on torchmonarch's public API (``monarch.actor``),
and each column becomes three: ours, torchmonarch's, and ours ÷ torchmonarch
saying which is better.  A size that fails on either side (its error, a
client that died, a timeout) is a ``failed: <first line>`` cell; the run goes
on.  Every process a client started is killed once it ends (torchmonarch's
procs sit in process groups of their own), and a client is given up when the
machine's available memory falls under ``MEM_FLOOR_MIB``.

Hosts axis (``--hosts``): N worker loops on this machine, each a "host"
started by address the way a user starts them on machines they own
(``python -m monarch_core.worker --address tls://127.0.0.1:0 --ca --key``,
one process group each, mutual TLS from a throwaway ``trustme`` CA), and a
fresh client that attaches to all of them (``attach_to_workers``) with one
proc per host and one actor per proc: *workers up* (the N worker loops
started until every one printed its readiness line; the user's side),
*attach* (``attach_to_workers`` until every worker loop answered),
*spawn + first call*, ``call()`` *p50/p99* and the client's CPU per
``call()`` (``time.process_time()``, all its threads, over ``--rounds``
sequential calls; *less idle background*: minus the idle rate below times
the call's p50, the heartbeats' share; *to 16 of them*: the same calls to a
16-host slice while all N run, the machine's load at a fixed call size),
*idle CPU* (the client's CPU over ``--idle`` s, default 20, of doing
nothing while it heartbeats and supervises N hosts, as a share of one core:
``time.process_time()`` and /proc/self/stat's utime+stime, per thread too;
in a table of its own next to the floor, the same client with its runtime
started and no host attached; ``--idle-profile DIR`` also writes a cProfile
of the client's kernel thread over that window), *PSS per host* (worker loop,
fork server and proc, summed, over N), *host lost* (the last
worker loop SIGKILLed during a 3 s ``call()`` to all: seconds until that
call raised, and whether the message names the host), *rest* (a ``call()``
to the other N-1 hosts afterwards), *stop* (``ProcMesh.stop()`` and
``HostMesh.shutdown()``), *left* (worker loops, their fork servers and
procs still running 15 s after the client ended).  The client runs with
``MONARCH_CAST_TREE_MIN=--tree-min`` (default 8) so that every size goes
through the cast tree, whose point is that the client's work per cast does
not grow with N.

SSH axis (``--ssh-hosts``, only when the testbed's namespace hosts run
sshd: ``scripts/testbed/ssh-up.sh``): ``hosts_from_config`` over the ``ssh``
scheduler to N namespace hosts h8..h(7+N) (h1..h7 are the test suite's),
one proc each: *bring-up* (until every worker loop answered), *spawn +
first call*, ``call()`` p50/p99 and client CPU (the default cast-tree
threshold: direct sends), *stop*, *left* (processes of the run still on
the hosts).  The run makes the namespaces and sshd it needs
(``netns-up.sh``, ``ssh-up.sh``), registered as a user of the testbed like
the test suite, and removes what it made.

The last row of each table is the growth exponent: the log-log slope of each
column between the smallest and largest N (1 = linear; for a rate, 0 = constant).
Nothing here is asserted: these are figures for docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _table as T  # noqa: E402
import floors  # noqa: E402 - the bare-Python floor of the actors axis

#: the procs and actors axes' scripts use only the public API that monarch-core and torchmonarch
#: share (``monarch_core.actor`` here; ``--reference-python`` runs them with ``monarch.actor``), so
#: the same lines measure both.  A failure prints ``ERROR <its first line>`` and ends the client.
PROCS = textwrap.dedent("""
    import json, os, sys, time
    from monarch_core.actor import Actor, endpoint, this_host

    class A(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    def main() -> None:
        n = int(sys.argv[1])
        t0 = time.perf_counter()
        pm = this_host().spawn_procs(per_host={"p": n})
        a = pm.spawn("a", A)
        pids = list(a.pid.call().get(timeout=600).values())
        t1 = time.perf_counter()
        a.pid.call().get(timeout=600)
        t2 = time.perf_counter()
        pm.stop().get(timeout=600)
        t3 = time.perf_counter()
        end = time.monotonic() + 15
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < end:
            time.sleep(0.05)
        left = sum(os.path.exists(f"/proc/{p}") for p in pids)
        print("RESULT " + json.dumps({"n": n, "up_s": t1 - t0, "call_s": t2 - t1, "stop_s": t3 - t2,
                                      "distinct": len(set(pids)), "left": left}), flush=True)

    try:
        main()
    except BaseException as e:
        print("ERROR " + json.dumps((f"{type(e).__name__}: {e}".strip().splitlines() or ["?"])[0]), flush=True)
        os._exit(1)
""")

ACTORS = textwrap.dedent("""
    import json, os, sys, time
    from monarch_core.actor import Actor, endpoint, this_host

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    class A(Actor):
        @endpoint
        def ping(self) -> int:
            return 1

        @endpoint
        def pid(self) -> int:
            return os.getpid()

    def main() -> None:
        m = int(sys.argv[1])
        pm = this_host().spawn_procs(per_host={"p": 8})
        pids = list(pm.spawn("probe", A).pid.call().get(timeout=600).values())  # the 8 procs are up
        r0 = rss()
        t0 = time.perf_counter()
        meshes = [pm.spawn(f"m{i}", A) for i in range(m // 8)]
        got = sum(sum(f.get(timeout=600).values()) for f in [x.ping.call() for x in meshes])
        t1 = time.perf_counter()
        got2 = sum(sum(f.get(timeout=600).values()) for f in [x.ping.call() for x in meshes])
        t2 = time.perf_counter()
        r1 = rss()
        pm.stop().get(timeout=600)
        t3 = time.perf_counter()
        end = time.monotonic() + 15
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < end:
            time.sleep(0.05)
        left = sum(os.path.exists(f"/proc/{p}") for p in pids)
        assert got == got2 == m // 8 * 8, (got, got2)
        print("RESULT " + json.dumps({"m": got, "rate": got / (t1 - t0), "up_s": t1 - t0, "call_s": t2 - t1,
                                      "stop_s": t3 - t2, "rss_per_actor_kib": (r1 - r0) / got / 1024,
                                      "left": left}), flush=True)

    try:
        main()
    except BaseException as e:
        print("ERROR " + json.dumps((f"{type(e).__name__}: {e}".strip().splitlines() or ["?"])[0]), flush=True)
        os._exit(1)
""")


def for_reference(code: str) -> str:
    """``code`` (a procs or actors script) for torchmonarch: its ``monarch.actor`` instead of ours."""
    assert "from monarch_core.actor import " in code
    return code.replace("from monarch_core.actor import ", "from monarch.actor import ")


HOSTS = textwrap.dedent("""
    import json, os, resource, signal, statistics, sys, threading, time

    cfg = json.load(open(sys.argv[1]))

    import monarch_core.actor as api
    from monarch_core.actor import Actor, enable_transport, endpoint
    from monarch_core.worker import attach_to_workers

    TICK = os.sysconf("SC_CLK_TCK")

    def stat_cpu(path="/proc/self/stat"):
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime, s

    def thread_cpu():
        names = {t.native_id: t.name for t in threading.enumerate()}
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    comm = f.read().strip()
                out[f"{names.get(int(tid), comm)} (tid {tid})"] = stat_cpu(f"/proc/self/task/{tid}/stat")
            except OSError:
                pass
        return out

    def idle_window(seconds):
        # the client's CPU over `seconds` of doing nothing, as shares of one core; with cfg["profile"],
        # a cProfile of its kernel thread (where the heartbeats run) over the window, started and ended
        # on that thread (cProfile profiles the thread that enables it)
        prof, on_loop = None, None
        if cfg.get("profile"):
            import cProfile
            from monarch_core._proc import _state
            prof, on_loop = cProfile.Profile(), _state.current().kernel.call_soon
            started = threading.Event()
            on_loop(lambda: (prof.enable(), started.set()))
            started.wait(60)
        r0, c0, s0, th0, w0 = (resource.getrusage(resource.RUSAGE_SELF), time.process_time(), stat_cpu(),
                               thread_cpu(), time.perf_counter())
        time.sleep(seconds)
        w = time.perf_counter() - w0
        c1, s1, th1, r1 = time.process_time(), stat_cpu(), thread_cpu(), resource.getrusage(resource.RUSAGE_SELF)
        if prof is not None and on_loop is not None:
            import io, pstats
            ended = threading.Event()
            on_loop(lambda: (prof.disable(), ended.set()))
            ended.wait(60)
            with open(cfg["profile"], "w") as f:
                try:  # (a private table, read for this diagnostic only: one watchdog task per session)
                    sessions = list(_state.current().kernel._sender.sessions.values())
                    f.write(f"outbound sessions of the client: {len(sessions)} "
                            f"({sum(o.failed is None for o in sessions)} not failed)\\n")
                except Exception as e:
                    f.write(f"outbound sessions of the client: unknown ({e!r})\\n")
                for key in ("tottime", "cumulative"):
                    buf = io.StringIO()
                    pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
                    f.write(f"===== the kernel thread, idle window {w:.1f}s, {len(cfg['addresses'])} hosts, "
                            f"by {key}\\n{buf.getvalue()}\\n")
        return {"idle_cpu": (c1 - c0) / w, "idle_stat_cpu": (s1 - s0) / w, "idle_s": w,
                "idle_rusage_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                "idle_threads": {k: round((v - th0.get(k, 0.0)) / w, 5) for k, v in th1.items()
                                 if v - th0.get(k, 0.0) > 0}}

    if not cfg["addresses"]:  # the floor: the same client, its runtime started, no host attached
        os.environ.update(MONARCH_TLS_CA=cfg["ca"], MONARCH_TLS_KEY=cfg["key"])  # (attach's ca=/private_key=)
        enable_transport("tls://127.0.0.1:0")
        api.context()
        time.sleep(1.0)
        print("RESULT " + json.dumps({"n": 0, **idle_window(cfg["idle"])}), flush=True)
        sys.exit(0)

    faults = []
    api.unhandled_fault_hook = faults.append  # the lost host's proc: expected, counted

    class A(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def slow(self, s: float) -> int:
            time.sleep(s)
            return os.getpid()

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]

    n, rounds = len(cfg["addresses"]), cfg["rounds"]
    enable_transport("tls://127.0.0.1:0")
    t0 = time.perf_counter()
    hm = attach_to_workers(cfg["addresses"], ca=cfg["ca"], private_key=cfg["key"], timeout=600)
    t1 = time.perf_counter()
    pm = hm.spawn_procs(per_host={"gpus": 1})
    a = pm.spawn("a", A)
    pids = list(a.pid.call().get(timeout=600).values())
    t2 = time.perf_counter()
    print("SPAWNED " + json.dumps(pids), flush=True)
    sys.stdin.readline()  # the driver measures the hosts' memory meanwhile
    for _ in range(5):
        a.pid.call().get(timeout=600)
    walls, cpus = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        got = a.pid.call().get(timeout=600)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        assert len(got.values()) == n
    # the same calls to 16 of the hosts, with all N up: what the machine's load (N hosts on its
    # cores) does to a call() whose size does not change
    few = a.slice(hosts=slice(0, min(16, n)))
    cpus16 = []
    for _ in range(rounds):
        c0 = time.process_time()
        few.pid.call().get(timeout=600)
        cpus16.append(time.process_time() - c0)
    idle = idle_window(cfg["idle"])  # N hosts attached, heartbeated and supervised; nothing asked of them
    # a host lost mid-call: the last worker loop is SIGKILLed while a 3 s call() to all runs
    victim = cfg["pids"][-1]
    fut = a.slow.call(3.0)
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    k0 = time.perf_counter()
    try:
        fut.get(timeout=120)
        lost_msg, lost_s = None, None
    except Exception as e:
        lost_msg, lost_s = f"{type(e).__name__}: {e}", time.perf_counter() - k0 - 1.0
    rest = a.slice(hosts=slice(0, n - 1))
    rest_pids = list(rest.pid.call().get(timeout=600).values())
    t3 = time.perf_counter()
    pm.stop().get(timeout=600)
    hm.shutdown().get(timeout=600)
    t4 = time.perf_counter()
    print("RESULT " + json.dumps({
        "n": n, "attach_s": t1 - t0, "up_s": t2 - t1, "p50_ms": statistics.median(walls) * 1e3,
        "p99_ms": pct(walls, 99) * 1e3, "cpu_ms": statistics.median(cpus) * 1e3,
        "cpu16_ms": statistics.median(cpus16) * 1e3, **idle,
        "lost_s": lost_s, "lost_msg": lost_msg, "faults": len(faults), "rest": len(rest_pids),
        "stop_s": t4 - t3, "distinct": len(set(pids))}), flush=True)
""")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pss_kib(pid: int) -> int:
    """``pid``'s proportional set size (KiB; 0 once gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("Pss:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:")) / 1024


#: the hosts axis gives up (killing its worker loops and client) below this much available memory:
#: the machine is shared, and an out-of-memory kill would hit someone else's processes too
MEM_FLOOR_MIB = 1500


def _pki(d: str) -> dict[str, str]:
    """A throwaway CA with a worker and a client identity (``trustme``) in ``d``."""
    import trustme

    ca = trustme.CA(organization_name="monarch scale bench")
    paths = {"ca": os.path.join(d, "ca.pem")}
    with open(paths["ca"], "wb") as f:
        f.write(ca.cert_pem.bytes())
    for name in ("worker", "client"):
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        paths[name] = os.path.join(d, f"{name}.pem")
        fd = os.open(paths[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(leaf.private_key_pem.bytes() + b"".join(b.bytes() for b in leaf.cert_chain_pems))
    return paths


def run_hosts(n: int, rounds: int, tree_min: int, timeout: float, idle: float = 20.0,
              profile: str | None = None) -> dict[str, Any]:
    """N tls worker loops started here, then the ``HOSTS`` client against them;
    its RESULT plus *workers up* and *left*, or ``{"error": ...}``.  Every
    worker loop's process group is killed at the end, whatever happened.
    ``n == 0``: the floor, the same client with its runtime started and no
    host attached, measured over the same idle window (``idle`` s) only.
    ``profile``: a file the client writes its kernel thread's cProfile of the idle
    window to."""
    import signal
    import tempfile
    import time

    d = tempfile.mkdtemp(prefix="monarch-scale-hosts-")
    pki = _pki(d)
    env = {**os.environ, "MONARCH_LOG_LEVEL": "ERROR"}
    workers: list[subprocess.Popen] = []
    tracked: set[int] = set()
    short: list[float] = []
    done = threading.Event()

    def guard() -> None:  # kill everything of this size when memory runs short
        while not done.wait(0.5):
            if _mem_available_mib() < MEM_FLOOR_MIB:
                short.append(_mem_available_mib())
                for w in list(workers):
                    try:
                        os.killpg(w.pid, signal.SIGKILL)
                    except OSError:
                        pass
                return

    threading.Thread(target=guard, daemon=True).start()
    try:
        t0 = time.perf_counter()
        for i in range(n):  # output to a file each: nobody has to drain a pipe
            with open(os.path.join(d, f"worker{i}.out"), "w") as out:
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "monarch_core.worker", "--address", "tls://127.0.0.1:0", "--ca",
                     pki["ca"], "--key", pki["worker"], "--log-level", "ERROR"],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True))
        addresses: list[str | None] = [None] * n
        deadline = time.monotonic() + timeout
        while None in addresses:  # the readiness line of each
            for i, w in enumerate(workers):
                if addresses[i] is None:
                    with open(os.path.join(d, f"worker{i}.out")) as f:
                        ready = [ln for ln in f if ln.startswith("monarch worker loop listening on ")]
                    if ready:
                        addresses[i] = ready[0].rsplit(" ", 1)[1].strip()
                    elif short:
                        return {"n": n, "error": f"less than {MEM_FLOOR_MIB} MiB available while the worker loops "
                                                 f"started ({len(workers)} started): given up"}
                    elif w.poll() is not None or time.monotonic() > deadline:
                        with open(os.path.join(d, f"worker{i}.out")) as f:
                            return {"n": n, "error": f"worker loop {w.pid} did not start (rc {w.returncode}): "
                                                     f"{f.read()[-500:]!r}"}
            time.sleep(0.2)
        workers_s = time.perf_counter() - t0
        for w in workers:
            tracked.update(_tree(w.pid))
        cfg = os.path.join(d, "hosts.json")
        with open(cfg, "w") as f:
            json.dump({"addresses": addresses, "pids": [w.pid for w in workers], "ca": pki["ca"],
                       "key": pki["client"], "rounds": rounds, "idle": idle, "profile": profile}, f)
        with open(os.path.join(d, "client.err"), "w") as err:
            p = subprocess.Popen([sys.executable, "-c", HOSTS, cfg], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=err, text=True, env={**env, "MONARCH_CAST_TREE_MIN": str(tree_min)})
        timer = threading.Timer(timeout, p.kill)
        timer.start()
        try:
            assert p.stdin is not None and p.stdout is not None
            lines = []
            for line in p.stdout:
                lines.append(line)
                if line.startswith("SPAWNED "):  # every host holds one proc now: the memory of a host
                    procs = json.loads(line[len("SPAWNED "):])
                    tracked.update(procs)
                    pss = {q: _pss_kib(q) for q in tracked}
                    p.stdin.write("\n")
                    p.stdin.flush()
            p.wait()
        finally:
            timer.cancel()
        res = next((json.loads(ln[len("RESULT "):]) for ln in lines if ln.startswith("RESULT ")), None)
        if short:
            return {"n": n, "error": f"less than {MEM_FLOOR_MIB} MiB available: given up (worker loops killed)"}
        if res is None:
            return {"n": n, "error": f"rc={p.returncode} (its stderr: {d}/client.err)"}
        if n == 0:
            return res
        res["host_pss_mib"] = sum(pss.values()) / 1024 / n  # worker loop + fork server + proc
        # the heartbeats' share of a call()'s CPU: what the client spends idle, over the call's duration
        res["cpu_net_ms"] = res["cpu_ms"] - res["idle_cpu"] * res["p50_ms"]
        end = time.monotonic() + 15
        while any(_running(q) for q in tracked) and time.monotonic() < end:
            time.sleep(0.1)
        res.update(workers_s=workers_s, left=sum(_running(q) for q in tracked), tracked=len(tracked))
        return res
    finally:
        done.set()
        for w in workers:
            try:
                os.killpg(w.pid, signal.SIGKILL)  # (what is still running: a clean stop left nothing)
            except OSError:
                pass
            w.wait(timeout=30)


SSH = textwrap.dedent("""
    import json, os, statistics, sys, time
    from monarch_core.actor import Actor, endpoint, hosts_from_config

    class A(Actor):
        @endpoint
        def where(self) -> list:
            import socket
            return [socket.gethostname(), os.getpid()]

    rounds = int(sys.argv[1])
    t0 = time.perf_counter()
    hm = hosts_from_config("scale", timeout=600)
    t1 = time.perf_counter()
    pm = hm.spawn_procs(per_host={"gpus": 1})
    a = pm.spawn("a", A)
    first = list(a.where.call().get(timeout=600).values())
    t2 = time.perf_counter()
    for _ in range(5):
        a.where.call().get(timeout=600)
    walls, cpus = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        a.where.call().get(timeout=600)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    t3 = time.perf_counter()
    pm.stop().get(timeout=600)
    hm.shutdown().get(timeout=600)
    t4 = time.perf_counter()
    walls.sort()
    print("RESULT " + json.dumps({
        "bringup_s": t1 - t0, "up_s": t2 - t1, "p50_ms": statistics.median(walls) * 1e3,
        "p99_ms": walls[min(len(walls) - 1, round(0.99 * (len(walls) - 1)))] * 1e3,
        "cpu_ms": statistics.median(cpus) * 1e3, "stop_s": t4 - t3,
        "hosts_seen": sorted({h for h, _ in first}), "procs": len(first)}), flush=True)
""")

#: the SSH axis's hosts start at this testbed index: h1..h7 belong to the test suite (which cuts
#: links and kills processes there), so a run beside it uses hosts of its own
SSH_FIRST = 8


def _testbed(script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", os.path.join(REPO, "scripts", "testbed", script), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def ssh_unavailable() -> str | None:
    """Why the SSH axis cannot run here (``None``: it can)."""
    import shutil

    if os.geteuid() != 0:
        return "not root (the testbed's network namespaces need it)"
    if shutil.which("ip") is None:
        return "no iproute2"
    if not os.path.exists("/usr/sbin/sshd"):
        return "no OpenSSH server (scripts/testbed/install.sh)"
    try:
        import paramiko  # noqa: F401
        import monarch_scheduler_ssh  # noqa: F401
    except ImportError as e:
        return f"the ssh scheduler is not installed ({e})"
    return None


def run_ssh(sizes: list[int], rounds: int, timeout: float) -> list[dict[str, Any]]:
    """The SSH axis: namespace hosts h8.. with sshd (made here, and removed
    at the end if this run made them), one fresh client per size."""
    import fcntl
    import time
    import uuid

    import scale_hosts as SH  # the SSH bench's helpers: processes on the hosts, the testbed's files

    top = SSH_FIRST + max(sizes) - 1
    state_file, lock_file = SH.RT / "netns-users.json", SH.RT / "netns-users.lock"
    SH.RT.mkdir(parents=True, exist_ok=True)

    def users(update: Any) -> None:  # the test suite's shared-state protocol (tests/_helpers/testbed.py)
        with open(lock_file, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(state_file.read_text())
            except (OSError, ValueError):
                state = {}
            state["users"] = [p for p in state.get("users", []) if _running(p)]
            update(state)
            state_file.write_text(json.dumps(state))

    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    sshd_before = {f.name[:-4] for f in (SH.RT / "pids").glob("sshd-*.pid")} if (SH.RT / "pids").exists() else set()
    users(lambda s: s["users"].append(os.getpid()))
    rows: list[dict[str, Any]] = []
    mine = [i for i in range(SSH_FIRST, top + 1) if f"rt-h{i}" not in before]
    try:
        t0 = time.perf_counter()
        up = _testbed("netns-up.sh", str(top))
        if up.returncode != 0:
            return [{"n": n, "error": f"netns-up.sh {top} failed: {up.stderr[-300:]}"} for n in sizes]
        t1 = time.perf_counter()
        ssh = _testbed("ssh-up.sh", str(top))
        if ssh.returncode != 0:
            return [{"n": n, "error": f"ssh-up.sh {top} failed: {ssh.stderr[-300:]}"} for n in sizes]
        made = {"netns_s": t1 - t0, "sshd_s": time.perf_counter() - t1, "made": len(mine)}
        print(f"[scale] testbed: {top} namespace hosts and sshd up ({made})", file=sys.stderr, flush=True)
        for n in sizes:
            idx = list(range(SSH_FIRST, SSH_FIRST + n))
            tag = uuid.uuid4().hex[:12]
            d = Path(tempfile.mkdtemp(prefix="monarch-scale-ssh-"))
            text = (SH.RT / "ssh" / "ssh_config").read_text().replace("Host *\n", f"Host *\n  SetEnv RT_TAG={tag}\n", 1)
            (d / "ssh_config").write_text(text)
            (d / "monarch.toml").write_text(
                f'[hosts.scale]\nscheduler = "ssh"\nhosts = {json.dumps([f"h{i}" for i in idx])}\n'
                f'ssh_config = "{d / "ssh_config"}"\nconnect_timeout = 10\nenv = {{ PYTHONPATH = "{SH.CODE}" }}\n')
            env = {**os.environ, "MONARCH_CONFIG": str(d / "monarch.toml"), "PYTHONPATH": SH.CLIENT_CODE}
            try:
                p = subprocess.run([sys.executable, "-c", SSH, str(rounds)], capture_output=True, text=True,
                                   timeout=timeout, env=env)
                res = next((json.loads(ln[len("RESULT "):]) for ln in p.stdout.splitlines()
                            if ln.startswith("RESULT ")), None)
                r = res if res is not None else {"error": f"rc={p.returncode}: {p.stderr.strip()[-300:]}"}
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {timeout:.0f}s"}
            t = time.monotonic()
            left: dict[int, list[int]] = {}
            while time.monotonic() - t < 30:
                left = {i: ps for i in idx for ps in [_tagged(tag, i)] if ps}
                if not left:
                    break
                time.sleep(0.2)
            for ps in left.values():
                for q in ps:
                    try:
                        os.kill(q, 9)
                    except OSError:
                        pass
            r.update(n=n, left=sum(len(v) for v in left.values()), **made)
            print(f"[scale] ssh hosts {n}: {r}", file=sys.stderr, flush=True)
            rows.append(r)
        return rows
    finally:
        # what this run made goes: the sshd it started (by saved PID), then its namespaces
        started = {f.name[:-4] for f in (SH.RT / "pids").glob("sshd-*.pid")} - sshd_before
        if started:
            subprocess.run(["bash", "-c", f'source "{REPO}/scripts/testbed/lib.sh"; stop_pid {" ".join(sorted(started))}'],
                           capture_output=True, timeout=120, check=False)
        if mine:
            for i in mine:
                for q in SH._ns_pids(i):
                    try:
                        os.kill(q, 9)
                    except OSError:
                        pass
                subprocess.run(["ip", "netns", "del", f"rt-h{i}"], capture_output=True, check=False)
                subprocess.run(["ip", "link", "del", f"rtv{i}"], capture_output=True, check=False)
                shutil_rmtree(f"/etc/netns/rt-h{i}")
            still = [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                 text=True).stdout.split() if ns.startswith("rt-h")]
            if still:  # the names of the hosts that remain (netns-up.sh rewrites the /etc/hosts block)
                _testbed("netns-up.sh", str(max(int(ns[4:]) for ns in still)))
            else:
                _testbed("netns-down.sh")
        users(lambda s: s.__setitem__("users", [q for q in s["users"] if q != os.getpid()]))


def shutil_rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _tagged(tag: str, i: int) -> list[int]:
    """Live processes of namespace host ``i`` carrying ``RT_TAG=<tag>``."""
    import scale_hosts as SH

    needle = b"\\0RT_TAG=" + tag.encode() + b"\\0"
    out = []
    for q in SH._ns_pids(i):
        try:
            with open(f"/proc/{q}/environ", "rb") as f:
                if needle in b"\\0" + f.read() + b"\\0" and _running(q):
                    out.append(q)
        except OSError:
            pass
    return out


def ssh_table(rows: list[dict[str, Any]]) -> str:
    headers = ["SSH hosts N", "bring-up (hosts_from_config), s", "spawn + first call, s", "call() p50, ms",
               "call() p99, ms", "client CPU per call(), ms", "stop, s", "left after stop"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([str(r["n"]), f"FAILED: {r['error']}"] + [T.DASH] * (len(headers) - 2))
            continue
        body.append([str(r["n"]), T.fmt(r["bringup_s"], "{:.2f}"), T.fmt(r["up_s"], "{:.2f}"),
                     T.fmt(r["p50_ms"], "{:.1f}"), T.fmt(r["p99_ms"], "{:.1f}"), T.fmt(r["cpu_ms"], "{:.2f}"),
                     T.fmt(r["stop_s"], "{:.2f}"), str(r["left"])])
    body.append(["growth exponent", slope(rows, "bringup_s", "n"), slope(rows, "up_s", "n"), slope(rows, "p50_ms", "n"),
                 slope(rows, "p99_ms", "n"), slope(rows, "cpu_ms", "n"), slope(rows, "stop_s", "n"), T.DASH])
    return T.markdown(headers, body)


def run(code: str, arg: int, timeout: float, python: str | None = None) -> dict[str, Any]:
    """``code`` in a fresh client (``python``, default this interpreter) with
    ``arg``; its RESULT, or ``{"error": <one line>}`` (its ``ERROR`` line, a
    timeout, a client that died, memory running short).  Never raises for
    the client's sake: every process the client started (found from /proc
    each second, since torchmonarch's procs sit in process groups of their
    own) is SIGKILLed at the end if it still runs, and at once when less
    than ``MEM_FLOOR_MIB`` is available."""
    import signal
    import time

    d = tempfile.mkdtemp(prefix="monarch-scale-run-")
    tracked: set[int] = set()
    short: list[float] = []
    done = threading.Event()

    def kill_all() -> None:
        for q in sorted(tracked):
            if _running(q):
                try:
                    os.kill(q, signal.SIGKILL)
                except OSError:
                    pass

    # files, not pipes: nobody has to drain them, and a process the client leaves behind holding
    # them cannot keep the wait for its end open; cwd a directory of its own, so that no ``monarch``
    # folder of ours shadows the reference's
    with open(os.path.join(d, "stdout"), "w") as out, open(os.path.join(d, "stderr"), "w") as err:
        p = subprocess.Popen([python or sys.executable, "-c", code, str(arg)], stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, cwd=d, start_new_session=True)

    def guard() -> None:
        while not done.wait(1.0):
            tracked.update(_tree(p.pid))
            if _mem_available_mib() < MEM_FLOOR_MIB:
                short.append(_mem_available_mib())
                kill_all()
                return

    threading.Thread(target=guard, daemon=True).start()
    try:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tracked.update(_tree(p.pid))
            kill_all()
            p.kill()
            p.wait(timeout=60)
            shutil_rmtree(d)
            return {"error": f"timed out after {timeout:.0f}s"}
    finally:
        done.set()
        time.sleep(0.2)
        kill_all()  # (what the client left running: its own "left" counted it already)
    if short:
        shutil_rmtree(d)
        return {"error": f"less than {MEM_FLOOR_MIB} MiB available ({min(short):.0f}): given up, its processes killed"}
    with open(os.path.join(d, "stdout")) as f:
        lines = f.read().splitlines()
    with open(os.path.join(d, "stderr")) as f:
        last = [ln.strip() for ln in f.read().splitlines() if ln.strip()][-1:] or [""]
    shutil_rmtree(d)
    for line in lines:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    for line in lines:
        if line.startswith("ERROR "):
            return {"error": json.loads(line[len("ERROR "):])}
    how = f"killed by {signal.Signals(-p.returncode).name}" if p.returncode < 0 else f"rc={p.returncode}"
    return {"error": f"client died ({how}): {last[0][:200]}"}


def ratio_cell(ours: float | None, theirs: float | None, higher_is_better: bool) -> str:
    """``ours ÷ theirs`` and which is better (for a rate ``higher_is_better``, for a time not)."""
    if ours is None or theirs is None or ours <= 0 or theirs <= 0:
        return T.DASH
    q = ours / theirs
    ours_better = q > 1 if higher_is_better else q < 1
    k = q if q >= 1 else 1 / q
    if abs(k - 1) < 0.005:
        return f"{q:.2f} (same)"
    return f"{q:.2f} ({'ours' if ours_better else 'torchmonarch'} {k:.1f}× better)"


def slope(rows: list[dict[str, Any]], key: str, size: str) -> str:
    """log-log slope of ``key`` against ``size`` between the first and last good rows."""
    good = [r for r in rows if "error" not in r and (r.get(key) or 0) > 0 and r.get(size, 0) > 0]
    if len(good) < 2 or good[0][size] == good[-1][size]:
        return T.DASH
    a, b = good[0], good[-1]
    return f"{math.log(b[key] / a[key]) / math.log(b[size] / a[size]):.2f}"


#: (column title, RESULT key, format, multiplier, higher is better) of the procs and actors axes
PROCS_COLUMNS = [("spawn + first call, s", "up_s", "{:.2f}", 1.0, False),
                 ("call() to all, ms", "call_s", "{:.1f}", 1e3, False),
                 ("stop, s", "stop_s", "{:.2f}", 1.0, False)]
ACTORS_COLUMNS = [("spawn rate, actors/s", "rate", "{:,.0f}", 1.0, True),
                  ("call-all, s", "call_s", "{:.2f}", 1.0, False),
                  ("stop, s", "stop_s", "{:.2f}", 1.0, False),
                  ("client RSS per actor, KiB", "rss_per_actor_kib", "{:.1f}", 1.0, False)]


def failed(r: dict[str, Any]) -> str:
    """A failed row's cell: ``failed: <first line>`` (its first 200 characters)."""
    first = (str(r["error"]).strip().splitlines() or ["?"])[0]
    return "failed: " + (first if len(first) <= 200 else first[:199] + "…").replace("|", "\\|")


def axis_table(size_title: str, size_key: str, size_fmt: str, columns: list[tuple[str, str, str, float, bool]],
               rows: list[dict[str, Any]], ref: list[dict[str, Any]] | None = None) -> str:
    """One row per size with each column's figure, the growth exponents last.
    With ``ref`` (torchmonarch's rows, same sizes in the same order) each
    column is three: ours, torchmonarch's, and ours ÷ torchmonarch saying
    which is better; a failed size shows ``failed: <first line>`` in its
    implementation's first cell and dashes in the rest."""
    headers = [size_title]
    for title, _, _, _, _ in columns:
        headers += [f"{title}: ours", f"{title}: torchmonarch",
                    f"{title}: ours ÷ torchmonarch"] \
            if ref is not None else [title]
    headers += ["left after stop: ours / torchmonarch" if ref is not None else "left after stop"]

    def cells(r: dict[str, Any] | None, i: int) -> list[str]:
        out = []
        for j, (_, key, spec, mult, _) in enumerate(columns):
            if r is None:
                out.append(T.DASH)
            elif "error" in r:
                out.append(failed(r) if j == 0 and i == 0 else T.DASH)
            else:
                out.append(T.fmt(r[key] * mult, spec))
        return out

    body = []
    for k, r in enumerate(rows):
        size = size_fmt.format(r[size_key])
        if ref is None:
            body.append([size] + [failed(r) if "error" in r and j == 0 else c
                                  for j, c in enumerate(cells(r, 0))] + [T.DASH if "error" in r else str(r["left"])])
            continue
        t = ref[k] if k < len(ref) else None
        ours, theirs = cells(r, 0), cells(t, 0)
        row = [size]
        for j, (_, key, _, _, better) in enumerate(columns):
            both = "error" not in r and t is not None and "error" not in t
            row += [ours[j], theirs[j], ratio_cell(r[key], t[key], better) if both and t is not None else T.DASH]
        left = [T.DASH if x is None or "error" in x else str(x["left"]) for x in (r, t)]
        body.append(row + [" / ".join(left)])
    growth = ["growth exponent"]
    for _, key, _, _, _ in columns:
        growth += [slope(rows, key, size_key), slope(ref, key, size_key), T.DASH] if ref is not None \
            else [slope(rows, key, size_key)]
    body.append(growth + [T.DASH])
    return T.markdown(headers, body)


def procs_table(rows: list[dict[str, Any]], ref: list[dict[str, Any]] | None = None) -> str:
    return axis_table("procs N", "n", "{}", PROCS_COLUMNS, rows, ref)


def actors_table(rows: list[dict[str, Any]], ref: list[dict[str, Any]] | None = None) -> str:
    return axis_table("actors M (8 procs)", "m", "{:,}", ACTORS_COLUMNS, rows, ref)


def actors_floor_table(rows: list[dict[str, Any]], ref: list[dict[str, Any]] | None,
                       floor: dict[int, float]) -> str:
    """The actors axis's spawn rates against their bare-Python floor
    (``floors.spawn_actors``: the same M actors on 8 processes, a thread
    each, one call each, nothing else), measured in the same run."""
    headers = ["actors M (8 procs)", "spawn rate floor (a thread per actor), actors/s",
               "ours, actors/s", "ours, share of the floor"]
    if ref is not None:
        headers += ["torchmonarch, actors/s", "torchmonarch, share of the floor"]
    body = []
    for i, r in enumerate(rows):
        m = r["m"]
        f = floor.get(m)
        row = [f"{m:,}", T.fmt(f, "{:,.0f}")]
        for x in [r] + ([ref[i]] if ref is not None else []):
            rate = None if "error" in x else x.get("rate")
            row += [T.fmt(rate, "{:,.0f}") if rate is not None else failed(x),
                    T.fmt(rate / f * 100, "{:.0f} %") if rate is not None and f else T.DASH]
        body.append(row)
    return T.markdown(headers, body)


def hosts_table(rows: list[dict[str, Any]]) -> str:
    headers = ["hosts N", "workers up, s", "attach, s", "spawn + first call, s", "call() p50, ms", "call() p99, ms",
               "client CPU per call(), ms", "… less idle background, ms",
               "client CPU per call() to 16 of them, ms", "client CPU idle, % of a core",
               "PSS per host, MiB", "host lost: call failed after, s",
               "rest answer", "stop, s", "left after stop"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([str(r["n"]), f"FAILED: {r['error']}"] + [T.DASH] * (len(headers) - 2))
            continue
        msg = r["lost_msg"] or ""
        if f"procs0-{r['n'] - 1}-" not in msg and f"'hosts': {r['n'] - 1}/{r['n']}" not in msg:
            lost = " (does not name it)"
        elif f"({r['n']} in all)" in msg:
            lost = f" (its proc named as the cause; all {r['n']} ranks failed)"
        else:
            lost = " (names it; only its rank failed)"
        body.append([str(r["n"]), T.fmt(r["workers_s"], "{:.1f}"), T.fmt(r["attach_s"], "{:.2f}"),
                     T.fmt(r["up_s"], "{:.2f}"), T.fmt(r["p50_ms"], "{:.1f}"), T.fmt(r["p99_ms"], "{:.1f}"),
                     T.fmt(r["cpu_ms"], "{:.2f}"), T.fmt(r["cpu_net_ms"], "{:.2f}"),
                     T.fmt(r["cpu16_ms"], "{:.2f}"), T.fmt(r["idle_cpu"] * 100, "{:.2f}"),
                     T.fmt(r["host_pss_mib"], "{:.0f}"),
                     (T.fmt(r["lost_s"], "{:.2f}") + lost)
                     if r["lost_s"] is not None else "NOT FAILED",
                     f"{r['rest']}/{r['n'] - 1}", T.fmt(r["stop_s"], "{:.2f}"), f"{r['left']} of {r['tracked']}"])
    body.append(["growth exponent", slope(rows, "workers_s", "n"), slope(rows, "attach_s", "n"),
                 slope(rows, "up_s", "n"), slope(rows, "p50_ms", "n"), slope(rows, "p99_ms", "n"),
                 slope(rows, "cpu_ms", "n"), slope(rows, "cpu_net_ms", "n"),
                 slope(rows, "cpu16_ms", "n"), slope(rows, "idle_cpu", "n"), slope(rows, "host_pss_mib", "n"), slope(rows, "lost_s", "n"), T.DASH,
                 slope(rows, "stop_s", "n"), T.DASH])
    return T.markdown(headers, body)


def idle_table(rows: list[dict[str, Any]], floor: dict[str, Any] | None) -> str:
    """The client's CPU while idle with N hosts attached (heartbeats and
    supervision only), against ``floor`` (the same client, no host)."""
    headers = ["hosts N", "idle window, s", "client CPU idle (process_time), % of a core",
               "client CPU idle (/proc/self/stat utime+stime), % of a core",
               "above the floor, per host, µs of CPU per s", "its busiest thread, % of a core"]
    base = floor.get("idle_cpu") if floor is not None and "error" not in floor else None
    body = []
    for r in ([floor] if floor is not None else []) + rows:
        size = "0 (floor: no host attached)" if r["n"] == 0 else str(r["n"])
        if "error" in r:
            body.append([size, failed(r)] + [T.DASH] * (len(headers) - 2))
            continue
        threads = r.get("idle_threads") or {}
        busiest = max(threads.items(), key=lambda kv: kv[1]) if threads else None
        per_host = (r["idle_cpu"] - base) / r["n"] * 1e6 if base is not None and r["n"] > 0 else None
        body.append([size, T.fmt(r.get("idle_s"), "{:.1f}"), T.fmt(r["idle_cpu"] * 100, "{:.2f}"),
                     T.fmt(r.get("idle_stat_cpu", math.nan) * 100, "{:.2f}"), T.fmt(per_host, "{:.0f}"),
                     f"{busiest[1] * 100:.2f} ({busiest[0].split(' (tid')[0]})" if busiest else T.DASH])
    body.append(["growth exponent", T.DASH, slope(rows, "idle_cpu", "n"), slope(rows, "idle_stat_cpu", "n"),
                 T.DASH, T.DASH])
    return T.markdown(headers, body)


def reference_unavailable(python: str) -> str | None:
    """Why ``python`` cannot run the reference side (``None``: it can)."""
    try:
        p = subprocess.run([python, "-c", "import monarch.actor as a; a.Actor, a.endpoint, a.this_host"],
                           capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run it ({e})"
    if p.returncode != 0:
        return f"it cannot import torchmonarch's monarch.actor: {p.stderr.strip().splitlines()[-1:]}"
    return None


def measure(axis: str, code: str, size_key: str, sizes: list[int], timeout: float,
            ref_python: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Each size in a fresh client of ours, then (with ``ref_python``) in a
    fresh torchmonarch client right after it: our rows and the reference's."""
    rows: list[dict[str, Any]] = []
    ref: list[dict[str, Any]] | None = [] if ref_python else None
    for n in sizes:
        r = run(code, n, timeout)
        r.setdefault(size_key, n)
        print(f"[scale] {axis} {n} (ours): {r}", file=sys.stderr, flush=True)
        rows.append(r)
        if ref is not None:
            t = run(for_reference(code), n, timeout, python=ref_python)
            t.setdefault(size_key, n)
            print(f"[scale] {axis} {n} (torchmonarch): {t}", file=sys.stderr, flush=True)
            ref.append(t)
    return rows, ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="4,16,64,128,256", help="proc counts (comma-separated; '' skips)")
    ap.add_argument("--actors", default="1000,5000,10000,20000", help="actor counts (comma-separated; '' skips)")
    ap.add_argument("--hosts", default="16,64,256", help="tls worker-loop host counts (comma-separated; '' skips)")
    ap.add_argument("--ssh-hosts", default="8,16,32",
                    help="SSH namespace-host counts (comma-separated; '' skips; skipped where the testbed cannot run)")
    ap.add_argument("--rounds", type=int, default=50, help="sequential call()s timed per host count")
    ap.add_argument("--tree-min", type=int, default=8, help="MONARCH_CAST_TREE_MIN of the hosts axis's client")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement (its client is killed)")
    ap.add_argument("--md", help="also write the tables to this Markdown file")
    ap.add_argument("--reference-python", metavar="PYTHON",
                    help="an interpreter with torchmonarch installed: the procs and actors axes run each size "
                         "with it too (the same script on monarch.actor), side by side")
    ap.add_argument("--idle", type=float, default=20.0,
                    help="seconds of the hosts axis's idle window (the client's CPU with N hosts attached)")
    ap.add_argument("--idle-profile", metavar="DIR",
                    help="hosts axis: also profile the client's kernel thread (cProfile) over the idle window and "
                         "write DIR/idle-<N>.txt (a separate diagnostic: the profiler costs CPU itself)")
    args = ap.parse_args()
    out = []
    sizes = [int(x) for x in args.procs.split(",") if x]
    ref_python = args.reference_python
    if ref_python is not None:
        why = reference_unavailable(ref_python)
        if why is not None:
            print(f"[scale] --reference-python {ref_python}: {why}", file=sys.stderr, flush=True)
            return 2
    if sizes:
        rows, ref = measure("procs", PROCS, "n", sizes, args.timeout, ref_python)
        out.append(procs_table(rows, ref))
    counts = [int(x) for x in args.actors.split(",") if x]
    if counts:
        rows, ref = measure("actors", ACTORS, "m", counts, args.timeout, ref_python)
        out.append(actors_table(rows, ref))
        floor = {m: floors.spawn_actors(m, 8, 3)["actors_per_s"] for m in counts}
        print(f"[scale] actors floor: {floor}", file=sys.stderr, flush=True)
        out.append(actors_floor_table(rows, ref, floor))
    hsizes = [int(x) for x in args.hosts.split(",") if x]
    if hsizes:
        floor = run_hosts(0, args.rounds, args.tree_min, args.timeout, args.idle)
        print(f"[scale] hosts 0 (the idle floor): {floor}", file=sys.stderr, flush=True)
        rows = []
        for n in hsizes:
            prof = os.path.join(args.idle_profile, f"idle-{n}.txt") if args.idle_profile else None
            if prof is not None:
                os.makedirs(args.idle_profile, exist_ok=True)
            r = run_hosts(n, args.rounds, args.tree_min, args.timeout, args.idle, prof)
            print(f"[scale] hosts {n}: {r}", file=sys.stderr, flush=True)
            rows.append(r)
        out.append(hosts_table(rows))
        out.append(idle_table(rows, floor))
    ssizes = [int(x) for x in args.ssh_hosts.split(",") if x]
    if ssizes:
        why = ssh_unavailable()
        if why is not None:
            print(f"[scale] SSH axis skipped: {why}", file=sys.stderr, flush=True)
        else:
            out.append(ssh_table(run_ssh(ssizes, args.rounds, args.timeout)))
    text = "\n\n".join(out)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
