"""monarch-core, Monarch and Ray side by side: one command, one table.

    python bench/run.py                      # 2 interleaved runs of each, then scaling.py
    python bench/run.py --quick --runs 1     # smoke test of the plumbing (small counts)

The measurement definitions are the shared anchor scripts (``--anchors``, default
``$BENCH_ANCHORS`` or ``<repo>/../shared/bench-anchors``):

* monarch-core: ``<--core-py> <anchors>/monarch_bench.py`` with ``BENCH_IMPL=monarch_core``
  (exactly how the shared bench measures the project);
* Monarch: ``<--monarch-py> <anchors>/monarch_bench.py`` (``$MONARCH_PY``, default
  ``/tmp/anchors/monarch/bin/python``);
* Ray: ``<--ray-py> <anchors>/ray_bench.py`` (``$RAY_PY``, default ``/tmp/anchors/ray/bin/python``);
  ray_bench.py keeps Ray on loopback itself, so Ray is never started any other way.

Runs are interleaved (run i runs every implementation once, the order rotated by one each
run) so that a noisy phase of a shared machine hits all of them.  Each run's JSON and log
land in ``--out`` as ``<impl>_run<i>.json|.log`` (the shared ``summarize.py`` reads the
folder too).  The table holds, per metric, the median over the runs of each run's figure
(itself a median of repeats), and the ratio monarch-core ÷ Monarch of those medians.

Without the anchors folder, monarch-core alone is measured with the project's own copy of
the definitions, ``bench/actor_bench.py``.  Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import _table as T
import floors as F

DEFAULT_MONARCH_PY = "/tmp/anchors/monarch/bin/python"
DEFAULT_RAY_PY = "/tmp/anchors/ray/bin/python"
# From ../shared/notes/performance.md; the venv is the one the python path points into.
INSTALL = {
    "monarch": "python3 -m venv {venv} && {venv}/bin/pip install torch==2.13.0 torchmonarch==0.7.0",
    "ray": "python3 -m venv {venv} && {venv}/bin/pip install torch==2.13.0 ray==2.60.0",
}


# ------------------------------------------------------------------ implementations
@dataclass
class Impl:
    key: str  # file prefix: monarch_core / monarch / ray (what summarize.py globs)
    title: str  # column title before the version is known
    python: str
    script: str
    env: dict[str, str] = field(default_factory=dict)
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)  # run number -> result JSON
    failures: list[str] = field(default_factory=list)

    def version(self) -> str | None:
        for r in self.runs.values():
            if r.get("version"):
                return str(r["version"])
        return None


# ------------------------------------------------------------------ the table's rows
Getter = Callable[[dict[str, Any]], Any]


def path(*keys: str) -> Getter:
    def get(r: dict[str, Any]) -> Any:
        cur: Any = r
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        return cur

    return get


def payload(case_prefix: str, field_name: str) -> Getter:
    def get(r: dict[str, Any]) -> Any:
        for p in r.get("payload") or []:
            if isinstance(p, dict) and str(p.get("case", "")).startswith(case_prefix):
                return p.get(field_name)
        return None

    return get


def leftover(r: dict[str, Any]) -> Any:
    # monarch_bench.py stops its procs, ray_bench.py shuts Ray down: different key.
    for key in ("leftover_processes_after_stop", "leftover_processes_after_shutdown"):
        if isinstance(r.get(key), list):
            return len(r[key])
    return None


@dataclass
class Row:
    label: str
    get: Getter
    spec: str
    target: tuple[str, float] | None = None  # ("<=", 0.2): core ÷ Monarch must be at most 0.2
    main: bool = True  # shown in the per-run table

    def value(self, r: dict[str, Any] | None) -> float | None:
        if not r:
            return None
        try:
            v = self.get(r)
        except Exception:  # noqa: BLE001 - an odd JSON must not lose the whole table
            return None
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


ROWS = [
    Row("call_one p50, µs", path("latency", "p50_us"), "{:.0f}", ("<=", 0.12)),
    Row("call_one p99, µs", path("latency", "p99_us"), "{:.0f}", ("<=", 0.25)),
    Row("await call_one p50, µs", path("latency_async", "p50_us"), "{:.0f}"),
    Row("pipelined call_one, calls/s", path("throughput", "calls_per_s_median"), "{:,.0f}", (">=", 20)),
    Row("call() on 4 actors p50, ms", path("broadcast_4", "p50_ms"), "{:.2f}"),
    Row("call() on 16 actors p50, ms", path("broadcast_16", "p50_ms"), "{:.2f}", ("<=", 0.1)),
    Row("cold spawn 4 procs + first reply, s", path("spawn_cold", "total_s_median"), "{:.3f}", ("<=", 0.3)),
    Row("warm spawn 4 procs + first reply, s", path("spawn_warm", "median_s"), "{:.3f}"),
    Row("1 MiB bytes echo, MiB/s", payload("bytes 1 MiB", "echo_mib_s"), "{:,.0f}", (">=", 2)),
    Row("64 MiB bytes send, MiB/s", payload("bytes 64 MiB", "send_mib_s"), "{:,.0f}", (">=", 10)),
    Row("64 MiB bytes echo, MiB/s", payload("bytes 64 MiB", "echo_mib_s"), "{:,.0f}"),
    Row("64 MiB torch tensor send, MiB/s", payload("torch tensor 64 MiB", "send_mib_s"), "{:,.0f}"),  # vs memcpy: FLOORS
    Row("64 MiB torch tensor echo, MiB/s", payload("torch tensor 64 MiB", "echo_mib_s"), "{:,.0f}"),
    Row("idle worker PSS, MiB", path("memory", "worker_pss_mib_median"), "{:.1f}", ("<=", 0.5)),
    Row("idle worker RSS, MiB", path("memory", "worker_rss_mib_median"), "{:.1f}"),
    Row("runtime's other processes, PSS sum, MiB", path("memory", "other_processes_pss_mib_sum"), "{:.1f}",
        main=False),
    Row("import of the actor module, ms", path("import", "wall_ms_median"), "{:.0f}", ("<=", 1)),
    Row("processes left after stop", leftover, "{:.0f}", main=False),
]


#: Rows held against this machine's own floor, measured by this script in the
#: same session rather than against Monarch: (row label, floor key of
#: ``floors.measure()``, its title, bound on row ÷ floor).
FLOORS = [("64 MiB torch tensor send, MiB/s", "memcpy_64mib_mib_s", "memcpy of 64 MiB, MiB/s", 0.5)]

#: Monarch-relative targets next to the bare-Python floor of the same path
#: (``bench/floors.py``): (row label, floor key, floor title).  A target whose
#: absolute value (its bound times Monarch's median) is beyond the floor
#: cannot be met by any Python implementation of that path on this machine.
TARGET_FLOORS = [
    ("call_one p50, µs", "pingpong_p50_us", "request/reply p50, µs"),
    ("pipelined call_one, calls/s", "pipelined_calls_s", "pipelined request/reply, calls/s"),
    ("call() on 16 actors p50, ms", "fanout16_p50_ms", "one request to each of 16 processes p50, ms"),
    ("cold spawn 4 procs + first reply, s", "cold4_s", "exec 4 interpreters that answer, s"),
    ("cold spawn 4 procs + first reply, s", "cold4_trio_s",
     "exec 1 interpreter that imports trio, fork 4 that answer, s"),
    ("64 MiB bytes send, MiB/s", "memcpy_64mib_mib_s", "memcpy of 64 MiB, MiB/s"),
]


def floor_table(impls: dict[str, Impl | None], floors: dict[str, list[float]]) -> tuple[str, dict[str, Any]]:
    """The FLOORS rows: monarch-core's median against the floor's median."""
    med = medians(impls.get("monarch_core"))
    rows, data = [], {}
    for label, key, name, bound in FLOORS:
        c, f = med.get(label), T.median(floors.get(key, []))
        q = ratio(c, f)
        rows.append([label, T.fmt(c, "{:,.0f}"), name, T.fmt(f, "{:,.0f}"), T.fmt(q, "{:.2f}×"),
                     f"≥ {bound:g}× (higher is better)", T.DASH if q is None else ("yes" if q >= bound else "**no**")])
        data[label] = {"monarch_core": c, "floor": name, "floor_value": f, "core_over_floor": q, "target": bound,
                       "met": None if q is None else q >= bound}
    headers = ["metric", "monarch-core", "floor (this machine, same session)", "floor", "core ÷ floor", "target",
               "met?"]
    return T.markdown(headers, rows, [False, True, False, True, True, False, False]), data


def target_floor_table(impls: dict[str, Impl | None],
                       floors: dict[str, list[float]]) -> tuple[str, dict[str, Any]]:
    """Each Monarch-relative target as an absolute figure (its bound times
    Monarch's median), beside the bare-Python floor of the same path and
    monarch-core's figure.  Costs are relative to the floor (time ÷ floor's
    time; for rates, floor's rate ÷ rate): ``allowed`` is what the target
    leaves the framework, ``core`` what monarch-core costs now.  An allowed
    cost below 1× means the target is beyond the floor: out of reach here."""
    core, mon = medians(impls.get("monarch_core")), medians(impls.get("monarch"))
    by_label = {row.label: row for row in ROWS}
    rows, data = [], {}
    for label, key, name in TARGET_FLOORS:
        row = by_label[label]
        if row.target is None:
            continue
        f, c, m = T.median(floors.get(key, [])), core.get(label), mon.get(label)
        op, bound = row.target
        higher = op == ">="
        goal = None if m is None else bound * m
        allowed = ratio(f, goal) if higher else ratio(goal, f)
        cost = ratio(f, c) if higher else ratio(c, f)
        if allowed is None:
            verdict = T.DASH
        elif allowed < 1:
            verdict = "**beyond the floor**: out of reach here"
        else:
            verdict = "within reach" + ("" if cost is None or cost <= allowed else
                                        f": the framework costs {cost / allowed:.1f}× what the target leaves it")
        spec = "{:.3f}" if row.spec == "{:.2f}" else row.spec
        rows.append([label, f"{'≥' if higher else '≤'} {T.fmt(goal, spec)}", name, T.fmt(f, spec), T.fmt(c, spec),
                     T.fmt(allowed, "{:.2f}×"), T.fmt(cost, "{:.2f}×"), verdict])
        dkey = label if label not in data else f"{label} [{key}]"  # a second floor of the same row
        data[dkey] = {"target_value": goal, "floor": name, "floor_value": f, "monarch_core": c,
                       "allowed_cost_over_floor": allowed, "core_cost_over_floor": cost,
                       "target_beyond_floor": None if allowed is None else allowed < 1}
    headers = ["metric", "target (bound × Monarch)", "bare-Python floor (bench/floors.py)", "floor",
               "monarch-core", "cost the target allows (× floor)", "monarch-core's cost (× floor)", "verdict"]
    return T.markdown(headers, rows, [False, True, False, True, True, True, True, False]), data


def ratio(core: float | None, monarch: float | None) -> float | None:
    if core is None or monarch is None or monarch == 0:
        return None
    return core / monarch


def target_text(target: tuple[str, float] | None) -> str:
    if target is None:
        return T.DASH
    op, x = target
    if op == "<=":
        return f"≤ {x:g}× (lower is better)"
    return f"≥ {x:g}× (higher is better)"


def met(target: tuple[str, float] | None, r: float | None) -> str:
    if target is None or r is None:
        return T.DASH
    op, x = target
    ok = r <= x if op == "<=" else r >= x
    return "yes" if ok else "**no**"


# ------------------------------------------------------------------ running one child
def run_child(impl: Impl, i: int, out_dir: str, quick: bool, timeout: float, verbose: bool) -> None:
    """Run one benchmark process; its JSON (even a partial one) goes to ``impl.runs[i]``."""
    json_path = os.path.join(out_dir, f"{impl.key}_run{i}.json")
    log_path = os.path.join(out_dir, f"{impl.key}_run{i}.log")
    for p in (json_path, log_path):
        if os.path.exists(p):
            os.remove(p)
    argv = [impl.python, impl.script, "--out", json_path] + (["--quick"] if quick else [])
    env = dict(os.environ)
    env.update(impl.env)
    t0 = time.monotonic()
    # A session of its own: a timeout or ^C ends the benchmark and everything it started.
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(f'{k}={v}' for k, v in impl.env.items())} {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=out_dir,
                                text=True, errors="replace", start_new_session=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if verbose or " FAILED" in line:
                    print(f"      {line.rstrip()}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
        stragglers = _group_members(proc.pid)
        if stragglers:  # they would disturb the next run
            _kill_group(proc)
        reader.join(timeout=10)
    dt = time.monotonic() - t0
    if stragglers:
        msg = f"run {i}: {len(stragglers)} process(es) of its group outlived it and were killed: " + "; ".join(
            stragglers[:3])
        impl.failures.append(msg)
        print(f"  {msg}", flush=True)
    result = None
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            impl.failures.append(f"run {i}: {json_path} unreadable: {e}")
    if result is not None:
        impl.runs[i] = result
    errors = sorted((result or {}).get("errors") or {})
    if rc == 0 and result is not None and not errors:
        status = "LEAKED" if stragglers else "ok"
        print(f"  run {i}  {impl.title:<13} {status:<8} {dt:6.1f} s  -> {os.path.basename(json_path)}", flush=True)
        return
    why = f"timed out after {timeout:.0f} s" if timed_out else f"exit status {rc}"
    if rc == 0 and result is None:
        why = "no JSON written"
    if rc == 0 and errors:
        why = "sections failed: " + ", ".join(errors)
    elif errors:
        why += "; sections failed: " + ", ".join(errors)
    impl.failures.append(f"run {i}: {why} (log: {log_path})")
    print(f"  run {i}  {impl.title:<13} FAILED   {dt:6.1f} s  {why}", flush=True)
    if result is None or rc != 0:
        print(f"    last lines of {log_path}:", flush=True)
        for line in _tail(log_path, 25):
            print(f"    | {line}", flush=True)
    for name in errors:
        tb = str(result["errors"][name]).strip().splitlines()
        print(f"    [{name}] {tb[-1] if tb else '?'}", flush=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left of it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        end = time.monotonic() + 5
        while _group_members(proc.pid) and time.monotonic() < end:
            time.sleep(0.1)
        if not _group_members(proc.pid):
            return


def _group_members(pgid: int) -> list[str]:
    """``pid command`` of every live process in process group ``pgid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append(f"{entry} {cmd[:100]}")
        except (OSError, IndexError, ValueError):
            continue
    return found


def _tail(path_: str, n: int) -> list[str]:
    try:
        with open(path_, errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-n:]]
    except OSError as e:
        return [f"(cannot read the log: {e})"]


