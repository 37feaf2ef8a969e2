"""The worker step's task on a node (``python -m monarch_scheduler_slurm._node``),
run here as the real process Slurm would start, with ``SLURMD_NODENAME`` set
as slurmstepd sets it.  Its "worker" is a small Python program standing in
for ``python -m monarch_core.worker`` (the real one runs in the cluster
suite beside this file, ``test_slurm_inside.py`` ...)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

MARK = "@@monarch-slurm "

WORKER = r"""
import os, signal, sys, time
print("monarch worker loop listening on tls://10.0.0.1:4242", flush=True)
print("usr2=" + ("ignored" if signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN else "default"), flush=True)
print("secret=" + os.environ.get("MONARCH_TLS_KEY", "missing") + " unbuffered=" + os.environ.get("PYTHONUNBUFFERED", ""),
      flush=True)
forked = "monarch_scheduler_slurm._node" in sys.orig_argv  # the launcher's own interpreter
print("forked=%s comm=%s argv=%s name=%s" % (forked, open("/proc/self/comm").read().strip(), sys.argv[1:] == [sys.argv[-1]],
                                              __name__), flush=True)
sys.stdin.read()  # /dev/null: returns at once
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
sys.exit(3)
"""


def _launch(tmp_path: pathlib.Path, node: str = "n7",
            env: dict[str, str] | None = None) -> tuple[subprocess.Popen, pathlib.Path, pathlib.Path]:
    session = tmp_path / "session"
    session.mkdir(mode=0o700)
    go = tmp_path / "go"
    f = session / f"{node}.json"
    f.write_text(json.dumps({"argv": [sys.executable, "-c", WORKER, str(go)],
                             "env": {"MONARCH_TLS_KEY": "k3y", **(env or {})}}))
    f.chmod(0o600)
    env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_STEP_ID": "4"}
    p = subprocess.Popen([sys.executable, "-m", "monarch_scheduler_slurm._node", str(session), "--signal", "USR2"],
                         stdout=subprocess.PIPE, text=True, env=env)
    return p, f, go


def _line(p: subprocess.Popen) -> str:
    assert p.stdout is not None
    return p.stdout.readline().rstrip("\n")


def test_the_node_task_starts_its_worker_with_its_credentials_and_removes_them(tmp_path: pathlib.Path) -> None:
    p, f, go = _launch(tmp_path)
    try:
        hello = _line(p)
        assert hello == f"{MARK}hello n7 4 {p.pid}"
        assert _line(p) == "monarch worker loop listening on tls://10.0.0.1:4242"
        assert _line(p) == "usr2=ignored"  # procs must survive Slurm's warning signal
        assert _line(p) == "secret=k3y unbuffered=1"
        # one interpreter per node: the worker is forked from the launcher, runs as `python -c` would, and is named
        assert _line(p) == "forked=True comm=monarch-worker argv=True name=__main__"
        assert not f.exists(), "the launch file (a private key) must be gone once read"
        assert not f.parent.exists(), "the last reader removes the emptied session directory"
        p.send_signal(signal.SIGUSR2)  # Slurm's --signal warning, twice: one notice
        assert _line(p) == f"{MARK}notice n7 SIGUSR2"
        p.send_signal(signal.SIGUSR2)
        time.sleep(0.2)
        go.write_text("")
        assert _line(p) == f"{MARK}exit n7 3"
        assert p.wait(30) == 3
    finally:
        p.kill()
        p.wait()


def test_sigterm_reaches_the_worker_and_the_exit_is_reported(tmp_path: pathlib.Path) -> None:
    p, _, _ = _launch(tmp_path)
    try:
        for _ in range(5):
            _line(p)
        p.send_signal(signal.SIGTERM)  # the job is cancelled: slurmstepd signals the step
        assert _line(p) == f"{MARK}exit n7 -15"
        assert p.wait(30) == 128 + 15
    finally:
        p.kill()
        p.wait()


def test_a_worker_whose_environment_changes_a_start_up_variable_is_execd(tmp_path: pathlib.Path) -> None:
    # the interpreter reads PYTHONHASHSEED (like PYTHON*, LD_*) only as it starts: a forked child would not honour it
    p, f, go = _launch(tmp_path, env={"PYTHONHASHSEED": "7"})
    try:
        assert _line(p).startswith(f"{MARK}hello n7 4 ")
        assert _line(p) == "monarch worker loop listening on tls://10.0.0.1:4242"
        assert _line(p) == "usr2=ignored"
        assert _line(p) == "secret=k3y unbuffered=1"
        assert _line(p).startswith("forked=False ")
        go.write_text("")
        assert _line(p) == f"{MARK}exit n7 3"
        assert p.wait(30) == 3
    finally:
        p.kill()
        p.wait()


def test_a_missing_worker_module_is_said_as_python_says_it(tmp_path: pathlib.Path) -> None:
    session = tmp_path / "session"
    session.mkdir(mode=0o700)
    (session / "n8.json").write_text(json.dumps({"argv": [sys.executable, "-m", "no_such_monarch_module"], "env": {}}))
    res = subprocess.run([sys.executable, "-m", "monarch_scheduler_slurm._node", str(session)], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "SLURMD_NODENAME": "n8"})
    assert res.stdout.strip().splitlines()[-1] == f"{MARK}exit n8 1"
    assert res.returncode == 1
    assert res.stderr.strip() == f"{sys.executable}: No module named no_such_monarch_module"


def test_a_missing_launch_file_says_state_dir_must_be_shared(tmp_path: pathlib.Path) -> None:
    code = ("import sys, monarch_scheduler_slurm._node as n; n.FILE_WAIT = 0.3; "
            f"sys.exit(n.main([{str(tmp_path)!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SLURMD_NODENAME": "n9"})
    assert res.returncode == 2
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{MARK}error n9 no launch file {tmp_path}/n9.json on n9 after 0s"), last
    assert "state_dir must be on a filesystem every node shares" in last
