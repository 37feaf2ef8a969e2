"""The reference runners' ``--python`` option (run_reference_examples.py,
run_reference_tests.py): the same selection and judging under another
interpreter, e.g. a virtual environment holding the reference itself.

"Another interpreter without monarch-compat" is a new virtual environment
reaching this one's site-packages as a plain path entry (torch, pytest; not
the editable installs): it imports torch but not ``monarch_compat``, as the
reference's own environment."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _interpreter_without_compat(folder: Path) -> str:
    """The python of a new virtual environment in ``folder/venv`` that reaches this environment's
    site-packages as a plain path entry (torch, pytest; but not the editable installs, whose ``.pth``
    files only a site directory's processing reads), wrapped in a script that leaves a mark in
    ``folder/used`` each time it runs."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True, timeout=300)
    site = sysconfig.get_paths()["purelib"]
    own = subprocess.run([str(folder / "venv" / "bin" / "python"), "-c", "import sysconfig; "
                          "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    Path(own, "parent.pth").write_text(site + "\n")
    script = folder / "python-without-compat"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {str(folder / 'used')!r}
        exec {str(folder / 'venv' / 'bin' / 'python')!r} "$@"
    """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    probe = subprocess.run([str(script), "-c", "import torch, importlib.util; "
                            "assert importlib.util.find_spec('monarch_compat') is None"], timeout=300)
    assert probe.returncode == 0, "the interpreter made for the test has monarch_compat, or lacks torch"
    return str(script)


def test_examples_runner_runs_a_cuda_program_under_another_interpreter_through_the_shim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = _load("run_reference_examples")
    python = _interpreter_without_compat(tmp_path)
    assert runner.cpu_shim(sys.executable, str(tmp_path / "own")) is None  # this one has monarch_compat
    shim = runner.cpu_shim(python, str(tmp_path / "logs"))
    assert shim is not None
    assert sorted(os.listdir(os.path.join(shim, "monarch_compat"))) == ["__init__.py", "_settings.py"]  # no copy
    (tmp_path / "gpu.py").write_text(textwrap.dedent("""
        import os, subprocess, sys
        import torch
        import torch.distributed as dist
        import monarch_compat
        print("client", torch.zeros(2, device="cuda").device, flush=True)
        child = subprocess.run([os.environ["PYTHON_WITHOUT_COMPAT"], "-c",
                                "import torch; print(torch.ones(1, device='cuda:0').device)"],
                               capture_output=True, text=True, timeout=120)
        print("child", child.stdout.strip(), child.stderr[-300:], flush=True)
        print("gloo" if getattr(dist.init_process_group, "_monarch_compat_cpu", False) else "nccl", flush=True)
        first = os.environ["PATH"].split(os.pathsep)[0]  # the interpreter's folder, as in its activated venv
        print("path", "first" if first == os.path.dirname(os.environ["PYTHON_WITHOUT_COMPAT"]) else first)
    """))
    monkeypatch.setenv("PYTHON_WITHOUT_COMPAT", python)  # the program's own child processes use it too
    ex = runner.Example("gpu.py", cpu=True, timeout_s=120, expect=("client cpu", "child cpu", "gloo", "path first"))
    log = tmp_path / "gpu.log"
    ok, why, _ = runner.run_one(ex, str(tmp_path), str(log), python, shim)
    assert (ok, why) == (True, ""), log.read_text()
    assert "monarch_compat.cpu" in (tmp_path / "used").read_text()
    # without the shim that interpreter has no monarch_compat.cpu: the program cannot start
    ok, why, _ = runner.run_one(ex, str(tmp_path), str(tmp_path / "noshim.log"), python, None)
    assert not ok and "monarch_compat" in why


def test_tests_runner_runs_the_files_as_shipped_under_an_interpreter_without_compat(tmp_path: Path,
                                                                                     capsys) -> None:  # type: ignore[no-untyped-def]
    runner = _load("run_reference_tests")
    ref = tmp_path / "ref"
    (ref / "tests").mkdir(parents=True)
    original = textwrap.dedent("""\
        import sys


        def test_public():
            assert 'monarch_compat' not in sys.modules


        def test_private():
            assert 'monarch._src.actor' == 'excluded from the selection: never run'
    """)
    (ref / "tests" / "test_python_actors.py").write_text(original)
    python = _interpreter_without_compat(tmp_path)
    keep = tmp_path / "keep"
    status = runner.main([str(ref), "--python", python, "--keep", str(keep), "--timeout", "120"])
    out = capsys.readouterr().out
    assert "passed 1 failed 0 total 1" in out, out
    assert status == 0
    assert (keep / "run" / "test_python_actors.py").read_text() == original  # run as shipped, not rewritten
    assert "-m pytest" in (tmp_path / "used").read_text()