# ------------------------------------------------------------------ the report
def column_titles(impls: dict[str, Impl | None]) -> dict[str, str]:
    titles = {}
    for key, default in (("monarch_core", "monarch-core"), ("monarch", "Monarch 0.7.0"), ("ray", "Ray 2.60")):
        impl = impls.get(key)
        v = impl.version() if impl else None
        if key == "monarch_core" or not v:
            titles[key] = default
        else:
            titles[key] = f"{default.split()[0]} {v}"
    return titles


def medians(impl: Impl | None) -> dict[str, float | None]:
    if impl is None:
        return {row.label: None for row in ROWS}
    return {row.label: T.median(row.value(r) for r in impl.runs.values()) for row in ROWS}


def main_table(impls: dict[str, Impl | None]) -> tuple[str, dict[str, Any]]:
    titles = column_titles(impls)
    med = {k: medians(impls.get(k)) for k in ("monarch_core", "monarch", "ray")}
    rows, data = [], {}
    for row in ROWS:
        c, m, r = (med[k][row.label] for k in ("monarch_core", "monarch", "ray"))
        q = ratio(c, m)
        rows.append([row.label, T.fmt(c, row.spec), T.fmt(m, row.spec), T.fmt(r, row.spec),
                     T.fmt(q, "{:.2f}×"), target_text(row.target), met(row.target, q)])
        data[row.label] = {"monarch_core": c, "monarch": m, "ray": r, "core_over_monarch": q,
                           "target": list(row.target) if row.target else None,
                           "met": None if row.target is None or q is None else met(row.target, q) == "yes"}
    headers = ["metric", titles["monarch_core"], titles["monarch"], titles["ray"], "core ÷ Monarch", "target",
               "met?"]
    return T.markdown(headers, rows, [False, True, True, True, True, False, False]), data


