"""How monarch-core's casts scale with the number of procs (monarch-core only).

    python bench/scaling.py                  # live meshes of 4, 16, 64 procs + the simulated large mesh
    python bench/scaling.py --quick          # fewer iterations
    python bench/scaling.py --sizes 4,16 --out scaling.json --md scaling.md

Live section: for each size N, one mesh of N procs with one actor each (spawned once,
stopped before the next size).  After a warm-up:

* ``call()`` p50 / p99: wall time of ``mesh.noop.call().get()``, sequential;
* client CPU per ``call()``: ``time.process_time()`` (every thread of this process) over that
  same loop, divided by the number of calls: sending N messages, receiving N replies and
  building the ValueMesh;
* client CPU per ``broadcast()``: ``process_time`` over K ``mesh.noop.broadcast()`` followed by
  one ``mesh.noop.call().get()`` (so the work has completed), divided by K.  Nothing is
  subtracted: the closing call is included, which overstates the cost by 1/K of one call();
* broadcast issue / wall per cast: wall time until the K-th ``broadcast()`` returned, and
  until the closing ``call().get()`` returned, each divided by K.

Simulated section: a model, not a measurement of live procs.  The project's tree casting
(a cast to many procs goes to at most ``fanout`` of them, which forward to their subtrees)
plans the tree with ``monarch_core._proc._tree.split(members, fanout)``; this section calls
that real function on N simulated members (no procs, nothing is sent) and reports how the
work is distributed: messages the client sends, tree depth, the most messages any one node
sends, and the CPU the client spends planning a cast.  Without that module, the direct
(flat) cast is modelled: the client sends one message per member.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _table as T

from monarch_core.actor import Actor, endpoint, this_host

NO_TREE = "tree casting not available: the client sends one message per member"


class Pinger(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def noop(self) -> None:
        return None


def log(msg: str) -> None:
    print(f"[scaling] {msg}", file=sys.stderr, flush=True)


def wait_gone(pids: Sequence[int], timeout: float = 15.0) -> list[int]:
    end = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


# ------------------------------------------------------------------ live meshes
def live(n: int, warm: int, iters: int, k: int, reps: int, tree: bool = False) -> dict[str, Any]:
    """One live row; ``tree``: route through the cast tree whatever the mesh's
    size (this process lowers ``_tree.TREE_MIN`` to ``n`` for the row)."""
    if tree:
        from monarch_core._proc import _tree

        saved = _tree.TREE_MIN
        _tree.TREE_MIN = min(saved, n)
        try:
            r = live(n, warm, iters, k, reps)
        finally:
            _tree.TREE_MIN = saved
        r["mode"] = f"tree, fanout {_tree.FANOUT}"
        return r
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": n})
    mesh = procs.spawn("scale", Pinger)
    pids = [v for _, v in mesh.pid.call().get().items()]
    spawn_s = time.perf_counter() - t0
    assert len(set(pids)) == n, pids
    try:
        for _ in range(warm):
            mesh.noop.call().get()

        pc = time.perf_counter_ns
        samples = []
        c0 = time.process_time()
        for _ in range(iters):
            t = pc()
            vm = mesh.noop.call().get()
            samples.append(pc() - t)
        cpu_call = (time.process_time() - c0) / iters
        assert len(list(vm.items())) == n

        bcast = []
        for _ in range(reps):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(k):
                mesh.noop.broadcast()
            w1 = time.perf_counter()
            mesh.noop.call().get()
            w2, c1 = time.perf_counter(), time.process_time()
            bcast.append({"cpu_us": (c1 - c0) / k * 1e6, "issue_us": (w1 - w0) / k * 1e6,
                          "wall_us": (w2 - w0) / k * 1e6})
    finally:
        t1 = time.perf_counter()
        procs.stop().get()
        stop_s = time.perf_counter() - t1
        left = wait_gone(pids)
    us = [s / 1e3 for s in samples]
    cpu_b = T.median(b["cpu_us"] for b in bcast)
    from monarch_core._proc import _tree

    return {
        "procs": n,
        "mode": f"tree, fanout {_tree.FANOUT}" if n >= _tree.TREE_MIN else "direct",
        "spawn_s": round(spawn_s, 3),
        "call_iters": iters,
        "call_p50_ms": round(T.median(us) / 1e3, 3),
        "call_p99_ms": round(T.percentile(us, 99) / 1e3, 3),
        "call_cpu_us": round(cpu_call * 1e6, 1),
        "broadcasts_per_rep": k,
        "broadcast_reps": reps,
        "broadcast_cpu_us": round(cpu_b, 1),
        "broadcast_cpu_per_member_us": round(cpu_b / n, 2),
        "broadcast_issue_us": round(T.median(b["issue_us"] for b in bcast), 1),
        "broadcast_wall_us": round(T.median(b["wall_us"] for b in bcast), 1),
        "broadcast_runs": [{a: round(v, 1) for a, v in b.items()} for b in bcast],
        "stop_s": round(stop_s, 3),
        "procs_left_after_stop": left,
    }


def live_table(rows: list[dict[str, Any]]) -> str:
    headers = ["procs", "cast", "spawn, s", "call() p50, ms", "call() p99, ms", "client CPU per call(), µs",
               "client CPU per broadcast(), µs", "… per member, µs", "broadcast issue, µs", "broadcast wall, µs",
               "left after stop"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([str(r["procs"]), r.get("mode", T.DASH), f"FAILED: {r['error']}"]
                        + [T.DASH] * (len(headers) - 3))
            continue
        body.append([str(r["procs"]), r["mode"], T.fmt(r["spawn_s"], "{:.2f}"), T.fmt(r["call_p50_ms"], "{:.2f}"),
                     T.fmt(r["call_p99_ms"], "{:.2f}"), T.fmt(r["call_cpu_us"], "{:,.0f}"),
                     T.fmt(r["broadcast_cpu_us"], "{:,.0f}"), T.fmt(r["broadcast_cpu_per_member_us"], "{:.1f}"),
                     T.fmt(r["broadcast_issue_us"], "{:,.0f}"), T.fmt(r["broadcast_wall_us"], "{:,.0f}"),
                     str(len(r["procs_left_after_stop"]))])
    return T.markdown(headers, body)


# ------------------------------------------------------------------ simulated large mesh
def load_tree() -> tuple[Callable[[Sequence[Any], int], list] | None, int | None, str | None]:
    try:
        from monarch_core._proc import _tree
    except ImportError as e:
        return None, None, f"{e}"
    split, fanout = getattr(_tree, "split", None), getattr(_tree, "FANOUT", None)
    if not callable(split) or not isinstance(fanout, int):
        return None, None, "monarch_core._proc._tree has no split() or no int FANOUT"
    return split, fanout, None


def simulated_members(n: int) -> list[tuple[int, str, str]]:
    return [(rank, f"sim-{rank:05d}", f"ipc:///tmp/monarch-sim/{rank}") for rank in range(n)]


def model_tree(split: Callable[[Sequence[Any], int], list], fanout: int, n: int) -> dict[str, Any]:
    """Walk the cast tree the planning function builds for n members."""
    members = simulated_members(n)
    sends: list[int] = []  # messages sent by each sending node; sends[0] is the client
    reached: Counter = Counter()
    depth = 0
    stack: list[tuple[Sequence[Any], int]] = [(members, 1)]
    while stack:
        group, level = stack.pop()
        plan = list(split(group, fanout))
        if len(plan) > fanout:
            raise AssertionError(f"split() of {len(group)} members returned {len(plan)} > fanout={fanout} pairs")
        sends.append(len(plan))
        for head, rest in plan:
            rest = list(rest)
            if len(rest) >= len(group):
                raise AssertionError(f"split() did not shrink a group of {len(group)} (a rest of {len(rest)})")
            reached[head] += 1
            depth = max(depth, level)
            if rest:
                stack.append((rest, level + 1))
    covered = reached == Counter(members)

    # The client's share: planning the top level of a cast.
    split(members, fanout)
    reps, spent = 1, 0.0
    while spent < 0.2:
        reps *= 2
        c0 = time.process_time()
        for _ in range(reps):
            split(members, fanout)
        spent = time.process_time() - c0
    # What a sender really does per cast to every member once the forwarders
    # keep the member table: plan the first level and encode fanout headers.
    sender_us = None
    try:
        from monarch_core._proc import _tree

        def one_cast() -> None:
            _here, _rank, groups = _tree.plan(-1, n, fanout, None, lambda m: False)
            for hop, sub in groups.items():
                _tree.encode("key", "noop", None, ("procs",), (n,), "client", None, False, n, fanout, hop, sub,
                             None, "view")

        one_cast()
        reps2, spent2 = 1, 0.0
        while spent2 < 0.2:
            reps2 *= 2
            c0 = time.process_time()
            for _ in range(reps2):
                one_cast()
            spent2 = time.process_time() - c0
        sender_us = round(spent2 / reps2 * 1e6, 1)
    except (ImportError, AttributeError, TypeError):
        pass
    return {
        "sender_cast_cpu_us": sender_us,
        "members": n, "client_messages": sends[0], "depth": depth,
        "max_messages_one_node": max(sends), "max_messages_one_forwarder": max(sends[1:], default=0),
        "forwarders": len(sends) - 1, "total_messages": sum(sends), "every_member_once": covered,
        "planning_cpu_us": round(spent / reps * 1e6, 1), "planning_reps": reps,
    }


def model_flat(n: int) -> dict[str, Any]:
    return {"members": n, "client_messages": n, "depth": 1, "max_messages_one_node": n,
            "max_messages_one_forwarder": 0, "forwarders": 0, "total_messages": n, "every_member_once": True,
            "planning_cpu_us": None}


def sim_table(rows: list[dict[str, Any]]) -> str:
    headers = ["simulated members", "client sends per cast", "tree depth", "max sends by one node",
               "max sends by one forwarder", "forwarding procs", "total messages", "every member once",
               "split() of all N, µs", "sender's work per cast, µs"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([str(r["members"]), f"FAILED: {r['error']}"] + [T.DASH] * (len(headers) - 2))
            continue
        body.append([f"{r['members']:,}", f"{r['client_messages']:,}", str(r["depth"]),
                     f"{r['max_messages_one_node']:,}", f"{r['max_messages_one_forwarder']:,}",
                     f"{r['forwarders']:,}", f"{r['total_messages']:,}", "yes" if r["every_member_once"] else "**no**",
                     T.fmt(r["planning_cpu_us"], "{:,.1f}"), T.fmt(r.get("sender_cast_cpu_us"), "{:,.1f}")])
    return T.markdown(headers, body)


# ------------------------------------------------------------------ main
def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description="monarch-core cast scaling: live meshes and a simulated large mesh")
    ap.add_argument("--sizes", type=ints, default=[4, 16, 64], help="live mesh sizes (default 4,16,64)")
    ap.add_argument("--tree-sizes", type=ints, default=[64],
                    help="live mesh sizes also measured through the cast tree (default 64; '' for none)")
    ap.add_argument("--sim-sizes", type=ints, default=[64, 1024, 4096, 16384],
                    help="simulated member counts (default 64,1024,4096,16384)")
    ap.add_argument("--fanout", type=int, help="model this fanout instead of _tree.FANOUT")
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--no-live", action="store_true", help="skip the live meshes")
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated large mesh")
    ap.add_argument("--out", metavar="JSON", help="write every figure here")
    ap.add_argument("--md", metavar="PATH", help="also write the markdown here")
    args = ap.parse_args()
    warm, iters, k, reps = (5, 30, 30, 1) if args.quick else (20, 200, 200, 3)

    out: dict[str, Any] = {"quick": args.quick, "nproc": os.cpu_count(), "loadavg_start": os.getloadavg(),
                           "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "live": [],
                           "simulated": None}
    failed = False
    md = ["## Scaling (monarch-core only)"]
    if not args.no_live:
        for n, tree in [(n, False) for n in args.sizes] + [(n, True) for n in args.tree_sizes]:
            log(f"{n} procs{' through the tree' if tree else ''} ...")
            t0 = time.monotonic()
            try:
                r = live(n, warm, iters, k, reps, tree)
            except Exception as e:  # noqa: BLE001 - report the size as failed, go on with the next
                import traceback

                failed = True
                r = {"procs": n, "mode": "tree" if tree else "", "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc()}
                log(r["traceback"])
            out["live"].append(r)
            log(f"{n} procs done in {time.monotonic() - t0:.1f} s")
        intro = ("*cast*: how the client reaches the members, *direct* (one message per member) or through the "
                 "cast tree (at most fanout messages from any proc; below `MONARCH_CAST_TREE_MIN` members a mesh is "
                 "reached directly, so tree rows lower that threshold in this process).  "
                 f"One actor per proc; {iters} sequential `mesh.noop.call().get()` after {warm} warm-up calls "
                 "(p50/p99 over them); client CPU = `time.process_time()` of this whole process (all threads) "
                 f"over that loop ÷ calls.  Broadcast: {k} `mesh.noop.broadcast()` then one `call().get()` so the "
                 f"work is done, CPU ÷ {k} with nothing subtracted, median of {reps} repetition(s); *issue* = wall "
                 f"time until the last broadcast() returned ÷ {k}, *wall* = until the closing call returned ÷ {k}.")
        md += [
            "### Live meshes\n\n" + intro,
            live_table(out["live"]),
        ]
    if not args.no_sim:
        split, fanout, why = load_tree()
        if args.fanout is not None:
            fanout = args.fanout
        sim: dict[str, Any] = {"tree": split is not None, "fanout": fanout, "why_not": why, "rows": []}
        out["simulated"] = sim
        if split is None:
            print(NO_TREE, flush=True)
            log(f"({why})")
        for n in args.sim_sizes:
            try:
                sim["rows"].append(model_flat(n) if split is None else model_tree(split, fanout, n))
            except Exception as e:  # noqa: BLE001 - a broken planning function is a row, not a crash
                failed = True
                sim["rows"].append({"members": n, "error": f"{type(e).__name__}: {e}"})
        if split is None:
            intro = (f"**{NO_TREE}** (`monarch_core._proc._tree` not importable: {why}).  The rows model the "
                     "direct (flat) cast: the client sends every message itself, and there is no planning step.")
        else:
            intro = (f"**A model, not a measurement of live procs**: the real planning function "
                     f"`monarch_core._proc._tree.split(members, fanout={fanout})` is applied to N simulated "
                     "members (tuples `(rank, proc_id, address)`), recursively for every forwarding proc, and "
                     "the resulting tree is counted; no procs are started and nothing is sent.  *Tree depth* = hops "
                     "from the client to the farthest member (1 = the client sends to every member itself); a "
                     "*forwarding proc* is a member that sends its subtree on.  The last two columns are "
                     "timings: `process_time` of one `split()` of all N members (the model's walk, which lists "
                     "every subtree), and of what a sender really does per cast to every member once the "
                     "forwarders keep the member table (`_tree.plan` of the first level and `fanout` header "
                     "encodings; sockets excluded).")
        md += ["### Simulated large mesh (model of the cast tree)\n\n" + intro, sim_table(sim["rows"])]
    out["loadavg_end"] = os.getloadavg()
    text = "\n\n".join(md) + "\n"
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2, default=str)
            f.write("\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
