"""``monarch status``: a running program seen from a second terminal.

A real client (a child interpreter) spawns a host mesh, procs and actors and
waits; ``monarch status`` (another process) lists it from the client's record
in this user's private runtime directory: its meshes, their procs and state,
its published URLs.  The record follows the program (a stopped mesh shows as
stopped), goes when it exits, and a record left by a killed client is ignored
and removed.  Each test has its own ``XDG_RUNTIME_DIR``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


from _helpers.clients import PY, LineReader, child_env, write_script

STATUS_TIMEOUT = 60


def monarch(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "monarch_core.cli", *args], capture_output=True, text=True, timeout=STATUS_TIMEOUT,
                          env=child_env({"XDG_RUNTIME_DIR": str(runtime_dir)}))


def status_json(runtime_dir: Path) -> list[dict[str, Any]]:
    out = monarch(runtime_dir, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


CLIENT = """
    import sys
    from monarch_core import _status
    from monarch_core.actor import Actor, endpoint, this_host

    class Worker(Actor):
        @endpoint
        def ping(self) -> int:
            return 1

    procs = this_host().spawn_procs(per_host={"gpus": 2}, name="trainers")
    workers = procs.spawn("workers", Worker)
    workers.ping.call().get()
    _status.publish_url("dashboard", "http://127.0.0.1:1/?token=t")
    print("RUNNING", flush=True)
    sys.stdin.readline()
    procs.stop().get()
    print("STOPPED", flush=True)
    sys.stdin.readline()