def per_run_table(impls: dict[str, Impl | None], runs: int) -> str:
    titles = column_titles(impls)
    keys = [k for k in ("monarch_core", "monarch", "ray") if impls.get(k) is not None]

    def cells(impl: Impl, row: Row) -> list[float | None]:
        return [row.value(impl.runs.get(i)) for i in range(1, runs + 1)]

    rows = []
    for row in ROWS:
        if not row.main:
            continue
        line = [row.label]
        for k in keys:
            line.append(" ‖ ".join(T.fmt(v, row.spec) for v in cells(impls[k], row)))
        if impls.get("monarch_core") and impls.get("monarch"):
            pairs = zip(cells(impls["monarch_core"], row), cells(impls["monarch"], row), strict=True)
            line.append(" ‖ ".join(T.fmt(ratio(c, m), "{:.2f}×") for c, m in pairs))
        rows.append(line)
    headers = ["metric"] + [f"{titles[k]} (run 1 ‖ 2 …)" for k in keys]
    if impls.get("monarch_core") and impls.get("monarch"):
        headers.append("core ÷ Monarch, per run")
    return T.markdown(headers, rows, [False] + [True] * (len(headers) - 1))


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Run monarch-core, Monarch and Ray through the same benchmark definitions, "
                    "interleaved, and print one markdown table (also written to DIR/summary.md).")
    ap.add_argument("--runs", type=int, default=2, help="interleaved runs of each implementation (default 2)")
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke test); passed to every script")
    ap.add_argument("--out", metavar="DIR", help="results folder (default bench/results/<UTC timestamp>)")
    ap.add_argument("--anchors", metavar="DIR",
                    help="the shared benchmark definitions (default $BENCH_ANCHORS, else <repo>/../shared/bench-anchors)")
    ap.add_argument("--core-py", metavar="PATH", default=sys.executable,
                    help="Python of the monarch-core venv (default: the Python running this script)")
    ap.add_argument("--monarch-py", metavar="PATH", default=os.environ.get("MONARCH_PY", DEFAULT_MONARCH_PY),
                    help=f"Python of the Monarch venv (default $MONARCH_PY, else {DEFAULT_MONARCH_PY})")
    ap.add_argument("--ray-py", metavar="PATH", default=os.environ.get("RAY_PY", DEFAULT_RAY_PY),
                    help=f"Python of the Ray venv (default $RAY_PY, else {DEFAULT_RAY_PY})")
    ap.add_argument("--no-anchors", action="store_true",
                    help="measure monarch-core only: skip the Monarch and Ray runs")
    ap.add_argument("--no-scaling", action="store_true", help="do not run bench/scaling.py afterwards")
    ap.add_argument("--no-rdma", action="store_true", help="do not run bench/rdma.py (the RDMABuffer table)")
    ap.add_argument("--no-scale-hosts", action="store_true",
                    help="do not run bench/scale_hosts.py (4 ssh hosts x 8 procs x 32 actors; needs the testbed)")
    ap.add_argument("--rdma-only", action="store_true",
                    help="only the RDMABuffer table (bench/rdma.py, monarch-core and Monarch interleaved)")
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds one benchmark process may run before it is killed (default 1800)")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo every progress line of the children")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = os.path.abspath(args.out or os.path.join(HERE, "results", stamp))
    os.makedirs(out_dir, exist_ok=True)
    anchors = os.path.abspath(args.anchors or os.environ.get("BENCH_ANCHORS")
                              or os.path.join(REPO, "..", "shared", "bench-anchors"))
    notes: list[str] = []

    # monarch-core: always, with the shared definitions when they exist.
    shared_bench = os.path.join(anchors, "monarch_bench.py")
    if os.path.isfile(shared_bench):
        definitions = f"the shared anchor scripts in {anchors}"
        core = Impl("monarch_core", "monarch-core", args.core_py, shared_bench, {"BENCH_IMPL": "monarch_core"})
    else:
        definitions = (f"the project's own copy, bench/actor_bench.py ({anchors} not found: "
                       "monarch-core only, Monarch and Ray need the shared anchor scripts)")
        core = Impl("monarch_core", "monarch-core", args.core_py, os.path.join(HERE, "actor_bench.py"))
        notes.append(f"anchors folder {anchors} has no monarch_bench.py: measuring monarch-core alone with "
                     "bench/actor_bench.py (set BENCH_ANCHORS or --anchors to compare with Monarch and Ray)")
    impls: dict[str, Impl | None] = {"monarch_core": core, "monarch": None, "ray": None}
    chk = subprocess.run([args.core_py, "-c", "import monarch_core.actor"], capture_output=True, text=True,
                         check=False)
    if chk.returncode != 0:
        impls["monarch_core"] = None
        last = (chk.stderr.strip().splitlines() or ["?"])[-1]
        notes.append(f"monarch-core skipped: {args.core_py} cannot import monarch_core.actor ({last}); run this "
                     "script with the project venv's python or pass --core-py")

    if args.no_anchors:
        notes.append("Monarch and Ray skipped (--no-anchors)")
    elif os.path.isfile(shared_bench):
        for key, title, py, script in (("monarch", "Monarch", args.monarch_py, "monarch_bench.py"),
                                       ("ray", "Ray", args.ray_py, "ray_bench.py")):
            script_path = os.path.join(anchors, script)
            venv = os.path.dirname(os.path.dirname(os.path.abspath(py)))
            if not os.path.isfile(script_path):
                notes.append(f"{title} skipped: {script_path} not found")
            elif not os.access(py, os.X_OK):
                notes.append(f"{title} skipped: no venv at {py}; create it with: "
                             + INSTALL[key].format(venv=venv))
            else:
                impls[key] = Impl(key, title, py, script_path,
                                  {"BENCH_IMPL": "monarch"} if key == "monarch" else {})

    if args.rdma_only:
        print(f"results: {out_dir}", flush=True)
        text, ok = run_rdma(args, out_dir)
        with open(os.path.join(out_dir, "summary.md"), "w") as f:
            f.write(text + "\n")
        print()
        print(text)
        print(f"written: {os.path.join(out_dir, 'summary.md')}")
        return 0 if ok else 1
    active = [impl for impl in impls.values() if impl is not None]
    print(f"results: {out_dir}", flush=True)
    print(f"definitions: {definitions}", flush=True)
    for n in notes:
        print(f"note: {n}", flush=True)
    if args.quick:
        print("--quick: small counts; the figures check the plumbing and are not comparable to the targets",
              flush=True)
    load_start = os.getloadavg()
    t_all = time.monotonic()
    floors: dict[str, list[float]] = {}
    for i in range(1, args.runs + 1):
        shift = (i - 1) % len(active) if active else 0
        order = active[shift:] + active[:shift]
        print(f"run {i}/{args.runs}: " + ", ".join(impl.title for impl in order), flush=True)
        for impl in order:
            run_child(impl, i, out_dir, args.quick, args.timeout, args.verbose)
        try:
            measured = F.measure(args.quick)
        except (OSError, TimeoutError) as e:  # the tables say "—" for a floor that is missing
            notes.append(f"run {i}: the floors were not measured: {type(e).__name__}: {e}")
            measured = {}
        for key, value in measured.items():
            floors.setdefault(key, []).append(value)
    load_end = os.getloadavg()

    table, data = main_table(impls)
    ftable, fdata = floor_table(impls, floors)
    data["floors"] = fdata
    ttable, tdata = target_floor_table(impls, floors)
    data["targets_against_floors"] = tdata
    quick_note = " — **--quick: smoke-test counts, not comparable to the targets**" if args.quick else ""
    header = [
        f"# monarch-core vs Monarch vs Ray ({stamp})",
        "",
        f"- definitions: {definitions}",
        (f"- runs: {args.runs}, interleaved (the order rotates by one each run); each figure is the median over the "
         f"runs of each run's own median of repeats{quick_note}"),
        ("- `core ÷ Monarch` = monarch-core's median ÷ Monarch's median (same session); `target` is the bound "
         "on that ratio: `≤` rows are times or memory (lower is better), `≥` rows are rates (higher is better)"),
        (f"- machine: {os.cpu_count()} CPUs, load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at "
         f"end; the runs took {(time.monotonic() - t_all) / 60:.1f} min"),
    ]
    header += [f"- note: {n}" for n in notes]
    for impl in active:
        header += [f"- {impl.title} FAILED {f}" for f in impl.failures]
    parts = ["\n".join(header), table,
             "### Against this machine's floor\n\n" + ftable,
             ("### The targets against the bare-Python floors\n\n"
              "What a Python program that does only the transport of the call costs here (`bench/floors.py`: "
              "a Unix socket, pickle, a process blocked in epoll; no actors, futures or sessions). Costs are "
              "relative to the floor (a time ÷ the floor's; a rate: the floor's ÷ it). A target that allows "
              "less than 1× is beyond the floor: no Python implementation of that path meets it on this "
              "machine.\n\n"
              + ttable),
             "### Per run (so the noise is visible)\n\n" + per_run_table(impls, args.runs)]

    scaling_ok = True
    if not args.no_scaling and impls["monarch_core"] is not None:
        print("scaling.py (monarch-core only) ...", flush=True)
        scaling, scaling_ok = run_scaling(args, out_dir)
        parts.append(scaling)
    hosts_ok = True
    if not args.no_scale_hosts and impls["monarch_core"] is not None:
        if os.path.exists(os.path.join(os.environ.get("RT_RUN", "/tmp/rt"), "ssh", "ssh_config")):
            print("scale_hosts.py (4 ssh hosts x 8 procs x 32 actors over tls, monarch-core only) ...", flush=True)
            hosts, hosts_ok = run_scale_hosts(args, out_dir)
            parts.append(hosts)
        else:
            print("  scale_hosts skipped: the testbed is not up (scripts/testbed/netns-up.sh 4; "
                  "scripts/testbed/ssh-up.sh 4)", flush=True)
    rdma_ok = True
    if not args.no_rdma and impls["monarch_core"] is not None:
        print("rdma.py (RDMABuffer: monarch-core and Monarch) ...", flush=True)
        rdma, rdma_ok = run_rdma(args, out_dir)
        parts.append(rdma)
    summary = "\n\n".join(parts) + "\n"
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump({"definitions": definitions, "runs": args.runs, "quick": args.quick, "notes": notes,
                   "rows": data,
                   "per_run": {impl.key: {row.label: [row.value(impl.runs.get(i)) for i in range(1, args.runs + 1)]
                                          for row in ROWS} for impl in active},
                   "failures": {impl.key: impl.failures for impl in active},
                   "floors_per_run": floors}, f, indent=2)
        f.write("\n")
    print()
    print(summary)
    print(f"written: {os.path.join(out_dir, 'summary.md')}")
    failed = any(impl.failures for impl in active) or not active or not scaling_ok or not rdma_ok or not hosts_ok
    return 1 if failed else 0


