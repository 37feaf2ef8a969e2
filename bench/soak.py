"""Soak: does a long job grow?  Client and proc memory growth per hour, ``ipc`` and ``tls``.

    python bench/soak.py                          # 3 minutes per transport, ipc then tls
    python bench/soak.py --duration 600 --actor-every 3 --proc-every 30 --transports ipc

Each transport runs in a fresh child interpreter (a client and its procs; ``tls`` with a
throwaway CA made with ``trustme``).  The client keeps one proc mesh for the whole run, with
a ``Steady`` actor that a client thread calls all the time (``call_one``, ``--rate`` calls/s),
and every ``--actor-every`` s spawns an actor mesh there, calls it once and stops it; every
``--proc-every`` s it spawns a second proc mesh with an actor mesh, calls it and stops the
proc mesh.  Every ``--sample`` s it records, for the client and the long-lived proc, the RSS
(``/proc/self/statm``) and the malloc heap in use (glibc ``mallinfo2().uordblks``: what Python
and C extensions hold, without tracemalloc's cost).  Growth per hour is the least-squares
slope of the samples after the first ``--warmup`` s.  A short run bounds the slope loosely
(allocator noise is a few hundred KiB): compare runs, and run longer for a finer figure.
Standard library, trustme and monarch_core only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _table import fmt, markdown  # noqa: E402

CHILD = textwrap.dedent(
    """
    import ctypes, json, os, sys, threading, time
    from monarch_core.actor import Actor, endpoint, enable_transport, this_host

    def mem():
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        try:
            class MI(ctypes.Structure):
                _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = MI
            heap = libc.mallinfo2().uordblks
        except (OSError, AttributeError):
            heap = None
        return rss, heap

    class Steady(Actor):
        @endpoint
        def work(self, x: int) -> int:
            return x + 1

        @endpoint
        def mem(self) -> tuple:
            return mem()

    class W(Actor):
        @endpoint
        def ping(self) -> int:
            return 1

    duration, actor_every, proc_every, rate, sample = (float(x) for x in sys.argv[1:6])
    if sys.argv[6] == "tls":
        enable_transport("tls://127.0.0.1:0")
    host = this_host()
    pm = host.spawn_procs(per_host={"p": 1})
    steady = pm.spawn("steady", Steady)
    steady.work.call_one(0).get(timeout=60)
    stop = threading.Event()
    calls = [0]

    def load():
        gap = 1.0 / rate if rate > 0 else None
        nxt = time.monotonic()
        while not stop.is_set():
            steady.work.call_one(calls[0]).get(timeout=60)
            calls[0] += 1
            if gap:
                nxt += gap
                d = nxt - time.monotonic()
                if d > 0:
                    time.sleep(d)
                else:
                    nxt = time.monotonic()

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t0 = time.monotonic()
    next_actor, next_proc, next_sample = t0, t0 + proc_every, t0
    samples, actor_cycles, proc_cycles, i = [], 0, 0, 0
    while True:
        now = time.monotonic()
        if now - t0 >= duration:
            break
        if now >= next_sample:
            c, p = mem(), steady.mem.call_one().get(timeout=60)
            samples.append((now - t0, c[0], c[1], p[0], p[1]))
            next_sample += sample
        if now >= next_actor:
            m = pm.spawn(f"w{i}", W)
            m.ping.call_one().get(timeout=60)
            m.stop().get(timeout=60)
            i += 1
            actor_cycles += 1
            next_actor += actor_every
        if now >= next_proc:
            pm2 = host.spawn_procs(per_host={"p": 1})
            m = pm2.spawn("w", W)
            m.ping.call_one().get(timeout=60)
            pm2.stop().get(timeout=60)
            proc_cycles += 1
            next_proc += proc_every
        time.sleep(max(0.0, min(next_sample, next_actor, next_proc) - time.monotonic()))
    stop.set()
    t.join(60)
    pm.stop().get(timeout=60)
    print(json.dumps({"samples": samples, "actor_cycles": actor_cycles, "proc_cycles": proc_cycles,
                      "calls": calls[0]}))
    """
)


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, bytes)`` points, in bytes per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx * 3600


def tls_env(d: str) -> dict[str, str]:
    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"MONARCH_TLS_CA": os.path.join(d, "ca.pem"), "MONARCH_TLS_CERT": os.path.join(d, "cert.pem"),
             "MONARCH_TLS_KEY": os.path.join(d, "key.pem")}
    ca.cert_pem.write_to_path(paths["MONARCH_TLS_CA"])
    with open(paths["MONARCH_TLS_CERT"], "wb") as f:
        f.write(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(paths["MONARCH_TLS_KEY"])
    os.chmod(paths["MONARCH_TLS_KEY"], 0o600)
    return paths


def run(transport: str, a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="monarch-soak-") as d:
        env = dict(os.environ)
        if transport == "tls":
            env.update(tls_env(d))
        script = os.path.join(d, "soak_child.py")
        with open(script, "w") as f:
            f.write(CHILD)
        args = [str(x) for x in (a.duration, a.actor_every, a.proc_every, a.rate, a.sample)] + [transport]
        out = subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True,
                             timeout=a.duration + 300)
    if out.returncode != 0:
        raise SystemExit(f"the {transport} soak failed:\n{out.stderr[-4000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    kept = [s for s in r["samples"] if s[0] >= a.warmup]
    for col, name in ((1, "client_rss"), (2, "client_heap"), (3, "proc_rss"), (4, "proc_heap")):
        pts = [(s[0], s[col]) for s in kept if s[col] is not None]
        r[name] = slope_per_hour(pts)
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=180.0, help="seconds per transport (default 180)")
    p.add_argument("--actor-every", type=float, default=3.0, help="seconds between actor-mesh spawn/stop cycles")
    p.add_argument("--proc-every", type=float, default=30.0, help="seconds between proc-mesh spawn/stop cycles")
    p.add_argument("--rate", type=float, default=200.0, help="steady call_one calls per second (0: as fast as it goes)")
    p.add_argument("--sample", type=float, default=5.0, help="seconds between memory samples")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds of samples left out of the slope")
    p.add_argument("--transports", default="ipc,tls", help="comma-separated: ipc, tls")
    p.add_argument("--out", help="also write the results as JSON here")
    a = p.parse_args()
    results = {}
    for tr in a.transports.split(","):
        results[tr] = run(tr.strip(), a)
    mib = lambda v: fmt(None if v is None else v / (1 << 20), "{:+.2f}")  # noqa: E731
    rows = [(tr, f"{a.duration:.0f}", r["actor_cycles"], r["proc_cycles"], r["calls"], mib(r["client_rss"]),
             mib(r["client_heap"]), mib(r["proc_rss"]), mib(r["proc_heap"])) for tr, r in results.items()]
    print(markdown(["transport", "s", "actor meshes", "proc meshes", "calls", "client RSS MiB/h",
                    "client heap MiB/h", "proc RSS MiB/h", "proc heap MiB/h"], rows))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
