"""``bench/scale_hosts.py`` keeps working: a smoke run (2 SSH hosts x 2 procs
x 4 actors, 3 rounds) on the testbed.  Structure only: every reply came back,
the JSON has its fields, nothing is left on the hosts.  Never wall-clock times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ssh_helpers as H

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "scale_hosts.py"
HOSTS, PROCS, ACTORS, ROUNDS = 2, 2, 4, 3


@pytest.mark.timeout(300)
def test_scale_hosts_smoke_run_gets_every_reply_and_leaves_nothing(sshd: Any, tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    md = tmp_path / "scale.md"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--hosts", str(HOSTS), "--procs", str(PROCS), "--actors", str(ACTORS),
         "--repeats", str(ROUNDS), "--warmup", "1", "--timeout", "240", "--json", str(out), "--md", str(md)],
        capture_output=True, text=True, timeout=280, cwd=tmp_path, check=False,
    )
    assert res.returncode == 0, f"rc {res.returncode}\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-6000:]}"
    r = json.loads(out.read_text())
    n = HOSTS * PROCS * ACTORS

    assert r["error"] is None
    assert (r["hosts"], r["procs_per_host"], r["actors_per_proc"], r["actors"]) == (HOSTS, PROCS, ACTORS, n)
    assert r["client_address"].startswith("tls://"), r["client_address"]
    assert [a.split("://")[0] for a in r["host_addresses"]] == ["tls"] * HOSTS
    for key in ("bringup_s", "procs_s", "actors_s", "shutdown_s", "loadavg_start", "loadavg_end", "time_utc",
                "git_commit", "uncommitted_code"):
        assert key in r, key

    # the first call: every actor once, on every proc of every host
    assert (r["first_replies"], r["distinct_actors"]) == (n, n)
    assert (r["distinct_procs"], r["distinct_hosts"]) == (HOSTS * PROCS, HOSTS)
    assert r["replies_per_mesh"] == [HOSTS * PROCS]

    # the timed rounds: all of them complete, every reply each round
    for key, actors, meshes in (("call_all", n, ACTORS), ("call_one_mesh", HOSTS * PROCS, 1)):
        c = r[key]
        assert (c["actors"], c["meshes"], c["replies_per_round"]) == (actors, meshes, actors), c
        assert c["rounds_complete"] == ROUNDS and len(c["samples_ms"]) == ROUNDS
        for f in ("p50_ms", "p99_ms", "client_cpu_ms"):
            assert isinstance(c[f], (int, float)), (key, f, c[f])

    # the run's processes were seen on both hosts, and none is left
    assert sorted(r["host_processes_while_running"]) == [f"h{i}" for i in range(1, HOSTS + 1)]
    assert all(v >= PROCS for v in r["host_processes_while_running"].values()), r["host_processes_while_running"]
    assert r["host_processes_left"] == {}
    H.wait_tagged_gone(r["tag"], range(1, HOSTS + 1), timeout=5)

    table = md.read_text()
    assert f"{HOSTS} SSH hosts x {PROCS} procs x {ACTORS} actors over tls" in table
    assert f"| {n} actors |" in table