# ------------------------------------------------------------------ RDMABuffer (bench/rdma.py)
#: (path, op, MiB) -> (bound on path ÷ Monarch, absolute GB/s floor or None): the issue's targets.
RDMA_TARGETS = {
    ("process_vm", "read", 64): (5.0, 4.0), ("process_vm", "write", 64): (5.0, 4.0),
    ("channel", "read", 64): (2.0, None), ("channel", "write", 64): (2.0, None),
}


def run_rdma(args: argparse.Namespace, out_dir: str) -> tuple[str, bool]:
    """bench/rdma.py for monarch-core and Monarch, interleaved ``--runs`` times; its table."""
    script = os.path.join(HERE, "rdma.py")
    impls = [Impl("rdma_monarch_core", "monarch-core", args.core_py, script, {"BENCH_IMPL": "monarch_core"})]
    notes = []
    if args.no_anchors:
        notes.append("Monarch skipped (--no-anchors)")
    elif os.access(args.monarch_py, os.X_OK):
        impls.append(Impl("rdma_monarch", "Monarch", args.monarch_py, script, {"BENCH_IMPL": "monarch"}))
    else:
        venv = os.path.dirname(os.path.dirname(os.path.abspath(args.monarch_py)))
        notes.append(f"Monarch skipped: no venv at {args.monarch_py}; create it with: " + INSTALL["monarch"].format(venv=venv))
    for i in range(1, args.runs + 1):
        order = impls[(i - 1) % len(impls):] + impls[:(i - 1) % len(impls)]
        print(f"rdma run {i}/{args.runs}: " + ", ".join(impl.title for impl in order), flush=True)
        for impl in order:
            run_child(impl, i, out_dir, args.quick, args.timeout, args.verbose)
    return rdma_table(impls, args.runs, notes, args.quick), not any(impl.failures for impl in impls)


