"""What an open dashboard costs: ``call_one`` latency and pipelined throughput with
the dashboard closed, and with it serving a live page (not asserted; the target is
within 3 %).

    python bench/dashboard_overhead.py                 # 5 alternating rounds of the two modes
    python bench/dashboard_overhead.py --rounds 3 --calls 20000 --burst 10000 --out d.json

Each measurement runs in a fresh child interpreter (one proc, one actor, ``ipc``), as in
``telemetry_overhead.py`` (same figures: p50 / p99 of sequential ``call_one().get()``, the
median rate of three pipelined bursts, CPU per pipelined call of client + proc).

Modes:

  closed  the default: endpoint metrics on, no dashboard
  open    ``monarch_dashboard.start()`` in the client, and another process following the
          Endpoints page's live stream (``/events?page=endpoints``, with the token's cookie),
          as an open browser tab does: each telemetry interval the client re-renders the page
          and sends it

Rounds alternate the modes; the table holds the medians and each mode's ratio to
``closed`` (``paired``: the median of the per-round ratios).  Needs monarch-dashboard
(``pip install ./plugins/dashboard`` or ``PYTHONPATH=plugins/dashboard``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

READER = textwrap.dedent(
    """
    import http.client, sys
    port, token = int(sys.argv[1]), sys.argv[2]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", f"/events?page=endpoints&token={token}", headers={"Host": f"127.0.0.1:{port}"})
    r = conn.getresponse()
    assert r.status == 200, r.status
    while r.read1(65536):
        pass
    """
)

CHILD = textwrap.dedent(
    """
    import json, os, resource, statistics, sys, time
    from monarch_core.actor import Actor, endpoint, this_host

    def cpu():  # user + system seconds of this process (µs resolution)
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    class W(Actor):
        @endpoint
        def noop(self) -> None:
            return None

        @endpoint
        def cpu(self) -> float:
            return cpu()

    calls, burst, warmup = (int(x) for x in sys.argv[1:4])
    reader = None
    if sys.argv[4] == "open":  # the dashboard, and a page of it open and following its live stream
        import subprocess
        from monarch_dashboard import start
        d = start(port=0)
        reader = subprocess.Popen([sys.executable, "-c", sys.argv[5], str(d.port), d.token], stdout=subprocess.DEVNULL)
    procs = this_host().spawn_procs()
    one = procs.spawn("w", W)
    one.cpu.call_one().get()
    for _ in range(warmup):
        one.noop.call_one().get()
    lat = []
    pc = time.perf_counter_ns
    for _ in range(calls):
        t0 = pc()
        one.noop.call_one().get()
        lat.append(pc() - t0)
    lat.sort()
    rates = []
    for i in range(4):
        if i == 1:
            s0 = one.cpu.call_one().get()
            c0 = cpu()
        t0 = time.perf_counter()
        futs = [one.noop.call_one() for _ in range(burst)]
        for f in futs:
            f.get()
        dt = time.perf_counter() - t0
        if i:
            rates.append(burst / dt)
    c1 = cpu()
    s1 = one.cpu.call_one().get()
    client_us = (c1 - c0) / (3 * burst) * 1e6
    proc_us = (s1 - s0) / (3 * burst) * 1e6
    procs.stop().get()
    if reader is not None:
        reader.kill()
        reader.wait()
    print(json.dumps({"p50_us": lat[len(lat) // 2] / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
                      "rate": statistics.median(rates), "cpu_us": client_us + proc_us,
                      "client_cpu_us": client_us, "proc_cpu_us": proc_us}))
    """
)


def run(mode: str, args: argparse.Namespace, tmp: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["XDG_RUNTIME_DIR"] = tmp
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(here, "..", "plugins", "dashboard"), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.calls), str(args.burst), str(args.warmup), mode, READER],
        capture_output=True, text=True, env=env, timeout=args.timeout, check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--burst", type=int, default=10000)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--modes", default="closed,open")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=None, help="write every figure as JSON here")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            for m in order:
                res = run(m, args, tmp)
                results[m].append(res)
                print(f"round {r + 1} {m:8} p50 {res['p50_us']:7.1f} µs  p99 {res['p99_us']:7.1f} µs  "
                      f"{res['rate']:9.0f} calls/s  {res['cpu_us']:5.1f} µs CPU/call "
                      f"({res['client_cpu_us']:.1f} client + {res['proc_cpu_us']:.1f} proc)", file=sys.stderr, flush=True)
    keys = ("p50_us", "p99_us", "rate", "cpu_us")
    med = {m: {k: statistics.median(x[k] for x in results[m]) for k in keys} for m in modes}
    base = med.get("closed")
    # paired: each round runs every mode back to back, so the ratio within a round cancels the
    # slow and fast phases of a shared machine; the median of those ratios over the rounds
    paired = {m: statistics.median(x["rate"] / o["rate"] for x, o in zip(results[m], results["closed"]))
              for m in modes} if base else {}
    print("| mode | call_one p50, µs | p99, µs | pipelined, calls/s | CPU per pipelined call, µs "
          "| p50 ÷ closed | calls/s ÷ closed | calls/s ÷ closed, paired | CPU ÷ closed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        v = med[m]
        r = {k: f"{v[k] / base[k]:.3f}" if base else "—" for k in keys}
        pr = f"{paired[m]:.3f}" if base else "—"
        print(f"| {m} | {v['p50_us']:.1f} | {v['p99_us']:.1f} | {v['rate']:.0f} | {v['cpu_us']:.1f} "
              f"| {r['p50_us']} | {r['rate']} | {pr} | {r['cpu_us']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": results, "medians": med, "paired_rate_ratio": paired}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
