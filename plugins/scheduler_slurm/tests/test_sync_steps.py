"""``sync_workspace`` on Slurm, without Slurm: the steps' scripts run here,
once per pretend node (``SLURMD_NODENAME``), through a fake ``SlurmAPI``
whose ``broadcast`` is a file copy.  What is shared, what travels (only what
changed), where it lands, links kept, a missing venv base named."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from monarch_core.errors import AllocationError, ConfigError
from monarch_core.hookspecs import Environment, Workspace
from monarch_scheduler_slurm._params import DEFAULT_SYNC_DIR, parse_params
from monarch_scheduler_slurm._sync import SlurmSync, node_root

SRC = "<test slurm sync>"


class FakeSteps:
    """Steps run here, one process per node; what ran is kept."""

    def __init__(self) -> None:
        self.steps: list[list[str]] = []
        self.broadcasts: list[str] = []

    def run_step(self, job_id: str, nodes: Any, command: Any, *, input: str | None = None, timeout: float | None = None,
                 extra: Any = ()) -> subprocess.CompletedProcess:
        self.steps.append(list(command))
        out, err = "", ""
        for n in nodes:
            r = subprocess.run(list(command), input=input or "", capture_output=True, text=True, timeout=60,
                               env={**os.environ, "SLURMD_NODENAME": n})
            out, err = out + r.stdout, err + r.stderr
            if r.returncode:
                raise AllocationError(f"step failed on {n}: {r.stderr[-2000:]}")
        return subprocess.CompletedProcess(command, 0, out, err)

    def broadcast(self, job_id: str, source: str, dest: str, *, timeout: float | None = None) -> None:
        self.broadcasts.append(dest)
        shutil.copyfile(source, dest)

    def kinds(self) -> list[str]:
        return ["rm" if c[0] == "rm" else c[2].split('"monarch_slurm_sync": "')[1].split('"')[0] if "-c" in c else "?"
                for c in self.steps]


def _sync(api: FakeSteps, tmp_path: Path, *, force: bool) -> SlurmSync:
    return SlurmSync(api, "7", sys.executable, str(tmp_path / "nodes" / "{node}"), force_copy=force)


def test_a_workspace_the_nodes_see_is_used_where_it_is(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "m.py").write_text("x = 1\n")
    api = FakeSteps()
    out = _sync(api, tmp_path, force=False).sync(Workspace(dirs=[code]), ["n1", "n2"], None)
    assert {n: (h.paths, h.local) for n, h in out.items()} == {n: ((str(code.resolve()),), True) for n in ("n1", "n2")}
    assert api.broadcasts == [] and not (tmp_path / "nodes").exists()
    assert not list(code.glob(".monarch-shared-*")), "the marker was left behind"


def test_the_copy_sends_only_what_changed_and_keeps_links(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "m.py").write_text("x = 1\n")
    (code / "data.txt").write_text("same\n")
    env_prefix = tmp_path / "venv"
    (env_prefix / "bin").mkdir(parents=True)
    (env_prefix / "lib").mkdir()
    (env_prefix / "lib" / "site.py").write_text("y = 1\n")
    os.symlink(sys.executable, env_prefix / "bin" / "python")
    os.symlink("lib", env_prefix / "lib64")
    env = Environment(env_prefix, "venv", "bin/python", "venv", str(Path(sys.executable).parent))
    api = FakeSteps()
    s = _sync(api, tmp_path, force=True)
    out = s.sync(Workspace(dirs=[code]), ["n1", "n2"], env)
    for n in ("n1", "n2"):
        root = tmp_path / "nodes" / n
        assert out[n].paths == (str(root / "code"),) and not out[n].local
        assert out[n].python == str(root / ".monarch" / "env" / "venv" / "bin" / "python")
        assert (root / "code" / "pkg" / "m.py").read_text() == "x = 1\n"
        assert os.readlink(root / ".monarch" / "env" / "venv" / "bin" / "python") == sys.executable
        assert os.readlink(root / ".monarch" / "env" / "venv" / "lib64") == "lib"
    assert api.kinds() == ["hashes", "unpacked", "rm"]  # forced: no probe
    kept = (tmp_path / "nodes" / "n1" / "code" / "data.txt").stat().st_ino
    (code / "pkg" / "m.py").write_text("x = 2\n")
    api.steps.clear()
    s.sync(Workspace(dirs=[code]), ["n1", "n2"], env)
    assert (tmp_path / "nodes" / "n2" / "code" / "pkg" / "m.py").read_text() == "x = 2\n"
    assert (tmp_path / "nodes" / "n1" / "code" / "data.txt").stat().st_ino == kept, "an unchanged file travelled"
    api.steps.clear()
    s.sync(Workspace(dirs=[code]), ["n1", "n2"], env)
    assert api.kinds() == ["hashes"]  # nothing changed: nothing broadcast
    assert not list(tmp_path.glob("nodes/*/code/.*.monarch-*")), "a temporary file was left"


def test_a_venv_whose_base_python_is_missing_on_a_node_is_named(tmp_path: Path) -> None:
    env_prefix = tmp_path / "venv"
    env_prefix.mkdir()
    (env_prefix / "pyvenv.cfg").write_text("home = /nonexistent/python/bin\n")
    env = Environment(env_prefix, "venv", "bin/python", "venv", "/nonexistent/python/bin")
    with pytest.raises(AllocationError, match=r"base Python in /nonexistent/python/bin .*node\(s\) \['n1'\]"):
        _sync(FakeSteps(), tmp_path, force=True).sync(Workspace(), ["n1"], env)


def test_sync_dir_is_an_absolute_template() -> None:
    assert parse_params({}, SRC).sync_dir == DEFAULT_SYNC_DIR
    assert parse_params({"sync_dir": "/scratch/{user}/{job}"}, SRC).sync_dir == "/scratch/{user}/{job}"
    with pytest.raises(ConfigError, match="'sync_dir' must be an absolute path"):
        parse_params({"sync_dir": "rel/dir"}, SRC)
    assert node_root("/l/{job}/{node}", "12", "h1") == "/l/12/h1"


def test_answers_survive_the_interleaved_output_of_several_nodes() -> None:
    from monarch_scheduler_slurm import _sync as S

    big = __import__("secrets").token_hex(4000)  # random: several lines even compressed
    outs = []
    for node in ("n1", "n2"):
        r = subprocess.run([sys.executable, "-c", S.ANSWER + f"answer({{'v': {big!r}}})\n"], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "SLURMD_NODENAME": node})
        outs.append(r.stdout.splitlines())
    assert min(map(len, outs)) > 1  # several lines each
    mixed = "\n".join(x for pair in zip(*outs) for x in pair) + "\nsrun: some message\n0: " + outs[0][0]
    assert {n: v["v"] == big for n, v in S.answers(mixed).items()} == {"n1": True, "n2": True}
    assert S.answers("\n".join(outs[0][:-1])) == {}  # a cut answer is no answer
