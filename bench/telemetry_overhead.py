"""What instrumentation costs: ``call_one`` latency and pipelined throughput with
telemetry off, with the default endpoint metrics, and with spans + the trace file.

    python bench/telemetry_overhead.py                 # 5 alternating rounds of the three modes
    python bench/telemetry_overhead.py --rounds 3 --calls 20000 --burst 10000 --out t.json

Each measurement runs in a fresh child interpreter (one proc, one actor, ``ipc``):

  latency     ``one.noop.call_one().get()`` sequential: ``--warmup`` calls, then ``--calls``;
              p50 / p99 in µs.
  throughput  ``--burst`` ``call_one()`` issued, then ``.get()`` on each; 3 bursts after one
              warm-up burst; the median rate in calls/s, and the CPU (user + system, of the client
              and of the proc, from getrusage, over the three bursts) per call in µs -- steadier
              than the rate on a shared machine, where the rate follows the other load.

Modes (environment of the child; the procs inherit it):

  off      ``MONARCH_TELEMETRY=0``: no metrics, no spans, no lifecycle events
  metrics  the default: endpoint metrics on, no spans
  trace    ``MONARCH_TRACE_FILE=<tmp>/trace.json``: metrics, a span per call on both sides and
           the Chrome trace file written

Rounds alternate the modes (off, metrics, trace; then metrics, trace, off; ...) so that a
noisy phase of a shared machine hits all of them; the table holds the median over the rounds,
each mode's ratio to ``off``, and the median over the rounds of each round's own throughput
ratio (``paired``: the modes of one round ran back to back).  Standard library and monarch_core only.
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
from typing import Callable

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
    {setup}
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
    {teardown}
    print(json.dumps({{"p50_us": lat[len(lat) // 2] / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
                      "rate": statistics.median(rates), "cpu_us": client_us + proc_us,
                      "client_cpu_us": client_us, "proc_cpu_us": proc_us}}))
    """
)


def child(setup: str = "", teardown: str = "") -> str:
    """The measuring child's code, with ``setup`` run before its proc is spawned and
    ``teardown`` after it is stopped (each one statement line of the child, or empty)."""
    return CHILD.format(setup=setup, teardown=teardown)


def mode_env(mode: str, tmp: str) -> dict[str, str]:
    """The child's environment for ``mode``: no ``MONARCH_*`` of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    if mode == "off":
        env["MONARCH_TELEMETRY"] = "0"
    elif mode == "trace":
        env["MONARCH_TRACE_FILE"] = os.path.join(tmp, f"trace-{os.getpid()}.json")
    return env


def run(mode: str, args: argparse.Namespace, env: dict[str, str], code: str, extra: list[str]) -> dict:
    """One measurement of ``mode`` in a fresh child interpreter running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", code, str(args.calls), str(args.burst), str(args.warmup), *extra],
        capture_output=True, text=True, env=env, timeout=args.timeout, check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} run failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def rounds(description: str, default_modes: str, base: str,
           mode_run: Callable[[str, argparse.Namespace, str], dict]) -> int:
    """The command: parse the arguments, run every mode once per round (rounds
    alternate the order) through ``mode_run(mode, args, tmp)``, print the medians
    and each mode's ratio to ``base`` (paired: the median of the per-round ratios)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--burst", type=int, default=10000)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--modes", default=default_modes)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=None, help="write every figure as JSON here")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            for m in order:
                res = mode_run(m, args, tmp)
                results[m].append(res)
                print(f"round {r + 1} {m:8} p50 {res['p50_us']:7.1f} µs  p99 {res['p99_us']:7.1f} µs  "
                      f"{res['rate']:9.0f} calls/s  {res['cpu_us']:5.1f} µs CPU/call "
                      f"({res['client_cpu_us']:.1f} client + {res['proc_cpu_us']:.1f} proc)", file=sys.stderr, flush=True)
    keys = ("p50_us", "p99_us", "rate", "cpu_us")
    med = {m: {k: statistics.median(x[k] for x in results[m]) for k in keys} for m in modes}
    ref = med.get(base)
    # paired: each round runs every mode back to back, so the ratio within a round cancels the
    # slow and fast phases of a shared machine; the median of those ratios over the rounds
    paired = {m: statistics.median(x["rate"] / o["rate"] for x, o in zip(results[m], results[base]))
              for m in modes} if ref else {}
    print("| mode | call_one p50, µs | p99, µs | pipelined, calls/s | CPU per pipelined call, µs "
          f"| p50 ÷ {base} | calls/s ÷ {base} | calls/s ÷ {base}, paired | CPU ÷ {base} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        v = med[m]
        r = {k: f"{v[k] / ref[k]:.3f}" if ref else "—" for k in keys}
        pr = f"{paired[m]:.3f}" if ref else "—"
        print(f"| {m} | {v['p50_us']:.1f} | {v['p99_us']:.1f} | {v['rate']:.0f} | {v['cpu_us']:.1f} "
              f"| {r['p50_us']} | {r['rate']} | {pr} | {r['cpu_us']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": results, "medians": med, "paired_rate_ratio": paired}, f, indent=1)
    return 0


def main() -> int:
    code = child()
    return rounds(__doc__.split("\n\n")[0], "off,metrics,trace", "off",
                  lambda mode, args, tmp: run(mode, args, mode_env(mode, tmp), code, []))


if __name__ == "__main__":
    sys.exit(main())
