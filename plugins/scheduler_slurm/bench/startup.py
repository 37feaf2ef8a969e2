"""Start-up figures of the slurm scheduler on a real cluster (docs/slurm.md, "Figures").

    SLURM_CONF=/tmp/rt/slurm/slurm.conf python plugins/scheduler_slurm/bench/startup.py [--runs 3] [--nodes 3]

* **inside**: one ``sbatch -N<nodes>`` job that, ``--runs`` times, times
  ``hosts_from_config(...)`` (entry ``scheduler = "slurm"``) to the first reply of
  ``nodes`` x 4 actors, and the floor ``srun -N<nodes> python -c 'import monarch_core.actor'``
  (a job step that only starts Python and imports the API on every node);
* **outside**: ``--runs`` clients on this host, each timing ``hosts_from_config(...)``
  (an entry with ``nodes``, so a batch job is submitted) to the first reply, split
  into submit -> the job runs (Slurm's scheduling: ``batch_sched_delay`` and its
  ~1 s tick), the job runs -> every worker answers, and -> the first reply.

Prints one JSON object (medians, and every run).  Standard library plus monarch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

INSIDE = r'''
import json, os, re, subprocess, sys, time
t0 = time.monotonic()
from monarch_core.actor import Actor, endpoint, hosts_from_config
import_s = time.monotonic() - t0

class Ping(Actor):
    @endpoint
    def ping(self):
        return os.getpid()

runs, floors = [], []
for i in range(int(sys.argv[1])):
    f0 = time.monotonic()
    subprocess.run(["srun", "--overlap", f"-N{os.environ['SLURM_JOB_NUM_NODES']}", sys.executable, "-c",
                    "import monarch_core.actor"], check=True, timeout=120)
    floors.append(time.monotonic() - f0)
    t0 = time.monotonic()
    hm = hosts_from_config("bench")
    t1 = time.monotonic()
    pm = hm.spawn_procs(per_host={"gpus": 4})
    n = len(pm.spawn("ping", Ping).ping.call().get(timeout=120).values())
    t2 = time.monotonic()
    hm.shutdown().get(timeout=60)
    runs.append({"hosts_ready_s": t1 - t0, "first_reply_s": t2 - t0, "actors": n})
print("RESULT " + json.dumps({"runs": runs, "floor_s": floors, "client_import_s": import_s}), flush=True)
'''

OUTSIDE = r'''
import json, logging, re, sys, time
marks = {}

class Marks(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if "submitted Slurm job" in msg:
            marks["submitted"] = time.monotonic()
        elif re.search(r"Slurm job \d+ runs on", msg):
            marks["running"] = time.monotonic()

logging.getLogger("monarch.slurm").addHandler(Marks())
logging.getLogger("monarch.slurm").setLevel(logging.INFO)
from monarch_core.actor import Actor, endpoint, hosts_from_config

class Ping(Actor):
    @endpoint
    def ping(self):
        return 1

t0 = time.monotonic()
hm = hosts_from_config("bench")
t1 = time.monotonic()
pm = hm.spawn_procs(per_host={"gpus": 4})
n = len(pm.spawn("ping", Ping).ping.call().get(timeout=120).values())
t2 = time.monotonic()
hm.shutdown().get(timeout=60)
print("RESULT " + json.dumps({
    "submit_s": marks["submitted"] - t0, "queue_s": marks["running"] - marks["submitted"],
    "workers_s": t1 - marks["running"], "first_reply_after_hosts_s": t2 - t1, "total_s": t2 - t0, "actors": n}))
'''


def _result(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"no RESULT line in:\n{text[-4000:]}")


def inside(d: str, runs: int, nodes: int) -> dict:
    with open(os.path.join(d, "monarch.toml"), "w") as f:
        f.write('[hosts.bench]\nscheduler = "slurm"\n')
    with open(os.path.join(d, "prog.py"), "w") as f:
        f.write(INSIDE)
    script = f"#!/bin/sh\ncd {d} && exec {sys.executable} prog.py {runs}\n"
    out = os.path.join(d, "inside.txt")
    subprocess.run(["timeout", "600", "sbatch", "--wait", f"-N{nodes}", "--job-name=mbench", f"--output={out}"],
                   input=script, text=True, check=True, timeout=660)
    with open(out) as f:
        res = _result(f.read())
    res["median_first_reply_s"] = statistics.median(r["first_reply_s"] for r in res["runs"])
    res["median_hosts_ready_s"] = statistics.median(r["hosts_ready_s"] for r in res["runs"])
    res["median_floor_s"] = statistics.median(res["floor_s"])
    return res


def outside(d: str, runs: int, nodes: int) -> dict:
    with open(os.path.join(d, "monarch.toml"), "w") as f:
        f.write(f'[hosts.bench]\nscheduler = "slurm"\nnodes = {nodes}\ntime = "00:05:00"\njob_name = "mbench"\n')
    with open(os.path.join(d, "prog.py"), "w") as f:
        f.write(OUTSIDE)
    all_runs = []
    for _ in range(runs):
        res = subprocess.run([sys.executable, "prog.py"], cwd=d, capture_output=True, text=True, timeout=300)
        all_runs.append(_result(res.stdout + res.stderr))
    keys = ("submit_s", "queue_s", "workers_s", "first_reply_after_hosts_s", "total_s")
    return {"runs": all_runs, **{f"median_{k}": statistics.median(r[k] for r in all_runs) for k in keys}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as d:  # a directory the nodes share
        out = {"inside": inside(d, args.runs, args.nodes), "outside": outside(d, args.runs, args.nodes)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
