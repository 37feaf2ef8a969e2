"""``HostMesh.sync_workspace`` on Slurm (real jobs on h5..h7): a workspace the
nodes share is used where it is (nothing copied); ``MONARCH_SLURM_SYNC_COPY=1``
copies it into each node's ``sync_dir`` through job steps and ``sbcast``
(the testbed's nodes share this machine's filesystem, so forcing the copy is
how its path is tested); ``auto_reload=True`` makes a module edited on the
client be seen by a running proc; ``conda=True`` ships the client's venv, and
procs spawned afterwards run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H
from _helpers.envs import client_venv

pytest.importorskip("hostlist")

PROGRAM = r'''
import asyncio, json, os, sys, time
from monarch_core.actor import Actor, Workspace, endpoint, hosts_from_config

MOD, CONDA, PKG = sys.argv[1], sys.argv[2] == "conda", sys.argv[3]


class Loader(Actor):
    @endpoint
    def load(self, name):
        import importlib
        mod = importlib.import_module(name)
        return [mod.VALUE, mod.__file__, sys.executable]

    @endpoint
    def has(self, name):
        import importlib
        try:
            return importlib.import_module(name).__file__
        except ImportError as e:
            return "ImportError: " + str(e)


os.environ["MONARCH_AUTO_RELOAD_INTERVAL"] = "0.2"
hm = hosts_from_config("job")
out = {}
if CONDA:
    out["before"] = hm.spawn_procs().spawn("before", Loader).has.call(PKG).get(timeout=120).values()
t0 = time.monotonic()
asyncio.run(hm.sync_workspace(Workspace(dirs=["code"]), conda=CONDA, auto_reload=True))
loader = hm.spawn_procs().spawn("loader", Loader)
out["first"] = loader.load.call(MOD).get(timeout=120).values()
if CONDA:
    out["pkg"] = loader.has.call(PKG).get(timeout=120).values()
with open(f"code/{MOD}.py", "w") as f:
    f.write("VALUE = 22\n")
deadline = time.monotonic() + 60
values = [v for v, _, _ in loader.load.call(MOD).get(timeout=60).values()]
while values != [22, 22] and time.monotonic() < deadline:
    time.sleep(0.2)
    values = [v for v, _, _ in loader.load.call(MOD).get(timeout=60).values()]
out["reloaded"] = values
hm.shutdown().get(timeout=60)
print("RESULT " + json.dumps(out), flush=True)
'''


def _project(d: Path, mod: str, *, python: str = H.PY) -> None:
    H.write_project(d, PROGRAM, f'''
        [hosts.job]
        scheduler = "slurm"
        nodes = 2
        time = "00:10:00"
        job_name = "{H.JOB_NAME}"
        python = "{H.PY}"
        sync_dir = "{d}/nodes/{{node}}"
    ''')
    (d / "code").mkdir()
    (d / "code" / f"{mod}.py").write_text("VALUE = 1\n")


def _run(d: Path, argv: list[str], python: str = H.PY, env_extra: dict[str, str | None] | None = None) -> dict:
    res = subprocess.run([python, "prog.py", *argv], cwd=d, capture_output=True, text=True, timeout=H.CLIENT_TIMEOUT,
                         env=H.env(env_extra))
    (d / "out.txt").write_text(res.stdout + "\n--- stderr ---\n" + res.stderr)
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line; rc {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")


def test_a_shared_workspace_is_not_copied_and_running_procs_reload_an_edit(cluster: Any, tmp_path: Path) -> None:
    mod = f"shared_{tmp_path.name[-8:]}".replace("-", "_")
    _project(tmp_path, mod)
    out = _run(tmp_path, [mod, "-", "-"])
    assert [v for v, _, _ in out["first"]] == [1, 1]
    assert [p for _, p, _ in out["first"]] == [str(tmp_path / "code" / f"{mod}.py")] * 2  # the client's own file
    assert out["reloaded"] == [22, 22], out
    assert not (tmp_path / "nodes").exists(), "a shared workspace was copied"


def test_the_copy_goes_to_each_nodes_sync_dir_through_job_steps(cluster: Any, tmp_path: Path) -> None:
    mod = f"copied_{tmp_path.name[-8:]}".replace("-", "_")
    _project(tmp_path, mod)
    out = _run(tmp_path, [mod, "-", "-"], env_extra={"MONARCH_SLURM_SYNC_COPY": "1"})
    assert [v for v, _, _ in out["first"]] == [1, 1]
    assert [p for _, p, _ in out["first"]] == [str(tmp_path / "nodes" / n / "code" / f"{mod}.py") for n in (H.N1, H.N2)]
    assert out["reloaded"] == [22, 22], out  # synced again (copied), then reloaded
    for n in (H.N1, H.N2):
        assert (tmp_path / "nodes" / n / "code" / f"{mod}.py").read_text() == "VALUE = 22\n"


def test_conda_true_copies_the_clients_venv_and_new_procs_run_it(cluster: Any, tmp_path: Path) -> None:
    mod, pkg = "envmod", f"tinypkg_{tmp_path.name[-8:]}".replace("-", "_")
    _project(tmp_path, mod)
    venv = client_venv(tmp_path, pkg)
    out = _run(tmp_path, [mod, "conda", pkg], python=str(venv / "bin" / "python"),
               env_extra={"MONARCH_SLURM_SYNC_COPY": "1"})
    assert all(b.startswith("ImportError") for b in out["before"]), out["before"]  # the nodes' own Python lacks it
    for n, (_v, _p, exe), found in zip((H.N1, H.N2), out["first"], out["pkg"]):
        shipped = tmp_path / "nodes" / n / ".monarch" / "env" / "clientenv"
        assert exe == str(shipped / "bin" / "python"), exe
        assert found.startswith(str(shipped) + "/") and found.endswith(f"/{pkg}/__init__.py"), found
        assert (shipped / "bin" / "python").is_symlink()
    assert out["reloaded"] == [22, 22], out