"""


def poll(fn: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_status_lists_a_running_program_its_meshes_and_follows_it(tmp_path: Path) -> None:
    rundir = tmp_path / "run"
    rundir.mkdir(mode=0o700)
    script = write_script(tmp_path, CLIENT)
    p = subprocess.Popen([PY, str(script), "--epochs", "3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                         env=child_env({"XDG_RUNTIME_DIR": str(rundir)}))
    out = LineReader(p.stdout, "client")
    try:
        out.wait_for(lambda line: line == "RUNNING", timeout=120)
        # (a change reaches the file at once, or within the record's write gap: _status.Record)
        assert poll(lambda: [r for r in status_json(rundir) if r["urls"]]), status_json(rundir)
        records = status_json(rundir)
        assert len(records) == 1, records
        r = records[0]
        assert r["pid"] == p.pid and r["argv"][1:] == ["--epochs", "3"] and r["cwd"] == str(tmp_path)
        assert r["urls"] == {"dashboard": "http://127.0.0.1:1/?token=t"}
        assert r["host_meshes"]["this_host"]["state"] == "running"
        mesh = r["proc_meshes"]["trainers"]
        assert (mesh["procs"], mesh["running"], mesh["state"], mesh["extent"]) == (2, 2, "running", {"gpus": 2})
        actors = [a for a in r["actor_meshes"].values() if a["name"] == "workers"]
        assert len(actors) == 1 and actors[0]["class"] == "Worker" and actors[0]["proc_mesh"] == "trainers"
        assert poll(lambda: [a for a in status_json(rundir)[0]["actor_meshes"].values()
                             if a["name"] == "workers" and a["state"] == "running"])
        # the text a user reads
        text = monarch(rundir, "status")
        assert text.returncode == 0, text.stderr
        assert f"pid {p.pid}" in text.stdout and "--epochs 3" in text.stdout
        assert "dashboard: http://127.0.0.1:1/?token=t" in text.stdout
        assert "proc mesh  trainers {gpus: 2}: 2 proc(s) (2 running), running, on this_host" in text.stdout
        assert "workers (Worker)" in text.stdout
        # the record is private: a directory and a file of this user only
        files = list((rundir / "monarch").glob("*.json"))
        assert [f.name for f in files] == [f"{p.pid}.json"]
        assert (rundir / "monarch").stat().st_mode & 0o777 == 0o700 and files[0].stat().st_mode & 0o777 == 0o600

        p.stdin.write("\n")
        p.stdin.flush()
        out.wait_for(lambda line: line == "STOPPED", timeout=120)
        assert poll(lambda: status_json(rundir)[0]["proc_meshes"]["trainers"]["state"] == "stopped")
        mesh = status_json(rundir)[0]["proc_meshes"]["trainers"]
        assert (mesh["state"], mesh["running"]) == ("stopped", 0), mesh
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=120) == 0, out.text()
        assert not list((rundir / "monarch").glob("*.json")), "the record outlived its program"
        none = monarch(rundir, "status")
        assert none.returncode == 0 and "no monarch client runs for this user" in none.stdout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def test_a_killed_programs_record_is_ignored_and_removed(tmp_path: Path) -> None:
    rundir = tmp_path / "run"
    rundir.mkdir(mode=0o700)
    script = write_script(tmp_path, """
        import sys, time
        from monarch_core.actor import this_host
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.initialized.get()
        print("RUNNING", flush=True)
        time.sleep(600)
    """)
    p = subprocess.Popen([PY, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=child_env({"XDG_RUNTIME_DIR": str(rundir)}), start_new_session=True)
    out = LineReader(p.stdout, "client")
    try:
        out.wait_for(lambda line: line == "RUNNING", timeout=120)
        assert [r["pid"] for r in status_json(rundir)] == [p.pid]
        os.killpg(p.pid, signal.SIGKILL)  # the client and its procs: no exit handler runs
        p.wait(timeout=30)
        record = rundir / "monarch" / f"{p.pid}.json"
        assert record.exists()  # left behind ...
        assert status_json(rundir) == []  # ... ignored
        assert not record.exists()  # ... and cleaned
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


def test_a_record_of_a_reused_pid_is_stale(tmp_path: Path) -> None:
    """A record whose pid now belongs to another process (started later) is not listed."""
    rundir = tmp_path / "run"
    (rundir / "monarch").mkdir(parents=True, mode=0o700)
    (rundir / "monarch").chmod(0o700)
    record = {"version": 1, "pid": os.getpid(), "pid_start": 1, "started": 0, "argv": ["old.py"], "cwd": "/",
              "proc_id": "client-x", "host_meshes": {}, "proc_meshes": {}, "actor_meshes": {}, "urls": {},
              "stopped_meshes": 0}
    (rundir / "monarch" / f"{os.getpid()}.json").write_text(json.dumps(record))
    assert status_json(rundir) == []


def test_status_refuses_a_directory_others_can_enter(tmp_path: Path) -> None:
    rundir = tmp_path / "run"
    (rundir / "monarch").mkdir(parents=True)
    (rundir / "monarch").chmod(0o755)
    out = monarch(rundir, "status")
    assert out.returncode == 1
    assert "is not a private directory of this user" in out.stderr and "chmod 700" in out.stderr


def test_the_status_directory_is_xdg_runtime_dir_or_the_users_dir_in_tmp(tmp_path: Path) -> None:
    """Without ``XDG_RUNTIME_DIR``: ``/tmp/monarch-<uid>`` whatever ``TMPDIR``
    says (a second terminal, or a job step with a ``TMPDIR`` of its own, finds
    the same records; a program leaves nothing in its ``TMPDIR``)."""
    code = "from monarch_core import _status; print(_status.directory())"
    with_xdg = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                              env=child_env({"XDG_RUNTIME_DIR": str(tmp_path)}))
    assert with_xdg.stdout.strip() == str(tmp_path / "monarch"), with_xdg.stderr
    without = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                             env=child_env({"XDG_RUNTIME_DIR": None, "TMPDIR": str(tmp_path)}))
    assert without.stdout.strip() == f"/tmp/monarch-{os.getuid()}", without.stderr


def test_status_lists_the_dashboard_url_of_a_client_that_serves_one(tmp_path: Path) -> None:
    """``MONARCH_DASHBOARD=1``: the dashboard plugin publishes its URL (token
    included) in the client's record, and withdraws it when it stops."""
    import pytest

    pytest.importorskip("monarch_dashboard")
    rundir = tmp_path / "run"
    rundir.mkdir(mode=0o700)
    script = write_script(tmp_path, """
        import sys
        from monarch_core.actor import this_host
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        procs.initialized.get()
        print("RUNNING", flush=True)
        sys.stdin.readline()
        procs.stop().get()
    """)
    p = subprocess.Popen([PY, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env=child_env({"XDG_RUNTIME_DIR": str(rundir), "MONARCH_DASHBOARD": "1"}))
    out = LineReader(p.stdout, "client")
    try:
        out.wait_for(lambda line: line == "RUNNING", timeout=120)
        urls = poll(lambda: status_json(rundir)[0]["urls"])
        assert urls["dashboard"].startswith("http://127.0.0.1:") and "token=" in urls["dashboard"], urls
        assert urls["dashboard"] in monarch(rundir, "status").stdout
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=60) == 0
        assert status_json(rundir) == []
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
