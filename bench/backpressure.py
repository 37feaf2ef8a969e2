"""Client memory under a burst of broadcasts to a slow actor (flow control).

    python bench/backpressure.py                      # both cases, 10 ms per message
    python bench/backpressure.py --delay 0.001        # a faster slow actor
    python bench/backpressure.py --cases 1k --count 50000 --out bp.json
    MONARCH_SEND_WINDOW_MB=8 python bench/backpressure.py   # the window is read from the environment

Each case runs in a fresh child interpreter (so that its peak RSS is its own): one worker
proc with one actor whose endpoint sleeps ``--delay`` seconds per message; the client calls
``broadcast(payload)`` ``count`` times as fast as it can.  The figures:

  issue, s        wall time until the last ``broadcast()`` returned
  client peak     the client's VmHWM (peak RSS) at the end, MiB
  in flight max   the most messages the client held for the worker at any one sample
                  (every 20 ms): the kernel's ``_Outbound`` queue + unacknowledged, plus the
                  messages not yet handed to it (``Kernel._tx``)
  in flight MiB   the same in bytes (count x frame size), max
  window max      with flow control: the most messages / MiB the send window counted
  worker peak     the worker's VmHWM at the end of the issue, MiB (its mailbox holds what
                  it received and has not handled yet)

Nothing waits for the actor to handle the messages (200 000 x 10 ms would be half an
hour): once the last broadcast returned and a last sample is taken, the worker is killed
and the child exits.  The script runs unchanged against a kernel without flow control (the
figures before it).  Every child is bounded by ``--timeout``.
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

CASES = {"1k": (200_000, 1024), "64k": (20_000, 64 * 1024)}


def _status_kib(pid: int | str, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def child(count: int, size: int, delay: float) -> dict:
    import monarch_core.actor as mactor
    from monarch_core._proc import _state
    from monarch_core.actor import Actor, endpoint, this_host

    mactor.unhandled_fault_hook = lambda failure: None  # the worker is killed at the end

    class Slow(Actor):
        def __init__(self, delay: float) -> None:
            self.delay = delay

        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def take(self, x: bytes) -> None:
            time.sleep(self.delay)

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    slow = procs.spawn("slow", Slow, delay)
    wpid = slow.pid.call_one().get(timeout=60)
    kernel = _state.current().kernel  # (the mesh above started the runtime)
    frame = size + 200  # payload + pickle + header, roughly
    peak = {"msgs": 0, "window_msgs": 0, "window_bytes": 0}
    stop = threading.Event()

    def sample() -> None:
        msgs = len(kernel._tx)
        for out in list(kernel._outbound.values()):
            msgs += len(out.queue) + len(out.unacked)
        peak["msgs"] = max(peak["msgs"], msgs)
        if hasattr(kernel, "send_window"):  # flow control: the window's own count (messages, bytes)
            for proc_id in list(kernel._outbound):
                m, b = kernel.send_window(proc_id)
                peak["window_msgs"] = max(peak["window_msgs"], m)
                peak["window_bytes"] = max(peak["window_bytes"], b)

    def sampler() -> None:
        while not stop.wait(0.02):
            sample()

    t = threading.Thread(target=sampler, daemon=True)
    t.start()
    payload = b"x" * size
    take = slow.take
    t0 = time.perf_counter()
    for _ in range(count):
        take.broadcast(payload)
    issue = time.perf_counter() - t0
    stop.set()
    t.join()
    sample()
    out = {
        "count": count,
        "size": size,
        "delay": delay,
        "issue_s": issue,
        "client_peak_mib": _status_kib("self", "VmHWM") / 1024,
        "inflight_max_msgs": peak["msgs"],
        "inflight_max_mib": peak["msgs"] * frame / (1 << 20),
        "window_max_msgs": peak["window_msgs"],
        "window_max_mib": peak["window_bytes"] / (1 << 20),
        "worker_peak_mib": _status_kib(wpid, "VmHWM") / 1024,
        "window_setting": {k: os.environ.get(k) for k in ("MONARCH_SEND_WINDOW_MB", "MONARCH_SEND_WINDOW_MSGS")},
    }
    try:
        from monarch_core._kernel import _runtime

        out["window_limits"] = [getattr(_runtime, "SEND_WINDOW_BYTES", None), getattr(_runtime, "SEND_WINDOW_MSGS", None)]
    except Exception:  # noqa: BLE001
        pass
    os.kill(wpid, signal.SIGKILL)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="1k,64k", help="comma-separated: 1k (200 000 x 1 KiB), 64k (20 000 x 64 KiB)")
    ap.add_argument("--count", type=int, default=None, help="messages per case (default: the case's)")
    ap.add_argument("--delay", type=float, default=0.01, help="seconds the actor sleeps per message (default 0.01)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds each case may take (default 600)")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--child", nargs=3, metavar=("COUNT", "SIZE", "DELAY"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        r = child(int(a.child[0]), int(a.child[1]), float(a.child[2]))
        sys.stdout.write("RESULT " + json.dumps(r) + "\n")
        sys.stdout.flush()
        os._exit(0)
    rows = []
    for name in a.cases.split(","):
        count, size = CASES[name]
        if a.count:
            count = a.count
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(count), str(size), str(a.delay)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, _ = p.communicate(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            print(f"{name}: timed out after {a.timeout:.0f}s", file=sys.stderr)
            continue
        line = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            print(f"{name}: no result (exit {p.returncode})", file=sys.stderr)
            continue
        r = json.loads(line[-1][7:])
        r["case"] = name
        rows.append(r)
    print("| case | delay | issue, s | client peak RSS, MiB | in flight max, msgs | in flight max, MiB "
          "| window max, msgs / MiB | worker peak RSS, MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        win = (f"{r['window_max_msgs']} / {r['window_max_mib']:.1f}" if r.get("window_limits", [None])[0] is not None
               else "no window")
        print(f"| {r['count']} x {r['size'] // 1024} KiB | {r['delay'] * 1000:g} ms | {r['issue_s']:.1f} | "
              f"{r['client_peak_mib']:.0f} | {r['inflight_max_msgs']} | {r['inflight_max_mib']:.1f} | {win} | "
              f"{r['worker_peak_mib']:.0f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
