"""A program that ends while ``monarch debug`` is attached ends quietly:
its debug server closes the CLI's connection without an asyncio traceback
(the connection's task, cancelled as the loop closed, used to end
cancelled, and asyncio's stream callback printed ``CancelledError``)."""

from __future__ import annotations

import pytest

from debugger_helpers import Cli, debug_env, run_program

pytest.importorskip("pexpect")
pytest.importorskip("lark")


def test_a_program_that_ends_with_the_debugger_attached_prints_no_traceback(tmp_path) -> None:
    (tmp_path / "markers").mkdir()
    env = debug_env(tmp_path / "debug.token")
    prog = run_program("sync_debugee.py", "stop", str(tmp_path / "markers"), env=env, cwd=tmp_path)
    cli = None
    try:
        port = prog.port()
        cli = Cli(["--port", str(port)], env)
        cli.poll_list(2)  # attached, with both ranks at their breakpoint
        prog.send("stop")  # the program stops its procs and ends, the CLI still attached
        assert prog.result("stopped") is True
        assert prog.wait() == 0, prog.describe()
        err = prog.err.text()
        assert "Traceback" not in err and "CancelledError" not in err, prog.describe()
    finally:
        if cli is not None:
            cli.kill()
        prog.kill()
