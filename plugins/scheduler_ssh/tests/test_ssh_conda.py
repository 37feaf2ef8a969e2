"""``sync_workspace(conda=True)`` over SSH: the client's environment travels.

The testbed's hosts share this machine's filesystem, so the test makes the
difference visible: the client runs in a small venv of its own (made here
with ``python -m venv``; a ``.pth`` adds the project venv's site-packages so
monarch imports) holding a tiny package the hosts' interpreter (the project
venv, ``python = ...`` in the entry) does not have.  A proc spawned before
``conda=True`` cannot import it; one spawned after runs the shipped copy's
interpreter, under the host's working directory, and imports it from there.
A second sync sends only what changed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ssh_helpers as H
from _helpers.envs import client_venv

PRELUDE = r'''
import asyncio, os, sys, time
from monarch_core.actor import Actor, Workspace, endpoint, hosts_from_config


class Probe(Actor):
    @endpoint
    def probe(self, name):
        import importlib
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            found = "ImportError: " + str(e)
        else:
            found = mod.__file__
        return [sys.executable, sys.prefix, found]


hm = hosts_from_config("one")
before = hm.spawn_procs().spawn("before", Probe)
'''


def test_conda_true_ships_the_clients_venv_and_new_procs_run_it(sshd: Any, tmp_path: Path) -> None:
    tag = H.new_tag()
    pkg = f"tinypkg_{tag}"
    venv = client_venv(tmp_path, pkg)
    remote = tmp_path / "remote"
    # the hosts' own interpreter: the project venv, which has no tinypkg
    H.write_config(tmp_path, {"one": H.entry(tag, tmp_path, hosts=["h1"], cwd=str(remote / "{host}"), python=H.PY)})
    client = H.Client(PRELUDE, cwd=tmp_path, env={"MONARCH_CONFIG": str(tmp_path / "monarch.toml")},
                      python=str(venv / "bin" / "python"))
    try:
        assert client.run(f"import {pkg}; result = [sys.prefix, {pkg}.__file__]")[0] == str(venv)
        [(exe, prefix, found)] = client.run(f"result = before.probe.call({pkg!r}).get(timeout=120).values()")
        assert prefix == str(Path(H.PY).parent.parent) and found.startswith("ImportError"), (exe, prefix, found)
        shipped = remote / "h1" / ".monarch" / "env" / "clientenv"
        out = client.run(f"""
            asyncio.run(hm.sync_workspace(Workspace(), conda=True))
            after = hm.spawn_procs().spawn("after", Probe)
            result = [after.probe.call({pkg!r}).get(timeout=120).values(),
                      before.probe.call({pkg!r}).get(timeout=120).values()]
        """)
        [(exe, prefix, found)], [(_, _, still)] = out
        assert exe == str(shipped / "bin" / "python") and prefix == str(shipped), (exe, prefix)
        assert found.startswith(str(shipped) + "/") and found.endswith(f"/site-packages/{pkg}/__init__.py"), found
        assert still.startswith("ImportError"), still  # procs already running keep their interpreter
        assert (shipped / "bin" / "python").is_symlink()  # links travel as links (the base interpreter stays)
        init = Path(found)
        seen = (init.stat().st_ino, init.stat().st_ctime_ns)
        Path(found.replace(str(shipped), str(venv))).with_name("extra.py").write_text("X = 1\n")  # pip install, say
        client.run("asyncio.run(hm.sync_workspace(Workspace(), conda=True))")
        assert (init.parent / "extra.py").read_text() == "X = 1\n"
        assert (init.stat().st_ino, init.stat().st_ctime_ns) == seen, "an unchanged file of the env was copied again"
    finally:
        client.run("hm.shutdown().get(timeout=60); result = None")
        client.close()
        H.wait_tagged_gone(tag, (1,))
