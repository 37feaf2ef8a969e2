"""The debugging guide, end to end: its ``DebugeeActor`` on 4 x 4 procs of
this host, debugged with the real ``monarch debug`` in a pseudo-terminal.
The program is the example of docs/debugging.md, run as it stands there.

One program run (16 real procs) serves the whole walk, in the guide's order:
``list``, a second CLI refused, bad input, ``attach`` with ``n``/``s``/``p``,
``cast`` with every form of ``ranks(...)``, post-mortem on the raising ranks,
``continue``, and the program's results (the caller gets the ``ActorError``s
of the ranks that raised).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from debugger_helpers import PDB, Cli, Program, cast_lines, debug_env, line_of

pytest.importorskip("pexpect")
pytest.importorskip("lark")

DOC = Path(__file__).resolve().parents[3] / "docs" / "debugging.md"
HOST = socket.gethostname()


def doc_program() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/debugging.md should hold one python block: the guide's program"
    return blocks[0]
RANK_EXPR = "p __import__('monarch_core.actor').actor.current_rank().rank"


def cast_ranks(cli: Cli, spec: str) -> dict[int, list[str]]:
    out = cli.cmd(f"cast debugee {spec} {RANK_EXPR}")
    return cast_lines(out)


@pytest.fixture
def program(tmp_path):
    script = tmp_path / "debugee.py"
    script.write_text(doc_program())
    env = debug_env(tmp_path / "debug.token")
    p = Program([str(script)], env, tmp_path)
    yield p, env, script
    p.kill()


def test_the_guide_walkthrough_on_a_4x4_mesh(program, tmp_path) -> None:
    prog, env, PROG = program
    #: where each branch of _debugee_actor_internal stops (the line after its breakpoint())
    STOP = {b: line_of(PROG, f"rank += {b + 1}") for b in range(4)}
    port = prog.port()
    cli = Cli(["--port", str(port)], env)
    try:
        assert cli.banner.strip().splitlines() == [
            "************************ MONARCH DEBUGGER ************************",
            "Enter 'help' for a list of commands.",
            "Enter 'list' to show all active breakpoints.",
        ]

        # list: every rank, with its coordinates, host, function and line
        rows = cli.poll_list(16)
        assert [int(r["Rank"]) for r in rows] == list(range(16))
        for r in rows:
            rank = int(r["Rank"])
            assert r == {"Actor": "debugee", "Rank": str(rank), "Coords": f"host={rank // 4}, gpu={rank % 4}",
                         "Hostname": HOST, "Function": "_debugee_actor_internal", "Line": str(STOP[rank % 4])}, r

        # one debugger at a time
        second = Cli(["--port", str(port)], env, expect_banner=False)
        text, status = second.finish()
        assert status == 1 and "another monarch debug" in text and "is attached to this program" in text, text

        # bad input: one line, and the prompt back
        for line, fragment in [
            ("frobnicate", "unknown command 'frobnicate'"),
            ("attach debugee", "expected a rank"),
            ("attach nobody 1", "no actor 'nobody' is stopped at a breakpoint; stopped actors: debugee"),
            ("attach debugee 99", "stopped ranks of debugee: 0-15"),
            ("cast debugee rank(3) n", "expected ranks("),
            ("cast debugee ranks(3)", "expected a pdb command"),
            ("cast debugee ranks(1:3:0) n", "step cannot be zero"),
            ("cast debugee ranks(99) n", "rank 99 is out of range: debugee has 16 ranks (0-15)"),
            ("cast debugee ranks(host=2:4, gpus=1:3) c", "no dimension 'gpus' (did you mean 'gpu'?); its dimensions: host, gpu"),
            ("list everything", "list takes no arguments"),
        ]:
            out = cli.cmd(line)
            assert out.count("\n") == 1 and out.startswith("*** ") and fragment in out, (line, out)
        assert "cast <actor> ranks(<ranks>)" in cli.cmd("help")

        # attach, and the values the guide shows: n, s, p
        out, prompt = cli.run("attach debugee 13")
        assert prompt == PDB
        assert out.splitlines() == [
            f"Attached to debug session for rank 13 ({HOST})",
            f"> {PROG}({STOP[1]})_debugee_actor_internal()",
            "-> rank += 2",
        ], out
        assert cli.pdb("p rank") == "13\n"
        assert cli.pdb("n").splitlines() == [f"> {PROG}({STOP[1] + 1})_debugee_actor_internal()", "-> return rank"]
        assert cli.pdb("rank") == "15\n"
        listing = cli.pdb("l")
        assert f"{STOP[1]:>3}  \t        rank += 2" in listing and f"{STOP[1] + 1:>3}  ->\t        return rank" in listing
        assert "\t    elif rank % 4 == 1:" in listing  # real source lines (the actor is defined in __main__)
        assert cli.pdb("u").splitlines()[0] == f"> {PROG}({line_of(PROG, 'return _debugee_actor_internal(rank)')})to_debug()"
        cli.pdb("d")
        assert cli.cmd("detach") == "Detached from debug session for rank 13\n"

        # the guide's `s` into a call, on the rank that raises
        out, _ = cli.run("attach debugee 2")
        assert out.splitlines()[1:] == [f"> {PROG}({STOP[2]})_debugee_actor_internal()", "-> rank += 3"]
        assert cli.pdb("n").splitlines() == [f"> {PROG}({STOP[2] + 1})_debugee_actor_internal()", "-> _bad_rank()"]
        assert cli.pdb("s").splitlines() == [
            "--Call--", f"> {PROG}({line_of(PROG, 'def _bad_rank():')})_bad_rank()", "-> def _bad_rank():"]
        assert cli.cmd("c") == "Detached from debug session for rank 2 (continued)\n"

        # post-mortem: rank 2 stops again where the error was raised
        rows = cli.poll_list(16, post_mortem=1)
        row2 = next(r for r in rows if r["Rank"] == "2")
        raise_line = line_of(PROG, 'raise ValueError("bad rank")')
        assert row2["Function"] == "_bad_rank [post-mortem]" and row2["Line"] == str(raise_line), row2
        out, _ = cli.run("attach debugee 2")
        assert "Traceback (most recent call last):" in out and "ValueError: bad rank" in out, out
        assert out.splitlines()[-2:] == [f"> {PROG}({raise_line})_bad_rank()", '-> raise ValueError("bad rank")'], out
        assert "monarch_core" not in out  # the traceback starts at the endpoint
        assert cli.pdb("u").splitlines()[0] == f"> {PROG}({STOP[2] + 1})_debugee_actor_internal()"
        assert cli.pdb("p rank") == "5\n"  # inspectable: 2 + 3
        assert cli.cmd("detach") == "Detached from debug session for rank 2\n"

        # cast: each form of the guide reaches exactly the ranks it selects
        for spec, want in [
            ("ranks(3)", [3]),
            ("ranks(1,2,3)", [1, 2, 3]),
            ("ranks(2:7:2)", [2, 4, 6]),
            ("ranks(host=2:4, gpu=1:3)", [9, 10, 13, 14]),
        ]:
            got = cast_ranks(cli, spec)
            assert sorted(got) == want, (spec, got)
            for rank, lines in got.items():
                assert lines[-1] == str(rank), (spec, rank, lines)
        got = cast_lines(cli.cmd("cast debugee ranks(0,1) n"))  # the guide's first example
        assert sorted(got) == [0, 1]
        assert got[0][-2:] == [f"> {PROG}({STOP[0] + 1})_debugee_actor_internal()", "-> return rank"], got
        assert got[1][-2:] == [f"> {PROG}({STOP[1] + 1})_debugee_actor_internal()", "-> return rank"], got

        # continue: the other ranks that raise stop post-mortem; continue again ends the program
        out = cli.cmd("continue")
        assert out.startswith("Continued 16 ranks."), out
        rows = cli.poll_list(3, post_mortem=3)
        assert [int(r["Rank"]) for r in rows] == [6, 10, 14]
        assert cli.cmd("c").startswith("Continued 3 ranks.")
        values = prog.result("values")
        errors = prog.result("errors")
        assert values == sorted([r + 1 for r in (0, 4, 8, 12)] + [r + 2 for r in (1, 5, 9, 13)]
                                + [r + 4 for r in (3, 7, 11, 15)])
        assert len(errors) == 4 and all(e[1] == "ValueError('bad rank')" for e in errors), errors
        assert sorted(e[0] for e in errors) == sorted(f"debugee{{'host': {r // 4}/4, 'gpu': 2/4}}" for r in (2, 6, 10, 14))
        assert prog.wait() == 0, prog.describe()

        # the program is gone: the CLI says so and ends
        cli.child.sendline("list")
        text, status = cli.finish()
        assert "closed the connection" in text and status == 0, text
        # the user was told once to run monarch debug, and the token file is gone with the program
        assert len(prog.notices()) == 1, prog.notices()
        assert not (tmp_path / "debug.token").exists()
    finally:
        cli.kill()