def _rdma_value(r: dict[str, Any] | None, path_: str, op: str, size: int) -> float | None:
    for c in (r or {}).get("cases") or []:
        if c.get("path") == path_ and c.get("op") == op and c.get("size") == size:
            return c.get("gb_s")
    return None


def rdma_table(impls: list[Impl], runs: int, notes: list[str], quick: bool) -> str:
    core = impls[0]
    mon = impls[1] if len(impls) > 1 else None
    sizes = sorted({c["size"] for r in core.runs.values() for c in r.get("cases") or []})
    paths = [p for p in ("ibverbs", "process_vm", "channel")
             if any(c.get("path") == p for r in core.runs.values() for c in r.get("cases") or [])]

    def med(impl: Impl | None, path_: str, op: str, size: int) -> float | None:
        if impl is None:
            return None
        return T.median(_rdma_value(impl.runs.get(i), path_, op, size) for i in range(1, runs + 1))

    headers = ["transfer", *[f"{p}, GB/s" for p in paths], f"{mon.version() and 'Monarch ' + mon.version() or 'Monarch'} RDMABuffer, GB/s" if mon else "Monarch, GB/s",
               *[f"{p} ÷ Monarch" for p in paths], "target", "met?"]
    rows, all_met = [], True
    for op in ("read", "write", "endpoint arg"):
        for size in sizes:
            mib = size >> 20
            label = {"read": "read_into", "write": "write_from", "endpoint arg": "same tensor as an endpoint argument"}[op]
            if op == "endpoint arg":
                c, m = med(core, "endpoint arg", op, size), med(mon, "endpoint arg", op, size)
                rows.append([f"{label}, {mib} MiB", *[T.fmt(c, "{:.2f}") if p == paths[0] else T.DASH for p in paths],
                             T.fmt(m, "{:.2f}"), *[T.fmt(ratio(c, m), "{:.2f}×") if p == paths[0] else T.DASH for p in paths],
                             "(monarch-core's endpoint path, in the first column)", T.DASH])
                continue
            m = med(mon, "reference", op, size)
            vals = {p: med(core, p, op, size) for p in paths}
            targets, met_cells = [], []
            for p in paths:
                t = RDMA_TARGETS.get((p, op, mib))
                if t is None:
                    continue
                q = ratio(vals[p], m)
                ok = q is not None and q >= t[0] and (t[1] is None or (vals[p] or 0) >= t[1])
                all_met &= ok
                targets.append(f"{p} ≥ {t[0]:g}×" + (f" and ≥ {t[1]:g} GB/s" if t[1] else ""))
                met_cells.append("yes" if ok else "**no**")
            rows.append([f"{label}, {mib} MiB", *[T.fmt(vals[p], "{:.2f}") for p in paths], T.fmt(m, "{:.2f}"),
                         *[T.fmt(ratio(vals[p], m), "{:.2f}×") for p in paths],
                         "; ".join(targets) or T.DASH, ", ".join(met_cells) or T.DASH])
    head = [
        "## RDMABuffer: monarch-core's backends vs Monarch's RDMABuffer (bench/rdma.py)",
        "",
        (f"- one owner proc, this client reading/writing it, one host; GB/s = size ÷ median time; median over "
         f"{runs} interleaved run(s)" + (" — **--quick**" if quick else "")),
        "- monarch-core's paths are forced one at a time with MONARCH_RDMA_BACKEND; Monarch's RDMABuffer as it comes "
        "(its TCP fallback where there is no RDMA device)",
    ] + [f"- note: {n}" for n in notes] + [f"- {impl.title} FAILED {f}" for impl in impls for f in impl.failures]
    if not all_met:
        head.append("- **a target is not met**")
    return "\n".join(head) + "\n\n" + T.markdown(headers, rows, [False] + [True] * (len(headers) - 3) + [False, False])


