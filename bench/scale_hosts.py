"""A scale row across real hosts: H SSH hosts x P procs x A actors (default 4 x 8 x 32 =
1,024 actors) over tls, on the project's testbed (network-namespace hosts h1..h4, each
with a real sshd; tests/_helpers/testbed.py).

    python bench/scale_hosts.py                          # 4 hosts x 8 procs x 32 actors, 200 repeats
    python bench/scale_hosts.py --hosts 2 --procs 2 --actors 4 --repeats 3 --warmup 1   # smoke run
    python bench/scale_hosts.py --json scale.json --md scale.md

Run from a monarch-core checkout with the testbed up (``scripts/testbed/netns-up.sh 4;
scripts/testbed/ssh-up.sh 4``) and the SSH scheduler installed in this interpreter.

This process writes a throwaway ``monarch.toml`` (one ``[hosts.scale]`` entry, ``scheduler =
"ssh"``, hosts ``h1..hH``, the testbed's ``ssh_config`` with ``SetEnv RT_TAG=<tag>`` so that
everything started on the hosts carries the tag) and measures in a **fresh client
interpreter** (a child; killed with its process group after ``--timeout``):

* *bring-up*: ``hosts_from_config("scale")`` (SSH connect, one worker loop per host, ready);
* *procs*: ``spawn_procs(per_host={"gpus": P})`` until ``initialized`` resolved: every one of
  the H x P procs started and reported back;
* *actors*: A actor meshes ``a0 .. a<A-1>`` spawned on those procs (an actor mesh has one
  actor per proc, so A actors per proc are A meshes of H x P: that is how a user writes it
  with this API), then one ``call()`` of every mesh, all issued before any is awaited, until
  the last of the H x P x A replies; the replies are checked (every (mesh, host, proc) once);
* *call() to all*: after ``--warmup`` rounds, ``--repeats`` rounds of the same thing (A
  ``mesh.ping.call(i)`` issued, then A ``.get()``), each round timed from the first call()
  to the last reply; p50 / p99 over the rounds, and the client's CPU per round
  (``time.process_time()`` of the client, every thread).  Every round checks that H x P x A
  replies came back, each with the round's number.  For comparison, the same for one mesh
  (H x P actors, one per proc);
* *shutdown*: ``host_mesh.shutdown()``.

Once every actor has answered, the client waits while this process counts the run's
processes on the hosts (untimed).  After the client has exited, this process waits until no process carrying the tag is left
on the hosts (``ip netns pids`` + ``/proc/PID/environ``; the namespace hosts share this
machine's pid space), kills and reports any left after 30 s.  The machine is shared and
small: the figures are noisy, so compare figures of one run only; the load average before
and after is recorded.  For fan-out beyond the testbed, ``bench/scaling.py`` models the cast
tree on simulated meshes of up to 16,384 members.

Standard library + monarch_core only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import _table as T  # noqa: E402

RT = Path(os.environ.get("RT_RUN", "/tmp/rt"))
CODE = os.pathsep.join([str(REPO), str(REPO / "plugins" / "transport_tcp")])
# the client also loads the SSH scheduler from this checkout (its entry point names the module)
CLIENT_CODE = os.pathsep.join([CODE, str(REPO / "plugins" / "scheduler_ssh")])
MAX_HOSTS = 4


def log(msg: str) -> None:
    print(f"[scale_hosts] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the client (child interpreter)
def _die_with_parent() -> None:
    """SIGKILL this client when the driver dies, however it dies (the client runs in a session
    of its own, out of reach of a signal to the driver's process group; its hosts go down
    with it)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the driver was already gone
        os._exit(1)


