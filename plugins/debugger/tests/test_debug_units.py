"""The debugger's pieces on their own: the ``attach``/``cast`` grammar and
what ``ranks(...)`` selects, the ``list`` table, the token file, the wire
format, the breakpoint hook's ``PYTHONBREAKPOINT`` handling, and the code
objects of functions shipped by value keeping their file names."""

from __future__ import annotations

import sys

import os
import pickle
import stat

import pytest

from monarch_debugger import _hook, _protocol, _state
from monarch_debugger._ranks import RankSpecError, Selection, Span, compact, parse_attach, parse_cast

pytest.importorskip("lark")

LABELS, SIZES = ["host", "gpu"], [4, 4]


@pytest.mark.parametrize("text, ranks, command", [
    ("debugee ranks(3) n", [3], "n"),
    ("debugee ranks(1,2,3) p rank", [1, 2, 3], "p rank"),
    ("debugee ranks(2:7:2) s", [2, 4, 6], "s"),
    ("debugee ranks(host=2:4, gpu=1:3) c", [9, 10, 13, 14], "c"),
    ("debugee ranks(host=1) p x;; p y", [4, 5, 6, 7], "p x;; p y"),
    ("debugee ranks( 0 , 14: ) until 30", [0, 14, 15], "until 30"),
    ("debugee ranks(::5) w", [0, 5, 10, 15], "w"),
    ("debugee ranks(gpu=::3) ll", [0, 3, 4, 7, 8, 11, 12, 15], "ll"),
])
def test_every_form_of_ranks_selects_what_the_guide_says(text: str, ranks: list[int], command: str) -> None:
    actor, sel, cmd = parse_cast(text)
    assert (actor, cmd) == ("debugee", command)
    assert sel.ranks(actor, LABELS, SIZES) == ranks


@pytest.mark.parametrize("text, message", [
    ("", "usage: cast <actor> ranks(<ranks>) <pdb command>"),
    ("debugee", "ends too early: expected ranks("),
    ("debugee rank(3) n", "expected ranks( at column 9"),
    ("debugee ranks(3)", "ends too early: expected a pdb command"),
    ("debugee ranks() n", "expected ':' or a dimension name or a rank (a number) at column 15"),
    ("debugee ranks(1:2:0) n", "ranks(1:2:0): a slice step cannot be zero"),
    ("debugee ranks(host=1, host=2) n", "dimension 'host' is given twice"),
    ("debugee ranks(-1) n", "expected ':' or a dimension name or a rank (a number)"),
])
def test_a_bad_cast_says_what_was_expected_in_one_line(text: str, message: str) -> None:
    with pytest.raises(RankSpecError) as e:
        parse_cast(text)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("spec, message", [
    ("ranks(16) n", "rank 16 is out of range: debugee has 16 ranks (0-15)"),
    ("ranks(host=4) n", "host=4 is out of range: host has size 4 (0-3)"),
    ("ranks(gpus=1:3) n", "debugee has no dimension 'gpus' (did you mean 'gpu'?); its dimensions: host, gpu"),
    ("ranks(zzz=1) n", "debugee has no dimension 'zzz'; its dimensions: host, gpu"),
])
def test_a_selection_outside_the_mesh_names_what_exists(spec: str, message: str) -> None:
    actor, sel, _ = parse_cast(f"debugee {spec}")
    with pytest.raises(RankSpecError) as e:
        sel.ranks(actor, LABELS, SIZES)
    assert message in str(e.value), str(e.value)


def test_attach_takes_an_actor_and_a_rank() -> None:
    assert parse_attach("debugee 13") == ("debugee", 13)
    assert parse_attach("  trainer#2   0 ") == ("trainer#2", 0)
    for bad, message in [("", "usage: attach <actor> <rank>"), ("debugee", "expected a rank"),
                         ("debugee x", "expected a rank (a number) at column 9"),
                         ("debugee 1 2", "expected nothing more at column 11")]:
        with pytest.raises(RankSpecError) as e:
            parse_attach(bad)
        assert message in str(e.value), str(e.value)