def run_scaling(args: argparse.Namespace, out_dir: str) -> tuple[str, bool]:
    """Run scaling.py in a child; its markdown, and whether it succeeded."""
    md = os.path.join(out_dir, "scaling.md")
    argv = [args.core_py, os.path.join(HERE, "scaling.py"), "--out", os.path.join(out_dir, "scaling.json"),
            "--md", md] + (["--quick"] if args.quick else [])
    return _run_md_child("scaling", argv, md, out_dir, args.timeout, "## Scaling")


def run_scale_hosts(args: argparse.Namespace, out_dir: str) -> tuple[str, bool]:
    """Run scale_hosts.py in a child (it bounds its own client with --timeout); its markdown, and
    whether it succeeded (a failure, or a process left on the hosts, is exit status 1)."""
    md = os.path.join(out_dir, "scale_hosts.md")
    argv = [args.core_py, os.path.join(HERE, "scale_hosts.py"), "--json", os.path.join(out_dir, "scale_hosts.json"),
            "--md", md, "--timeout", str(args.timeout)] + (["--repeats", "20", "--warmup", "3"] if args.quick else [])
    return _run_md_child("scale_hosts", argv, md, out_dir, args.timeout + 120, "## Scale across hosts")


def _run_md_child(name: str, argv: list[str], md: str, out_dir: str, timeout: float, heading: str) -> tuple[str, bool]:
    """Run ``argv`` in its own process group (log: ``<out_dir>/<name>.log``) within
    ``timeout`` seconds; the markdown it wrote to ``md``, and whether it succeeded."""
    log_path = os.path.join(out_dir, f"{name}.log")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=out_dir, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
        if _group_members(proc.pid):
            _kill_group(proc)
    dt = time.monotonic() - t0
    text = ""
    if os.path.exists(md):
        with open(md) as f:
            text = f.read().strip()
    if rc == 0 and text:
        print(f"  {name + ' ok':<16} {dt:6.1f} s", flush=True)
        return text, True
    why = "timed out" if rc is None else f"exit status {rc}"
    print(f"  {name} FAILED ({why}); last lines of {log_path}:", flush=True)
    for line in _tail(log_path, 25):
        print(f"    | {line}", flush=True)
    return (text + "\n\n" if text else heading + "\n\n") + f"{os.path.basename(argv[1])} FAILED ({why}); see {log_path}", False


if __name__ == "__main__":
    sys.exit(main())