def client(args: argparse.Namespace) -> int:
    """Runs in the fresh child: bring up, spawn, measure, shut down; prints one JSON line."""
    signal.alarm(int(args.timeout) + 5)  # the parent kills us at --timeout; this is the backstop
    _die_with_parent()
    import socket

    from monarch_core.actor import Actor, endpoint, hosts_from_config

    class Where(Actor):
        @endpoint
        def where(self, mesh: int) -> list:
            return [mesh, socket.gethostname(), os.getpid()]

        @endpoint
        def ping(self, i: int) -> int:
            return i

    H, P, A = args.hosts, args.procs, args.actors
    n = H * P * A
    tmo = args.call_timeout
    out: dict[str, Any] = {"hosts": H, "procs_per_host": P, "actors_per_proc": A, "actors": n,
                           "repeats": args.repeats, "warmup": args.warmup}

    t0 = time.perf_counter()
    hm = hosts_from_config("scale")
    out["bringup_s"] = time.perf_counter() - t0
    try:
        from monarch_core._proc import _state, _tree

        out["client_address"] = _state.current().kernel.address
        out["host_addresses"] = [h.address for h in hm.hosts]
        out["cast_tree_min"] = _tree.TREE_MIN
        log(f"{H} hosts up in {out['bringup_s']:.2f} s ({out['client_address']})")

        t0 = time.perf_counter()
        procs = hm.spawn_procs(per_host={"gpus": P})
        procs.initialized.get(timeout=tmo)
        out["procs_s"] = time.perf_counter() - t0
        log(f"{H * P} procs ready in {out['procs_s']:.2f} s")

        t0 = time.perf_counter()
        meshes = [procs.spawn(f"a{j}", Where) for j in range(A)]
        futs = [m.where.call(j) for j, m in enumerate(meshes)]
        first = [f.get(timeout=tmo) for f in futs]
        out["actors_s"] = time.perf_counter() - t0
        seen = [tuple(v) for vm in first for v in vm.values()]
        out["first_replies"] = len(seen)
        out["distinct_actors"] = len(set(seen))
        out["distinct_procs"] = len({pid for _, _, pid in seen})
        out["distinct_hosts"] = len({host for _, host, _ in seen})
        out["replies_per_mesh"] = sorted({sum(1 for m, _, _ in seen if m == j) for j in range(A)})
        log(f"{n} actors answered in {out['actors_s']:.2f} s "
            f"({out['distinct_actors']} actors, {out['distinct_procs']} procs, {out['distinct_hosts']} hosts)")
        if len(seen) != n or out["distinct_actors"] != n or out["distinct_procs"] != H * P:
            raise AssertionError(f"first call: {len(seen)} replies, {out['distinct_actors']} distinct actors, "
                                 f"{out['distinct_procs']} procs; expected {n} and {H * P}")
        # The driver counts this run's processes on the hosts now (untimed), then lets us go on.
        print(json.dumps({"phase": "spawned"}), flush=True)
        sys.stdin.readline()

        def rounds(ms: list, label: str) -> dict[str, Any]:
            expect = len(ms) * H * P
            pc = time.perf_counter
            for i in range(args.warmup):
                for f in [m.ping.call(-1 - i) for m in ms]:
                    f.get(timeout=tmo)
            samples, complete = [], 0
            c0 = time.process_time()
            for i in range(args.repeats):
                t = pc()
                futs = [m.ping.call(i) for m in ms]
                vals = [v for f in futs for v in f.get(timeout=tmo).values()]
                samples.append(pc() - t)
                if len(vals) != expect or any(v != i for v in vals):
                    bad = sum(1 for v in vals if v != i)
                    raise AssertionError(f"{label}, round {i}: {len(vals)} replies ({bad} wrong); expected {expect}")
                complete += 1
            cpu = (time.process_time() - c0) / max(args.repeats, 1)
            ms_ = [s * 1e3 for s in samples]
            log(f"call() to {expect} actors: p50 {T.median(ms_):.1f} ms, p99 {T.percentile(ms_, 99):.1f} ms")
            return {"actors": expect, "meshes": len(ms), "rounds_complete": complete, "replies_per_round": expect,
                    "p50_ms": T.median(ms_), "p99_ms": T.percentile(ms_, 99), "max_ms": max(ms_, default=None),
                    "client_cpu_ms": cpu * 1e3, "samples_ms": [round(s, 3) for s in ms_]}

        out["call_all"] = rounds(meshes, "call() to all")
        out["call_one_mesh"] = rounds(meshes[:1], "call() to one mesh")
    except Exception:  # noqa: BLE001 - the figures so far and the traceback go to the driver
        import traceback

        out["client_error"] = traceback.format_exc()
        log(out["client_error"])
    finally:
        t0 = time.perf_counter()
        try:
            hm.shutdown().get(timeout=120)
            out["shutdown_s"] = time.perf_counter() - t0
        finally:
            print(json.dumps(out), flush=True)
    return 1 if "client_error" in out else 0


