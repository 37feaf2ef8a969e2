"""The debug server's token file: gone with its program however it ends
(SIGTERM and SIGKILL included), a stale one (its process gone) counts as
absent, and a token path in a directory other users may write is refused.

Real programs (``programs/sync_debugee.py``, two real procs) stopped at a
breakpoint, killed with real signals.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers import poll_until
from debugger_helpers import debug_env, run_program
from monarch_debugger import _protocol

pytest.importorskip("pexpect")
pytest.importorskip("lark")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_token_file_goes_with_a_program_killed_by(sig: signal.Signals, tmp_path: Path) -> None:
    (tmp_path / "markers").mkdir()
    token = tmp_path / "debug.token"
    prog = run_program("sync_debugee.py", "wait", str(tmp_path / "markers"), env=debug_env(token), cwd=tmp_path)
    try:
        prog.notice()  # a rank stopped: the server is up and its token written
        data = json.loads(token.read_text())
        assert data["pid"] == prog.popen.pid
        os.kill(prog.popen.pid, sig)
        assert prog.wait() == -sig
        poll_until(lambda: not token.exists(), timeout=30, what=f"the token file removed after {sig.name}")
    finally:
        prog.kill()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(30)
    return p.pid


def test_a_token_file_whose_program_is_gone_counts_as_absent(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "dbg" / "27001.token"
    monkeypatch.setenv("MONARCH_DEBUG_TOKEN_FILE", str(path))
    written, token = _protocol.write_token_file(27001)
    assert _protocol.read_token(27001) == token  # its writer (this process) runs: valid
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "pid": _dead_pid()}))  # left by a program that was killed
    with pytest.raises(_protocol.CliError, match=r"no token file .*27001\.token.*left by process \d+, which has ended"):
        _protocol.read_token(27001)
    assert not path.exists()  # the stale file is removed
    # a live pid that is another process now (the pid was reused): stale too
    path.write_text(json.dumps({**data, "start": data["start"] - 1}))
    with pytest.raises(_protocol.CliError, match="which has ended"):
        _protocol.read_token(27001)


@pytest.mark.parametrize("mode", [0o777, 0o770], ids=["0777", "0770"])
def test_a_token_path_in_a_directory_others_can_write_is_refused(mode: int, tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    monkeypatch.setenv("MONARCH_DEBUG_TOKEN_FILE", str(shared / "dbg.token"))
    with pytest.raises(PermissionError, match=rf"{shared} has mode {mode:04o}: other users can write it"):
        _protocol.write_token_file(27001)
    assert list(shared.iterdir()) == []
    (shared / "dbg.token").write_text(json.dumps({"token": "0" * 64, "pid": os.getpid()}))  # planted
    with pytest.raises(_protocol.CliError, match="MONARCH_DEBUG_TOKEN_FILE to a path in a directory only you"):
        _protocol.read_token(27001)


def test_a_sticky_shared_directory_or_one_of_another_user(tmp_path: Path, monkeypatch) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # like /tmp: others cannot replace our file
    monkeypatch.setenv("MONARCH_DEBUG_TOKEN_FILE", str(sticky / "dbg.token"))
    path, token = _protocol.write_token_file(27001)
    assert _protocol.read_token(27001) == token
    _protocol.remove_token_file(path, token)
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv("MONARCH_DEBUG_TOKEN_FILE", str(theirs / "dbg.token"))
    with pytest.raises(PermissionError, match=rf"{theirs} belongs to uid 65534"):
        _protocol.write_token_file(27001)


def test_a_program_whose_token_path_is_shared_says_so_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "markers").mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    env = debug_env(shared / "debug.token")
    prog = run_program("sync_debugee.py", "call", str(tmp_path / "markers"), env=env, cwd=tmp_path)
    try:
        assert prog.result("values", timeout=60) == [7, 17]  # breakpoints continue without stopping
        assert prog.wait() == 0, prog.describe()
        err = prog.err.text()
        assert "the debug server could not start" in err and "other users can write it" in err, err[-3000:]
        assert list(shared.iterdir()) == []
        assert stat.S_IMODE(shared.stat().st_mode) == 0o777
    finally:
        prog.kill()