def test_spans_and_compact_rank_lists() -> None:
    assert Span(2, 7, 2).indices(16) == range(2, 7, 2)
    assert str(Span(None, 3, None)) == ":3" and str(Span(1, None, 2)) == "1::2"
    assert Selection(items=(Span(None, None, None),)).ranks("a", [], []) == [0]  # a single actor
    assert compact([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and compact([]) == ""


def test_the_list_table_has_the_guides_columns() -> None:
    from monarch_debugger._cli import format_table

    rows = [{"actor": "debugee", "rank": 10, "labels": ["host", "gpu"], "coords": [2, 2], "hostname": "h3",
             "function": "_bad_rank", "lineno": 17, "post_mortem": True}]
    lines = format_table(rows).splitlines()
    assert [c.strip() for c in lines[1].strip("|").split("|")] == ["Actor", "Rank", "Coords", "Hostname",
                                                                   "Function", "Line"]
    assert [c.strip() for c in lines[3].strip("|").split("|")] == ["debugee", "10", "host=2, gpu=2", "h3",
                                                                   "_bad_rank [post-mortem]", "17"]


def test_the_token_file_is_the_users_only_and_removed_only_by_its_writer(tmp_path, monkeypatch) -> None:
    path = tmp_path / "sub" / "dbg.token"
    monkeypatch.setenv("MONARCH_DEBUG_TOKEN_FILE", str(path))
    written, token = _protocol.write_token_file(27001)
    assert written == path and len(token) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert _protocol.read_token(27001) == token
    _protocol.remove_token_file(path, "not-the-token")  # someone else's: left alone
    assert path.exists()
    _protocol.remove_token_file(path, token)
    assert not path.exists()
    with pytest.raises(_protocol.CliError, match="no token file .*dbg.token: the debug server writes it"):
        _protocol.read_token(27001)
    path.write_text("garbage")
    with pytest.raises(_protocol.CliError, match="unreadable"):
        _protocol.read_token(27001)


def test_the_default_token_file_is_per_port_in_the_users_home(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("MONARCH_DEBUG_TOKEN_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _protocol.token_path(27000) == tmp_path / ".monarch" / "debug" / "27000.token"


def test_the_port_setting_is_checked(monkeypatch) -> None:
    from monarch_core.errors import ConfigError

    monkeypatch.setenv("MONARCH_DEBUG_SERVER_PORT", "70000")
    with pytest.raises(ConfigError, match=r"MONARCH_DEBUG_SERVER_PORT must be a TCP port \(0-65535\), got 70000"):
        _protocol.server_port()
    monkeypatch.setenv("MONARCH_DEBUG_SERVER_PORT", "abc")
    with pytest.raises(ConfigError, match="MONARCH_DEBUG_SERVER_PORT must be an integer"):
        _protocol.server_port()


def test_wire_messages_are_json_objects_one_per_line() -> None:
    assert _protocol.encode({"op": "list"}) == b'{"op":"list"}\n'
    assert _protocol.decode(b'{"ok": true}\n') == {"ok": True}
    with pytest.raises(ValueError):
        _protocol.decode(b"[1, 2]\n")
    with pytest.raises(ValueError):
        _protocol.decode(b"not json\n")


def test_pythonbreakpoint_keeps_its_meaning_in_procs(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONBREAKPOINT", "0")
    assert _hook.breakpointhook() is None
    monkeypatch.setenv("PYTHONBREAKPOINT", "os.getcwd")  # another debugger's hook runs as Python runs it
    assert _hook.breakpointhook() == os.getcwd()


def test_post_mortem_costs_nothing_where_no_breakpoint_was_hit(monkeypatch) -> None:
    monkeypatch.setattr(_state.STATE, "armed", False)
    monkeypatch.setitem(sys.modules, "monarch_debugger._session", None)  # importing it would raise ImportError
    _hook.post_mortem(ValueError("x"))


def test_functions_shipped_by_value_keep_their_file_name() -> None:
    """cloudpickle writes ``<dynamic-code>``; tracebacks and pdb need the real name."""
    from monarch_core._proc import _serial

    ns: dict = {"__name__": "__main__"}
    exec(compile("def f(n):\n    g = lambda k: k + 1\n    return [g(i) for i in range(n)]\n",
                 "/client/only/cell.py", "exec"), ns)
    payload, bufs = _serial.dumps(ns["f"])
    f = pickle.loads(payload, buffers=bufs)
    assert f(3) == [1, 2, 3]
    codes = [f.__code__, *(c for c in f.__code__.co_consts if hasattr(c, "co_filename"))]
    assert len(codes) == 3 and {c.co_filename for c in codes} == {"/client/only/cell.py"}


def _serve(coro_fn, monkeypatch, tmp_path, **env: str):  # type: ignore[no-untyped-def]
    """Run ``coro_fn(server)`` with a DebugServer on a fresh asyncio loop."""
    import asyncio

    from monarch_debugger._registry import Registry
    from monarch_debugger._server import DebugServer

    monkeypatch.setenv("MONARCH_DEBUG_TOKEN_FILE", str(tmp_path / "t.token"))
    monkeypatch.setenv("MONARCH_DEBUG_SERVER_PORT", "0")
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    async def main():  # type: ignore[no-untyped-def]
        server = DebugServer(Registry())
        server.ensure_serving()  # what the controller does at the first stop
        try:
            return await asyncio.wait_for(coro_fn(server), 20)
        finally:
            await server.aclose()

    return asyncio.run(main())


def test_a_server_that_cannot_bind_says_so_once_and_lets_breakpoints_continue(monkeypatch, tmp_path, capsys) -> None:
    async def check(server):  # type: ignore[no-untyped-def]
        return server.error

    error = _serve(check, monkeypatch, tmp_path, MONARCH_DEBUG_SERVER_HOST="no-such-host.invalid")
    assert error is not None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("monarch: the debug server could not start at no-such-host.invalid:0")
    assert "breakpoint() in actors continues without stopping" in err[0]
    assert not (tmp_path / "t.token").exists()


def test_the_server_refuses_garbage_and_wrong_tokens_and_keeps_serving(monkeypatch, tmp_path) -> None:
    import asyncio

    async def exchange(port: int, *lines: bytes) -> list[dict]:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        out = []
        for line in lines:
            w.write(line)
            await w.drain()
            got = await r.readline()
            if not got:
                break
            out.append(_protocol.decode(got))
        rest = await r.read()  # the server closes refused connections
        w.close()
        return out + ([{"rest": rest}] if rest else [])

    async def check(server):  # type: ignore[no-untyped-def]
        assert server.error is None and server.host == "localhost"
        port = server.port
        garbage = await exchange(port, b"GET / HTTP/1.0\r\n")
        wrong = await exchange(port, _protocol.encode({"op": "hello", "token": "x" * 64, "pid": 1}))
        good = _protocol.encode({"op": "hello", "token": server.token, "pid": 2})
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(good + _protocol.encode({"op": "list"}) + _protocol.encode({"op": "frob"}) + b"[]\n")
        await w.drain()
        answers = [_protocol.decode(await r.readline()) for _ in range(4)]
        second = await exchange(port, good)  # one debugger at a time
        w.close()
        return garbage, wrong, answers, second

    garbage, wrong, answers, second = _serve(check, monkeypatch, tmp_path)
    assert garbage == [{"ok": False, "error": "expected a hello with the token first"}]
    assert wrong[0]["ok"] is False and wrong[0]["error"].startswith("wrong token") and len(wrong) == 1
    assert answers[0]["ok"] is True and answers[1] == {"ok": True, "sessions": []}
    assert answers[2] == {"ok": False, "error": "unknown request 'frob'; known: list, attach, send, wait, cast, continue"}
    assert answers[3]["ok"] is False and answers[3]["error"].startswith("malformed request")
    assert second[0]["ok"] is False and "another monarch debug (pid 2) is attached" in second[0]["error"]
