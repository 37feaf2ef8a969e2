"""A sync endpoint at a breakpoint: debugged through the real CLI, the debug
server's protection, and nothing hangs without a debugger (released when the
procs stop or the client exits; ``PYTHONBREAKPOINT=0`` disables it).

Each test runs ``programs/sync_debugee.py`` (two real procs of this host).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat

import pytest

from _helpers import poll_until
from debugger_helpers import PDB, PROGRAMS, Cli, cast_lines, debug_env, line_of, run_program
from _helpers.procs import descendants, wait_pids_gone

pytest.importorskip("pexpect")
pytest.importorskip("lark")

PROG = PROGRAMS / "sync_debugee.py"
HOST = socket.gethostname()


def markers(d) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p.name: p.read_text() for p in sorted(d.glob("continued-*"))}


@pytest.fixture
def tmp(tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "markers").mkdir()
    return tmp_path


def start(tmp, mode: str, **extra: str | None):  # type: ignore[no-untyped-def]
    env = debug_env(tmp / "debug.token", extra)
    return run_program("sync_debugee.py", mode, str(tmp / "markers"), env=env, cwd=tmp), env


def test_a_sync_endpoint_is_debugged_and_only_its_user_with_the_token_gets_in(tmp) -> None:
    taken = socket.socket()  # another program's debug server on the configured port
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    prog, env = start(tmp, "call", MONARCH_DEBUG_SERVER_PORT=str(busy))
    try:
        _, notice = prog.notice()
        port = int(notice["port"])
        assert port != busy and f"(port {busy} was taken: this program's server is on {port})" in notice["rest"]
        assert notice["actor"] == "syncdbg" and notice["where"].startswith("sync_debugee.py:")

        # the token: a file only its user can read, in a directory only its user can enter
        token = tmp / "debug.token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        assert json.loads(token.read_text())["port"] == port

        # no token file, or a wrong token: refused, one line, exit status 1
        nofile = Cli(["--port", str(port)], {**env, "MONARCH_DEBUG_TOKEN_FILE": str(tmp / "none.token")},
                     expect_banner=False)
        text, status = nofile.finish()
        assert status == 1 and f"no token file {tmp / 'none.token'}" in text, text
        (tmp / "wrong.token").write_text(json.dumps({"token": "0" * 64}))
        wrong = Cli(["--port", str(port)], {**env, "MONARCH_DEBUG_TOKEN_FILE": str(tmp / "wrong.token")},
                    expect_banner=False)
        text, status = wrong.finish()
        assert status == 1 and "wrong token" in text, text

        cli = Cli(["--port", str(port)], env)
        try:
            rows = cli.poll_list(2)
            stop = line_of(PROG, "y = base + x * 10")
            assert rows == [{"Actor": "syncdbg", "Rank": str(r), "Coords": f"gpu={r}", "Hostname": HOST,
                             "Function": "step", "Line": str(stop)} for r in (0, 1)], rows
            out, prompt = cli.run("attach syncdbg 1")
            assert prompt == PDB and out.splitlines()[1:] == [f"> {PROG}({stop})step()", "-> y = base + x * 10"]
            assert cli.pdb("p x, base") == "(1, 7)\n"
            assert cli.pdb("n").splitlines()[-1].startswith("-> with open(")
            assert cli.pdb("p y") == "17\n"
            assert cli.pdb("") == "17\n"  # an empty line repeats the last command, as in pdb
            assert cli.cmd("c") == "Detached from debug session for rank 1 (continued)\n"
            got = cast_lines(cli.cmd("cast syncdbg ranks(0) c"))
            # what rank 0 printed when it stopped was not shown yet: it comes first
            assert got == {0: [f"> {PROG}({stop})step()", "-> y = base + x * 10", "(continued)"]}, got
            assert prog.result("values") == [7, 17]
            assert prog.wait() == 0, prog.describe()
        finally:
            cli.kill()
        assert len(prog.notices()) == 1, prog.notices()
        assert markers(tmp / "markers") == {"continued-0": "7", "continued-1": "17"}
        assert not token.exists()
    finally:
        taken.close()
        prog.kill()


def test_pythonbreakpoint_0_disables_the_breakpoints(tmp) -> None:
    prog, _ = start(tmp, "call", PYTHONBREAKPOINT="0")
    try:
        assert prog.result("values") == [7, 17]
        assert prog.wait() == 0, prog.describe()
        assert prog.notices() == []
    finally:
        prog.kill()


def test_a_client_with_pythonbreakpoint_0_releases_procs_that_lack_it(tmp) -> None:
    """Procs on other hosts have their host's environment: the client's
    ``PYTHONBREAKPOINT=0`` still disables their breakpoints."""
    prog, _ = start(tmp, "call_noenv", PYTHONBREAKPOINT="0")
    try:
        assert prog.result("values") == [7, 17]
        assert prog.wait() == 0, prog.describe()
        assert prog.notices() == []
        assert not (tmp / "debug.token").exists()  # no server was started
    finally:
        prog.kill()


def test_without_the_debugger_plugin_a_breakpoint_names_the_plugin_and_the_endpoint_goes_on(tmp) -> None:
    """With monarch-debugger absent (disabled here), ``breakpoint()`` in a proc
    cannot stop for ``monarch debug``: each rank logs what to install and
    runs on (a proc has no terminal for pdb)."""
    prog, _ = start(tmp, "call", MONARCH_DISABLED_PLUGINS="debugger")
    try:
        assert prog.result("values") == [7, 17]
        assert prog.wait() == 0, prog.describe()
        assert prog.notices() == []
        err = prog.describe()
        assert err.count("needs the debugger plugin (pip install ./plugins/debugger") == 2, err
        assert markers(tmp / "markers") == {"continued-0": "7", "continued-1": "17"}
    finally:
        prog.kill()


def test_monarch_debug_without_the_plugin_says_which_plugin_to_install(monkeypatch) -> None:
    import argparse

    from monarch_core import cli

    sub = argparse.ArgumentParser().add_subparsers()
    sub.add_parser("plugins")
    said = cli._missing_plugin_command(["debug", "--port", "1"], sub)
    assert said == ("monarch: the 'debug' command comes with the monarch-debugger plugin, which is not installed "
                    "here; install it in a monarch-core checkout with `pip install ./plugins/debugger`")
    assert cli._missing_plugin_command(["plugins"], sub) is None
    assert cli._missing_plugin_command(["nonsense"], sub) is None  # argparse says what the commands are


def test_stopping_the_procs_releases_the_ranks_waiting_at_a_breakpoint(tmp) -> None:
    prog, _ = start(tmp, "stop")
    try:
        prog.notice()
        assert markers(tmp / "markers") == {}  # they wait: it is a breakpoint
        prog.send("stop")
        assert prog.result("stopped") is True
        assert prog.result("outcome") == ["value", [7, 17]]  # released: continued, not killed
        assert prog.wait() == 0, prog.describe()
        assert markers(tmp / "markers") == {"continued-0": "7", "continued-1": "17"}
        assert len(prog.notices()) == 1
    finally:
        prog.kill()


def test_a_client_that_exits_releases_its_ranks_and_leaves_nothing_behind(tmp) -> None:
    prog, _ = start(tmp, "wait")
    try:
        prog.notice()
        procs = poll_until(lambda: [p for p in descendants(prog.popen.pid)], what="the program's procs")
        os.kill(prog.popen.pid, signal.SIGINT)
        prog.wait()
        assert wait_pids_gone(procs, 60) == []
        assert markers(tmp / "markers") == {"continued-0": "7", "continued-1": "17"}, prog.describe()
        assert not (tmp / "debug.token").exists()
    finally:
        prog.kill()