# ------------------------------------------------------------------ processes left on the hosts
def _ns_pids(i: int) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", f"rt-h{i}"], capture_output=True, text=True, timeout=30, check=False)
    return [int(p) for p in res.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def tagged(tag: str, hosts: int) -> dict[int, list[int]]:
    """Live processes of the namespace hosts carrying ``RT_TAG=<tag>``."""
    needle = b"\0RT_TAG=" + tag.encode() + b"\0"
    found: dict[int, list[int]] = {}
    for i in range(1, hosts + 1):
        for p in _ns_pids(i):
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    env = b"\0" + f.read() + b"\0"
            except OSError:
                continue
            if needle in env and _alive(p):
                found.setdefault(i, []).append(p)
    return found


def wait_gone(tag: str, hosts: int, timeout: float = 30.0) -> tuple[float, dict[int, list[int]]]:
    """Seconds until nothing of ``tag`` runs on the hosts, and what was still
    there after ``timeout`` (killed then)."""
    t0 = time.monotonic()
    while True:
        left = tagged(tag, hosts)
        if not left:
            return time.monotonic() - t0, {}
        if time.monotonic() - t0 > timeout:
            for ps in left.values():
                for p in ps:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
            return time.monotonic() - t0, left
        time.sleep(0.1)


# ------------------------------------------------------------------ the driver
def code_state() -> dict[str, Any]:
    """The commit measured, and the files under monarch_core/ and plugins/ that differ from it
    (a shared working tree: someone's uncommitted edit is part of what ran)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=30,
                                  check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = [line[3:] for line in git("status", "--porcelain", "--", "monarch_core", "plugins").splitlines() if line]
    return {"git_commit": git("rev-parse", "--short", "HEAD").strip() or None, "uncommitted_code": changed}


def write_config(d: Path, tag: str, hosts: int) -> Path:
    base = (RT / "ssh" / "ssh_config").read_text()
    text = base.replace("Host *\n", f"Host *\n  SetEnv RT_TAG={tag}\n", 1)
    if f"RT_TAG={tag}" not in text:
        raise SystemExit(f"{RT / 'ssh' / 'ssh_config'} has no 'Host *' block: is the testbed up?")
    sshc = d / "ssh_config"
    sshc.write_text(text)
    names = [f"h{i}" for i in range(1, hosts + 1)]
    cfg = d / "monarch.toml"
    cfg.write_text(f'[hosts.scale]\nscheduler = "ssh"\nhosts = {json.dumps(names)}\n'
                   f'ssh_config = "{sshc}"\nconnect_timeout = 10\nenv = {{ PYTHONPATH = "{CODE}" }}\n')
    return cfg


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One fresh client; the figures plus what was left on the hosts."""
    if not (RT / "ssh" / "ssh_config").exists():
        raise SystemExit(f"no {RT / 'ssh' / 'ssh_config'}: bring the testbed up (scripts/testbed/netns-up.sh 4; "
                         "scripts/testbed/ssh-up.sh 4)")
    tag = "scale-" + uuid.uuid4().hex[:10]
    with tempfile.TemporaryDirectory(prefix="scale-hosts-") as d:
        cfg = write_config(Path(d), tag, args.hosts)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
        env["PYTHONPATH"] = os.pathsep.join([CLIENT_CODE, env.get("PYTHONPATH", "")]).strip(os.pathsep)
        env["MONARCH_CONFIG"] = str(cfg)
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", "--hosts", str(args.hosts), "--procs",
                str(args.procs), "--actors", str(args.actors), "--repeats", str(args.repeats), "--warmup",
                str(args.warmup), "--call-timeout", str(args.call_timeout), "--timeout", str(args.timeout)]
        errf = Path(d) / "client.log"
        with open(errf, "w") as err:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=None if args.verbose else err, text=True, env=env, cwd=d,
                                 start_new_session=True)
            seen: dict[int, list[int]] = {}
            lines: list[str] = []

            def read() -> None:  # answer the client's "spawned" with a count of its processes on the hosts
                assert p.stdout is not None and p.stdin is not None
                for line in p.stdout:
                    lines.append(line)
                    if line.startswith('{"phase": "spawned"}'):
                        seen.update(tagged(tag, args.hosts))
                        try:
                            p.stdin.write("\n")
                            p.stdin.flush()
                        except OSError:
                            pass

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                p.wait(timeout=args.timeout)
                error = None if p.returncode == 0 else f"client exited with rc {p.returncode}"
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                error = f"client timed out after {args.timeout:.0f} s (killed)"
            reader.join(10)
            stdout = "".join(lines)
        gone_s, left = wait_gone(tag, args.hosts)
        res: dict[str, Any] = {}
        for line in reversed((stdout or "").strip().splitlines()):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and "phase" not in obj:
                res = obj
                break
        res["error"] = error
        res["tag"] = tag
        res["host_processes_while_running"] = {f"h{i}": len(ps) for i, ps in sorted(seen.items())}
        res["host_processes_gone_after_s"] = round(gone_s, 3)
        res["host_processes_left"] = {f"h{i}": ps for i, ps in left.items()}
        if error or not args.verbose:
            res["client_log_tail"] = errf.read_text()[-6000:] if error else None
    return res


