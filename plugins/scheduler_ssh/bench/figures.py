"""The SSH scheduler's figures, on the project's testbed (network-namespace
hosts h1..h3 with real sshd; see tests/_helpers/testbed.py):

* bring-up of 3 hosts x 4 procs through ``hosts_from_config`` (SSH connect,
  worker start, readiness; then spawn, first reply from all 12), in a fresh
  client each time, against the floor: plain ``ssh hI python -c 'import
  monarch_core.actor'`` to the same hosts, concurrently; and the CPU time every
  process on this machine used for each (the hosts share its kernel and its
  cores: the CPU divided by the cores bounds the wall time from below); and
  the same bring-up with the client's own imports (monarch, paramiko, trio,
  cryptography) done before the clock starts: what the hosts' side and the
  protocol cost, the client's start-up aside (the clients reuse bytecode
  from a cache of the run's own, filled by a discarded warm-up round);
* SIGKILL of a client holding 3 hosts x 4 procs: time until every remote
  worker and proc is gone;
* ``call_one`` round trip from the client to an actor on h1 across the
  namespace link over tls, against plain tcp across the same link (its floor:
  the same path, nothing encrypted) and a proc of ``this_host()`` over ipc.

    python plugins/scheduler_ssh/bench/figures.py [--repeats 5] [--calls 2000] [--json out.json]

Run from a monarch-core checkout with the testbed up (``scripts/testbed/netns-up.sh 4;
scripts/testbed/ssh-up.sh 4``).  Medians over repeats; the machine is shared and noisy,
so compare figures of one run only.
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
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
RT = Path(os.environ.get("RT_RUN", "/tmp/rt"))
CODE = os.pathsep.join([str(REPO), str(REPO / "plugins" / "transport_tcp")])
HOSTS = ["h1", "h2", "h3"]

BRINGUP = r'''
import json, os, sys, time
def busy():  # CPU seconds every process on this machine used so far (the hosts share its kernel)
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
if sys.argv[1:] == ["warm"]:  # the client's own imports before the clock: what the remote side and the protocol cost
    import monarch_core.actor
    from monarch_core._plugins import registry
    reg = registry()
    reg.scheduler("ssh")  # paramiko
    reg.transport("tls")  # trio, ssl
    import monarch_transport_tcp._pki  # cryptography (session credentials)
c0 = busy()
t0 = time.monotonic()
from monarch_core.actor import Actor, endpoint, hosts_from_config
class A(Actor):
    @endpoint
    def ping(self):
        return 1
hm = hosts_from_config("bench")
t_up = time.monotonic() - t0
procs = hm.spawn_procs(per_host={"gpus": 4})
replies = procs.spawn("a", A).ping.call().get(timeout=120).values()
t_all = time.monotonic() - t0
cpu = busy() - c0
assert len(replies) == 12
print(json.dumps({"up": t_up, "first_reply_all": t_all, "cpu": cpu}))
hm.shutdown().get(timeout=60)
'''

CALLS = r'''
import json, sys, time
from monarch_core.actor import Actor, endpoint, hosts_from_config, this_host
class A(Actor):
    @endpoint
    def ping(self, x):
        return x
n = int(sys.argv[1])
if sys.argv[2] == "tls":
    hm = hosts_from_config("bench1")
    procs = hm.spawn_procs()
elif sys.argv[2] == "tcp":  # the floor of the same link: plain tcp, nothing authenticated
    from monarch_core.actor import enable_transport
    enable_transport("tcp://10.250.0.1:0")
    hm = hosts_from_config("bench1tcp")
    procs = hm.spawn_procs()
else:
    hm = None
    procs = this_host().spawn_procs()
a = procs.spawn("a", A)
for i in range(200):
    a.ping.call_one(i).get()
lat = []
for i in range(n):
    t = time.perf_counter()
    a.ping.call_one(i).get()
    lat.append(time.perf_counter() - t)
lat.sort()
print(json.dumps({"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
                  "address": a.ping.call_one(0).get() is not None}))
if hm is not None:
    hm.shutdown().get(timeout=60)
'''


HOLD = r'''
import json, os, time
from monarch_core.actor import Actor, endpoint, hosts_from_config
class A(Actor):
    @endpoint
    def pid(self):
        return os.getpid()
hm = hosts_from_config("bench")
procs = hm.spawn_procs(per_host={"gpus": 4}).spawn("a", A).pid.call().get(timeout=120).values()
print(json.dumps({"pids": procs + [int(h.labels["pid"]) for h in hm.hosts]}), flush=True)
time.sleep(300)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def sigkill_once(env: dict[str, str]) -> float:
    """SIGKILL a client holding 3 hosts x 4 procs: seconds until every remote
    worker and proc is gone (the hosts share this machine's pid space)."""
    p = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None
        pids = json.loads(p.stdout.readline())["pids"]
        t0 = time.monotonic()
        p.kill()
        while any(_alive(x) for x in pids):
            if time.monotonic() - t0 > 60:
                raise SystemExit(f"left running 60 s after SIGKILL: {[x for x in pids if _alive(x)]}")
            time.sleep(0.002)
        return time.monotonic() - t0
    finally:
        p.kill()
        p.wait()


def _env(cfg: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["PYTHONPATH"] = os.pathsep.join([CODE, env.get("PYTHONPATH", "")]).strip(os.pathsep)
    # The client reuses bytecode, as an installed package has it: this environment may set
    # PYTHONDONTWRITEBYTECODE=1, with which every module the hosts do not import (the ssh
    # plugin, the tls credentials) was compiled again in each client (~25 ms). The bytecode
    # goes under a cache of the run's own, not into the checkout; the warm-up round fills it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cfg.parent / "pycache")
    env["MONARCH_CONFIG"] = str(cfg)
    return env


def _run(code: str, *args: str, env: dict[str, str], timeout: float = 300) -> dict:
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                         env=env, timeout=timeout, check=False)
    if res.returncode != 0:
        raise SystemExit(f"client failed (rc {res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def busy_cpu() -> float:
    """CPU seconds every process on this machine used so far (``/proc/stat``;
    the namespace hosts share its kernel)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def floor_once() -> tuple[float, float]:
    """Plain OpenSSH to every host at once, each importing monarch_core.actor:
    (seconds, CPU seconds of the whole machine)."""
    cmd = f"PYTHONPATH={CODE} {sys.executable} -c 'import monarch_core.actor'"
    errs: list[str] = []

    def one(h: str) -> None:
        r = subprocess.run(["ssh", "-F", str(RT / "ssh" / "ssh_config"), h, cmd], capture_output=True, text=True,
                           timeout=60, check=False)
        if r.returncode != 0:
            errs.append(f"{h}: {r.stderr}")

    c0 = busy_cpu()
    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(h,)) for h in HOSTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise SystemExit("ssh floor failed: " + "; ".join(errs))
    return time.monotonic() - t0, busy_cpu() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ssh-figures-") as d:
        cfg = Path(d) / "monarch.toml"
        common = (f'scheduler = "ssh"\nssh_config = "{RT / "ssh" / "ssh_config"}"\n'
                  f'env = {{ PYTHONPATH = "{CODE}" }}\n')
        cfg.write_text(f'[hosts.bench]\nhosts = {json.dumps(HOSTS)}\n{common}\n'
                       f'[hosts.bench1]\nhosts = ["h1"]\n{common}\n'
                       f'[hosts.bench1tcp]\nhosts = ["h1"]\ninsecure_tcp = true\n{common}')
        env = _env(cfg)
        _run(BRINGUP, env=env)  # warm-up (discarded): the bytecode cache, the page cache, the hosts' sshd
        floor, floor_cpu, up, first, cpu, warm, warm_cpu = [], [], [], [], [], [], []
        for _ in range(args.repeats):  # interleaved, so a noisy phase hits all three
            f, fc = floor_once()
            floor.append(f)
            floor_cpu.append(fc)
            r = _run(BRINGUP, env=env)
            up.append(r["up"])
            first.append(r["first_reply_all"])
            cpu.append(r["cpu"])
            r = _run(BRINGUP, "warm", env=env)
            warm.append(r["first_reply_all"])
            warm_cpu.append(r["cpu"])
        gone = [sigkill_once(env) for _ in range(args.repeats)]
        tls = _run(CALLS, str(args.calls), "tls", env=env)
        tcp = _run(CALLS, str(args.calls), "tcp", env=env)
        ipc = _run(CALLS, str(args.calls), "ipc", env=env)
    out = {
        "floor_ssh_import_3_hosts_s": statistics.median(floor),
        "bringup_3_hosts_s": statistics.median(up),
        "bringup_3x4_first_reply_s": statistics.median(first),
        "floor_cpu_s": statistics.median(floor_cpu),
        "bringup_cpu_s": statistics.median(cpu),
        "bringup_3x4_first_reply_client_imported_s": statistics.median(warm),
        "bringup_client_imported_cpu_s": statistics.median(warm_cpu),
        "cores": os.cpu_count(),
        "sigkill_to_all_gone_s": statistics.median(gone),
        "sigkill_to_all_gone_max_s": max(gone),
        "call_one_tls_netns_p50_us": tls["p50_us"],
        "call_one_tls_netns_p99_us": tls["p99_us"],
        "call_one_tcp_netns_p50_us": tcp["p50_us"],
        "call_one_tcp_netns_p99_us": tcp["p99_us"],
        "tls_over_tcp_p50": tls["p50_us"] / tcp["p50_us"],
        "call_one_ipc_p50_us": ipc["p50_us"],
        "call_one_ipc_p99_us": ipc["p99_us"],
        "repeats": args.repeats,
        "calls": args.calls,
    }
    print(f"floor: ssh + import monarch_core.actor, 3 hosts at once  {out['floor_ssh_import_3_hosts_s']:.3f} s")
    print(f"hosts_from_config, 3 hosts (connect, worker, ready)     {out['bringup_3_hosts_s']:.3f} s")
    print(f"... + 3x4 procs, first reply from all 12                {out['bringup_3x4_first_reply_s']:.3f} s")
    print(f"... the same, the client's imports done before the clock  {out['bringup_3x4_first_reply_client_imported_s']:.3f} s"
          f" ({out['bringup_3x4_first_reply_client_imported_s'] / out['floor_ssh_import_3_hosts_s']:.2f}x the floor;"
          f" CPU {out['bringup_client_imported_cpu_s']:.2f} s)")
    print(f"CPU of every process on this machine: floor {out['floor_cpu_s']:.2f} s, bring-up to the first reply "
          f"{out['bringup_cpu_s']:.2f} s (on {out['cores']} cores: at least "
          f"{out['bringup_cpu_s'] / (out['cores'] or 1):.2f} s of wall time)")
    print(f"client SIGKILLed: all 15 remote processes gone after    {out['sigkill_to_all_gone_s'] * 1000:.0f} ms "
          f"(max {out['sigkill_to_all_gone_max_s'] * 1000:.0f} ms)")
    print(f"call_one p50 (p99): tls across the namespace link       {tls['p50_us']:.0f} us ({tls['p99_us']:.0f} us)")
    print(f"call_one p50 (p99): plain tcp across the same link     {tcp['p50_us']:.0f} us ({tcp['p99_us']:.0f} us)"
          f"   tls / tcp = {out['tls_over_tcp_p50']:.2f}x (goal <= 1.3x)")
    print(f"call_one p50 (p99): ipc on this host                    {ipc['p50_us']:.0f} us ({ipc['p99_us']:.0f} us)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
