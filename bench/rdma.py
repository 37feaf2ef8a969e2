"""RDMABuffer throughput: monarch-core's backends and the reference's, same definitions.

    BENCH_IMPL=monarch_core python bench/rdma.py --out core.json [--quick]
    BENCH_IMPL=monarch /tmp/anchors/monarch/bin/python bench/rdma.py --out monarch.json

One owner proc (an actor holding a uint8 tensor) and this client as the
holder, on one host.  For each size (1 MiB, 64 MiB, 1 GiB; --quick: 1 MiB and
64 MiB) and each data path:

* ``read``:  ``buf.read_into(dst).get()``, ``buf`` an ``RDMABuffer`` over the first
  ``size`` bytes of the owner's tensor, ``dst`` a preallocated tensor here;
* ``write``: ``buf.write_from(src).get()``;
* ``endpoint arg``: ``owner.take.call_one(t).get()`` with a tensor of that size
  (the same bytes sent as an endpoint argument; the endpoint returns ``None``).

Data paths: monarch-core's ``process_vm``, ``channel`` (and ``ibverbs`` where a
device exists), each forced with ``MONARCH_RDMA_BACKEND``; the reference's
``RDMABuffer`` as it comes (its TCP fallback on a machine without RDMA).
Each figure: GB/s (10^9 bytes/s) = size / the median of the timed repeats
(1 MiB: 50, 64 MiB: 10, 1 GiB: 3; --quick: 10, 3), after one untimed
warm-up.  Bytes are checked once per path and size (first and last bytes).
Standard library + torch only; prints a line per figure and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

IMPL = os.environ.get("BENCH_IMPL", "monarch_core")
if IMPL == "monarch":
    from monarch.actor import Actor, endpoint, this_host
    from monarch.rdma import RDMABuffer
else:
    from monarch_core.actor import Actor, endpoint, this_host
    from monarch_core.rdma import RDMABuffer

import torch

MiB = 1 << 20


class Owner(Actor):
    def __init__(self, nbytes: int) -> None:
        self.t = (torch.arange(nbytes, dtype=torch.int64) % 251).to(torch.uint8)
        self.bufs: dict = {}

    @endpoint
    def buf(self, n: int) -> RDMABuffer:
        if n not in self.bufs:
            self.bufs[n] = RDMABuffer(self.t[:n])
        return self.bufs[n]

    @endpoint
    def take(self, t) -> None:
        return None


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torchmonarch" if IMPL == "monarch" else "monarch-core")
    except metadata.PackageNotFoundError:
        return "?"


def _paths() -> list[str]:
    if IMPL == "monarch":
        return ["reference"]
    from monarch_core.rdma import is_ibverbs_available

    paths = ["process_vm", "channel"]
    return (["ibverbs"] if is_ibverbs_available() else []) + paths


def _time(fn, reps: int) -> list[float]:
    fn()  # warm-up: connection, page faults, pools
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON results file")
    ap.add_argument("--quick", action="store_true", help="1 MiB and 64 MiB only, fewer repeats")
    ap.add_argument("--sizes", help="comma-separated MiB (default 1,64,1024; quick 1,64)")
    args = ap.parse_args(argv)
    sizes = [int(s) * MiB for s in args.sizes.split(",")] if args.sizes else ([MiB, 64 * MiB] if args.quick else [MiB, 64 * MiB, 1024 * MiB])
    reps = {MiB: 10 if args.quick else 50, 64 * MiB: 3 if args.quick else 10}
    result: dict = {"impl": IMPL, "version": _version(), "python": sys.version.split()[0], "quick": args.quick,
                    "cases": [], "errors": {}, "load_start": os.getloadavg()[0]}
    procs = this_host().spawn_procs(per_host={"procs": 1})
    owner = procs.spawn("owner", Owner, max(sizes))
    try:
        for n in sizes:
            r = reps.get(n, 3)
            dst = torch.empty(n, dtype=torch.uint8)
            src = (torch.arange(n, dtype=torch.int64) % 7).to(torch.uint8)
            for path in _paths():
                if path != "reference":
                    os.environ["MONARCH_RDMA_BACKEND"] = path
                try:
                    buf = owner.buf.call_one(n).get()
                    for op in ("read", "write"):
                        fn = ((lambda b=buf, d=dst: b.read_into(d).get()) if op == "read"
                              else (lambda b=buf, s=src: b.write_from(s).get()))
                        times = _time(fn, r)
                        if op == "read":
                            # the owner's pattern (i % 251), or what an earlier path's write put there (i % 7)
                            last = int(dst[n - 1])
                            assert int(dst[0]) == 0 and last in ((n - 1) % 251, (n - 1) % 7), "wrong bytes"
                        med = statistics.median(times)
                        case = {"case": f"{op} {n // MiB} MiB", "op": op, "size": n, "path": path,
                                "gb_s": n / med / 1e9, "median_s": med, "times_s": times}
                        result["cases"].append(case)
                        print(f"{IMPL:13} {path:10} {op:5} {n // MiB:5} MiB  {case['gb_s']:6.2f} GB/s", flush=True)
                    if path != "reference":
                        used = buf.backend
                        assert used == path, f"forced {path}, got {used}"
                except Exception:  # noqa: BLE001 - one path failing must not lose the others
                    result["errors"][f"{path} {n // MiB} MiB"] = traceback.format_exc()
                    print(f"{IMPL:13} {path:10} {n // MiB} MiB FAILED\n{traceback.format_exc()}", flush=True)
            os.environ.pop("MONARCH_RDMA_BACKEND", None)
            try:
                times = _time(lambda s=src: owner.take.call_one(s).get(), r)
                med = statistics.median(times)
                result["cases"].append({"case": f"endpoint arg {n // MiB} MiB", "op": "endpoint arg", "size": n,
                                        "path": "endpoint arg", "gb_s": n / med / 1e9, "median_s": med,
                                        "times_s": times})
                print(f"{IMPL:13} {'endpoint':10} arg   {n // MiB:5} MiB  {n / med / 1e9:6.2f} GB/s", flush=True)
            except Exception:  # noqa: BLE001
                result["errors"][f"endpoint arg {n // MiB} MiB"] = traceback.format_exc()
            del dst, src
    finally:
        result["load_end"] = os.getloadavg()[0]
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
        try:
            procs.stop().get(timeout=30)
        except Exception:  # noqa: BLE001
            pass
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