def table(r: dict[str, Any]) -> str:
    H, P, A = r["hosts"], r["procs_per_host"], r["actors_per_proc"]
    ca, c1 = r.get("call_all") or {}, r.get("call_one_mesh") or {}
    rows = [
        ["bring-up: `hosts_from_config` (SSH, worker loops, ready)", f"{H} host{'s' if H != 1 else ''}", T.fmt(r.get("bringup_s"), "{:.2f} s")],
        ["`spawn_procs` until every proc reported (`initialized`)", f"{H * P} procs", T.fmt(r.get("procs_s"), "{:.2f} s")],
        [f"spawn {A} actor meshes + first `call()` of each, every reply", f"{H * P * A} actors",
         T.fmt(r.get("actors_s"), "{:.2f} s")],
        [f"`call()` to all: {ca.get('meshes', A)} meshes, p50 / p99 ({ca.get('rounds_complete', 0)} rounds)",
         f"{ca.get('actors', H * P * A)} actors",
         f"{T.fmt(ca.get('p50_ms'), '{:.1f}')} / {T.fmt(ca.get('p99_ms'), '{:.1f}')} ms"],
        ["… client CPU per round", "", T.fmt(ca.get("client_cpu_ms"), "{:.1f} ms")],
        [f"`call()` to one mesh, p50 / p99 ({c1.get('rounds_complete', 0)} rounds)", f"{c1.get('actors', H * P)} actors",
         f"{T.fmt(c1.get('p50_ms'), '{:.1f}')} / {T.fmt(c1.get('p99_ms'), '{:.1f}')} ms"],
        ["… client CPU per round", "", T.fmt(c1.get("client_cpu_ms"), "{:.1f} ms")],
        ["`shutdown()`", f"{H} host{'s' if H != 1 else ''}", T.fmt(r.get("shutdown_s"), "{:.2f} s")],
        ["processes of the run on the hosts, while running", "",
         str(sum(r.get("host_processes_while_running", {}).values()))],
        ["processes left on the hosts (30 s after the client exited)", "",
         str(sum(len(v) for v in r.get("host_processes_left", {}).values()))],
    ]
    return T.markdown(["step", "size", "time"], rows, [False, True, True])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=4, help=f"SSH hosts h1..hN (1-{MAX_HOSTS}, default 4)")
    ap.add_argument("--procs", type=int, default=8, help="procs per host (default 8)")
    ap.add_argument("--actors", type=int, default=32, help="actors per proc = actor meshes (default 32)")
    ap.add_argument("--repeats", type=int, default=200, help="timed call() rounds (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed call() rounds first (default 20)")
    ap.add_argument("--call-timeout", type=float, default=120.0, help="timeout of every get(), s (default 120)")
    ap.add_argument("--timeout", type=float, default=900.0, help="the whole client, s (default 900)")
    ap.add_argument("--json", metavar="PATH", help="write every figure here")
    ap.add_argument("--md", metavar="PATH", help="write the table here")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the client's stderr")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not 1 <= args.hosts <= MAX_HOSTS or args.procs < 1 or args.actors < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error(f"--hosts 1..{MAX_HOSTS}, --procs/--actors/--repeats >= 1, --warmup >= 0")
    if args.client:
        return client(args)

    load0 = os.getloadavg()
    t0 = time.monotonic()
    log(f"{args.hosts} hosts x {args.procs} procs x {args.actors} actors, {args.repeats} rounds "
        f"(load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}) ...")
    code = code_state()
    r = measure(args)
    r.update(code)
    r.setdefault("hosts", args.hosts)
    r.setdefault("procs_per_host", args.procs)
    r.setdefault("actors_per_proc", args.actors)
    r.update({"time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "nproc": os.cpu_count(),
              "loadavg_start": load0, "loadavg_end": os.getloadavg(), "wall_s": round(time.monotonic() - t0, 1)})
    if r["error"]:
        log(r["error"])
        if r.get("client_log_tail"):
            print(r["client_log_tail"], file=sys.stderr)
    text = (f"## Scale across hosts: {args.hosts} SSH hosts x {args.procs} procs x {args.actors} actors over "
            f"{(r.get('client_address') or '?').split('://')[0]}\n\n" + table(r) + "\n\n"
            f"load average {load0[0]:.2f} before, {r['loadavg_end'][0]:.2f} after, {os.cpu_count()} CPUs; "
            f"commit {r['git_commit']}"
            + (f" + uncommitted changes to {', '.join(r['uncommitted_code'])}" if r["uncommitted_code"] else "")
            + "\n")
    if r["error"]:
        last = (r.get("client_error") or "").strip().splitlines()[-1:] or [""]
        text += f"\n**FAILED**: {r['error']}{': ' + last[0] if last[0] else ''}\n"
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1, default=str) + "\n")
    if args.md:
        Path(args.md).write_text(text)
    return 1 if r["error"] or r["host_processes_left"] else 0


if __name__ == "__main__":
    sys.exit(main())
