"""What many procs on one host, and many actors in one proc mesh, cost (monarch-core only).

    python bench/scale.py                          # procs N = 4,16,64,128,256; actors M = 1000,5000,10000,20000
    python bench/scale.py --procs 4,16 --actors 1000,5000 --md scale.md

Each measurement runs in a fresh client process (its own fork server and
procs), so one size's leftovers or memory do not leak into the next.

Procs axis: ``this_host().spawn_procs(per_host={"p": N})`` with one actor per
proc: *spawn + first call* (``spawn_procs`` until the actor mesh's first
``call()`` returned every rank), *call()* (a second ``call()`` to all N),
*stop* (``ProcMesh.stop()``), *left* (proc pids still running 15 s after stop).

Actors axis: one proc mesh of 8 procs and M actors as M/8 actor meshes of 8:
*spawn rate* (actors per second, spawn of every mesh until each answered its
first ``call()``), *call-all* (one more ``call()`` on every mesh, all issued
before any is awaited), *stop*, *client RSS per actor* (the client's RSS
growth from before the spawns to after the calls, divided by M), *left*.

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
import textwrap
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _table as T  # noqa: E402

PROCS = textwrap.dedent("""
    import json, os, sys, time
    from monarch_core.actor import Actor, endpoint, this_host

    class A(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

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

    m = int(sys.argv[1])
    pm = this_host().spawn_procs(per_host={"p": 8})
    pm.initialized.get(timeout=600)
    pids = [s.pid for s in pm._slots]
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
""")


def run(code: str, arg: int, timeout: float) -> dict[str, Any]:
    """``code`` in a fresh client with ``arg``; its RESULT, or ``{"error": ...}``."""
    try:
        p = subprocess.run([sys.executable, "-c", code, str(arg)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": f"rc={p.returncode}: {p.stderr.strip().splitlines()[-1:] or ''}"}


def slope(rows: list[dict[str, Any]], key: str, size: str) -> str:
    """log-log slope of ``key`` against ``size`` between the first and last good rows."""
    good = [r for r in rows if "error" not in r and r.get(key, 0) > 0]
    if len(good) < 2 or good[0][size] == good[-1][size]:
        return T.DASH
    a, b = good[0], good[-1]
    return f"{math.log(b[key] / a[key]) / math.log(b[size] / a[size]):.2f}"


def procs_table(rows: list[dict[str, Any]]) -> str:
    headers = ["procs N", "spawn + first call, s", "call() to all, ms", "stop, s", "left after stop"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([str(r["n"]), f"FAILED: {r['error']}", T.DASH, T.DASH, T.DASH])
            continue
        body.append([str(r["n"]), T.fmt(r["up_s"], "{:.2f}"), T.fmt(r["call_s"] * 1e3, "{:.1f}"),
                     T.fmt(r["stop_s"], "{:.2f}"), str(r["left"])])
    body.append(["growth exponent", slope(rows, "up_s", "n"), slope(rows, "call_s", "n"),
                 slope(rows, "stop_s", "n"), T.DASH])
    return T.markdown(headers, body)


def actors_table(rows: list[dict[str, Any]]) -> str:
    headers = ["actors M (8 procs)", "spawn rate, actors/s", "call-all, s", "stop, s", "client RSS per actor, KiB",
               "left after stop"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([str(r["m"]), f"FAILED: {r['error']}"] + [T.DASH] * 4)
            continue
        body.append([f"{r['m']:,}", T.fmt(r["rate"], "{:,.0f}"), T.fmt(r["call_s"], "{:.2f}"),
                     T.fmt(r["stop_s"], "{:.2f}"), T.fmt(r["rss_per_actor_kib"], "{:.1f}"), str(r["left"])])
    body.append(["growth exponent", slope(rows, "rate", "m"), slope(rows, "call_s", "m"),
                 slope(rows, "stop_s", "m"), slope(rows, "rss_per_actor_kib", "m"), T.DASH])
    return T.markdown(headers, body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="4,16,64,128,256", help="proc counts (comma-separated; '' skips)")
    ap.add_argument("--actors", default="1000,5000,10000,20000", help="actor counts (comma-separated; '' skips)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement (its client is killed)")
    ap.add_argument("--md", help="also write the tables to this Markdown file")
    args = ap.parse_args()
    out = []
    sizes = [int(x) for x in args.procs.split(",") if x]
    if sizes:
        rows = []
        for n in sizes:
            r = run(PROCS, n, args.timeout)
            r.setdefault("n", n)
            print(f"[scale] procs {n}: {r}", file=sys.stderr, flush=True)
            rows.append(r)
        out.append(procs_table(rows))
    counts = [int(x) for x in args.actors.split(",") if x]
    if counts:
        rows = []
        for m in counts:
            r = run(ACTORS, m, args.timeout)
            r.setdefault("m", m)
            print(f"[scale] actors {m}: {r}", file=sys.stderr, flush=True)
            rows.append(r)
        out.append(actors_table(rows))
    text = "\n\n".join(out)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
