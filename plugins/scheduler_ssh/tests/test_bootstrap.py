"""The remote bootstrap, run here through ``sh -c`` with pipes where the SSH
channel would be: the hello line, the setup line over stdin (environment,
working directory, argv -- never on a command line), the module check, the
control lines and their acknowledgements, and the exit when stdin ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from monarch_scheduler_ssh import _bootstrap

PROBE = """
import os, sys, time
print("probe argv", sys.argv[1:], flush=True)
print("probe env", os.environ.get("SECRET_FOR_TEST"), os.environ.get("PYTHONPATH") is not None, flush=True)
print("probe cwd", os.getcwd(), flush=True)
print("monarch worker loop listening on tls://1.2.3.4:5", flush=True)
while True:
    time.sleep(0.05)
    if os.environ.get("PYTHONPATH", "").startswith("/synced"):
        print("probe sees", os.environ["PYTHONPATH"], flush=True)
        break
time.sleep(60)
"""


class Remote:
    def __init__(self, tmp_path: Path) -> None:
        self.p = subprocess.Popen(
            ["sh", "-c", _bootstrap.remote_command(sys.executable, _bootstrap.STAGE_ONE, "tok123")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path),
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
        )

    def line(self) -> str:
        assert self.p.stdout is not None
        return self.p.stdout.readline().decode()

    def obj(self) -> dict[str, Any]:
        line = self.line()
        assert line.startswith(_bootstrap.MARK), line
        return json.loads(line)

    def send(self, obj: dict[str, Any]) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write((json.dumps(obj) + "\n").encode())
        self.p.stdin.flush()


def _setup(tmp_path: Path, module: str, cwd: str | None) -> dict[str, Any]:
    return {"cwd": cwd, "env": {"SECRET_FOR_TEST": "s3cr3t"}, "argv": [sys.executable, "-m", module, "--flag", "x"],
            "token": "tok123", "stage2": _bootstrap.python_c(_bootstrap.STAGE_TWO)}


def test_stages_pass_env_over_stdin_apply_control_lines_and_end_with_stdin(tmp_path: Path) -> None:
    (tmp_path / "probe_mod.py").write_text(PROBE)
    r = Remote(tmp_path)
    try:
        hello = r.obj()
        assert hello["monarch_ssh"] == "hello" and hello["pid"] == r.p.pid  # the shell exec'd Python
        work = tmp_path / "made" / "here"
        r.send(_setup(tmp_path, "probe_mod", str(work)))
        assert r.obj() == {"monarch_ssh": "cwd", "cwd": str(work)}
        assert r.line().strip() == "probe argv ['--flag', 'x']"
        assert r.line().strip() == "probe env s3cr3t True"
        assert r.line().strip() == f"probe cwd {work}"
        assert r.line().startswith("monarch worker loop listening on ")
        cmdline = Path(f"/proc/{r.p.pid}/cmdline").read_bytes()
        assert b"s3cr3t" not in cmdline and b"tok123" in cmdline  # the secret is in the environment only
        # ... applied in the process (one interpreter start), not by an execve
        assert b"SECRET_FOR_TEST" not in Path(f"/proc/{r.p.pid}/environ").read_bytes()
        r.send({"op": "pythonpath", "paths": ["/synced/a", "/synced/b"], "id": 7})
        got = [r.line(), r.line()]
        ack = next(json.loads(x) for x in got if x.startswith(_bootstrap.MARK))
        assert ack == {"monarch_ssh": "ack", "token": "tok123", "id": 7}
        seen = next(x for x in got if x.startswith("probe sees"))
        assert seen.split()[2].split(os.pathsep)[:2] == ["/synced/a", "/synced/b"]
        t0 = time.monotonic()
        assert r.p.stdin is not None
        r.p.stdin.close()  # the SSH channel closed
        assert r.p.wait(10) == 0
        assert time.monotonic() - t0 < 10
    finally:
        r.p.kill()
        r.p.wait()


def test_a_variable_the_interpreter_reads_at_start_up_makes_stage_two_a_new_interpreter(tmp_path: Path) -> None:
    (tmp_path / "probe_mod.py").write_text(PROBE)
    r = Remote(tmp_path)
    try:
        r.obj()
        setup = _setup(tmp_path, "probe_mod", None)
        setup["env"]["PYTHONHASHSEED"] = "0"  # read only as an interpreter starts
        r.send(setup)
        assert r.obj()["monarch_ssh"] == "cwd"
        assert r.line().strip() == "probe argv ['--flag', 'x']"
        environ = Path(f"/proc/{r.p.pid}/environ").read_bytes()  # the same pid: execve
        assert b"PYTHONHASHSEED=0" in environ and b"SECRET_FOR_TEST=s3cr3t" in environ
    finally:
        r.p.kill()
        r.p.wait()


def test_a_missing_module_is_reported_with_the_interpreter_and_its_path(tmp_path: Path) -> None:
    r = Remote(tmp_path)
    try:
        r.obj()
        r.send(_setup(tmp_path, "no_such_module_here", None))
        assert r.obj()["monarch_ssh"] == "cwd"
        err = r.obj()
        assert err["kind"] == "module" and err["module"] == "no_such_module_here"
        assert err["python"] == sys.executable and str(tmp_path) in err["path"]
        assert r.p.wait(10) == 3
    finally:
        r.p.kill()
        r.p.wait()


def test_a_working_directory_that_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    r = Remote(tmp_path)
    try:
        r.obj()
        r.send(_setup(tmp_path, "probe_mod", str(tmp_path / "file" / "sub")))
        err = r.obj()
        assert err["kind"] == "cwd" and err["cwd"].endswith("file/sub"), err
        assert r.p.wait(10) == 4
    finally:
        r.p.kill()
        r.p.wait()


def test_the_kill_command_checks_the_token(tmp_path: Path) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "marker-abc"])
    try:
        out = subprocess.run(["sh", "-c", _bootstrap.kill_command(victim.pid, "other-token")], capture_output=True,
                             text=True, timeout=30, check=False)
        assert out.stdout.strip() == "gone" and victim.poll() is None
        out = subprocess.run(["sh", "-c", _bootstrap.kill_command(victim.pid, "marker-abc")], capture_output=True,
                             text=True, timeout=30, check=False)
        assert out.stdout.strip() == "killed"
        assert victim.wait(10) == -9
    finally:
        victim.kill()
        victim.wait()
