"""Breakpoints in procs on other hosts: worker loops in the network-namespace
hosts ``h1..h3`` (their own addresses and host names), a client in the root
namespace reaching them over mutual TLS, and ``monarch debug`` beside the
client.  The procs talk to the client's debug controller over their actor
channels only (no port is opened on the hosts), and the actor's source, which
exists on no host (compiled from a string the client registered in its
``linecache``, as a notebook does), is shown by ``l``.
"""

from __future__ import annotations

import json

import pytest

from debugger_helpers import PDB, Cli, cast_lines, debug_env, run_program
from _helpers.transport import ROOT_ADDR, free_port, host_addr

pytest.importorskip("pexpect")
pytest.importorskip("lark")

HOSTS = (1, 2, 3)
CELL = "/no/such/dir/notebook-cell-7.py"


def test_ranks_on_three_namespace_hosts_stop_list_attach_cast_and_post_mortem(netns, workers, pki, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ws = [workers(f"tls://{host_addr(i)}:{free_port()}", host=i, tls=pki.hosts[i]) for i in HOSTS]
    cfg = {"workers": [w.address for w in ws], "ca": pki.ca, "key": pki.client.key, "cert": pki.client.cert,
           "bind": f"tls://{ROOT_ADDR}:0"}
    env = debug_env(tmp_path / "debug.token")
    prog = run_program("remote_debugee.py", json.dumps(cfg), env=env, cwd=tmp_path)
    cli = None
    try:
        cli = Cli(["--port", str(prog.port())], env)
        rows = cli.poll_list(6)
        stops = {0: 11, 1: 15, 2: 19, 3: 23}  # the lines after each breakpoint() in the cell
        assert rows == [{"Actor": "debugee", "Rank": str(r), "Coords": f"hosts={r // 2}, gpu={r % 2}",
                         "Hostname": f"h{r // 2 + 1}", "Function": "_debugee_actor_internal",
                         "Line": str(stops[r % 4])} for r in range(6)], rows

        # attach on h2: the cell's real lines, from the client
        out, prompt = cli.run("attach debugee 3")
        assert prompt == PDB
        assert out.splitlines() == ["Attached to debug session for rank 3 (h2)",
                                    f"> {CELL}(23)_debugee_actor_internal()", "-> rank += 4"], out
        listing = cli.pdb("l")
        assert " 23  ->\t        rank += 4" in listing and " 22  \t        breakpoint()  # noqa" in listing, listing
        assert cli.pdb("p rank") == "3\n"
        assert cli.cmd("detach").startswith("Detached")

        # cast by dimension: hosts h2..h3, gpu 1
        got = cast_lines(cli.cmd("cast debugee ranks(hosts=1:3, gpu=1) p rank"))
        assert {r: lines[-1] for r, lines in got.items()} == {3: "3", 5: "5"}, got

        # continue: rank 2 (on h2) raises after its breakpoint and stops post-mortem
        assert cli.cmd("continue").startswith("Continued 6 ranks.")
        rows = cli.poll_list(1, post_mortem=1)
        assert rows[0]["Rank"] == "2" and rows[0]["Hostname"] == "h2" and rows[0]["Line"] == "5", rows
        out, _ = cli.run("attach debugee 2")
        assert "ValueError: bad rank" in out and out.splitlines()[-1] == '-> raise ValueError("bad rank")', out
        assert cli.cmd("c").startswith("Detached from debug session for rank 2")
        assert prog.result("values") == [1, 3, 5, 7, 7]
        assert prog.result("errors") == [["debugee{'hosts': 1/3, 'gpu': 0/2}", "ValueError('bad rank')"]]
        assert prog.wait() == 0, prog.describe()
    finally:
        if cli is not None:
            cli.kill()
        prog.kill()
