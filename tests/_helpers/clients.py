"""Child interpreters ("clients") that test this checkout.

A child gets the caller's environment with its ``PYTHONPATH`` kept, and the
folders this process imported ``monarch_core`` and the tcp plugin from ahead
of it, so it runs the same code as the test process (a checkout tests its
own code, not the one the virtual environment was installed from).  ``tests`` is on it too, so a
child can import test modules (which import ``_helpers``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

REPO = Path(__file__).resolve().parents[2]
#: the folder that holds ``_helpers``: test modules import it, and children
#: import test modules (actors are found by module name)
TESTS = REPO / "tests"
PY = sys.executable


def code_roots() -> list[str]:
    """The folders this process imports ``monarch_core`` and the bundled
    transport plugin from (where installed editable, the installed
    checkout's may differ from this one's): put first on a child's path, they
    make it run the same code as the test process."""
    import importlib

    roots = []
    for name in ("monarch_core", "monarch_transport_tcp", "monarch_transport_rdma"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        roots.append(str(Path(mod.__file__).resolve().parents[1]))
    return list(dict.fromkeys(roots))


def child_env(extra: Mapping[str, str | None] | None = None, *, path: Iterable[str | os.PathLike] = (),
              drop: Iterable[str] = ("MONARCH_CONFIG",)) -> dict[str, str]:
    """This environment for a child interpreter: ``path`` entries, the
    :func:`code_roots`, ``tests`` and then the caller's ``PYTHONPATH``; without the
    variables whose names start with one of ``drop`` (by default the project
    configuration of the outer run); plus ``extra`` (None removes a variable)."""
    drop = tuple(drop)
    env = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop))}
    parts = [str(p) for p in path] + [*code_roots(), str(TESTS)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env["PYTHONUNBUFFERED"] = "1"
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def write_script(directory: Path, body: str, name: str = "client.py") -> Path:
    """``body`` (dedented) as ``directory/name``."""
    p = Path(directory) / name
    p.write_text(textwrap.dedent(body))
    return p


def run_script(script: str | os.PathLike, *args: str, env: Mapping[str, str | None] | None = None,
               timeout: float = 60.0, cwd: str | os.PathLike | None = None, **kw: Any) -> subprocess.CompletedProcess:
    """Run ``python script *args`` (in the script's folder unless ``cwd``) with
    :func:`child_env` (``kw``: its ``path``/``drop``); text output captured."""
    script = Path(script)
    return subprocess.run([PY, str(script), *args], cwd=str(cwd or script.parent), env=child_env(env, **kw),
                          capture_output=True, text=True, timeout=timeout)


def run_code(code: str, *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 60.0,
             cwd: str | os.PathLike | None = None, **kw: Any) -> subprocess.CompletedProcess:
    """Run ``python -c code *args`` (``code`` dedented) like :func:`run_script`."""
    return subprocess.run([PY, "-c", textwrap.dedent(code), *args], cwd=None if cwd is None else str(cwd),
                          env=child_env(env, **kw), capture_output=True, text=True, timeout=timeout)


def describe(res: subprocess.CompletedProcess) -> str:
    """rc, stdout and stderr of a finished child, for assertion messages."""
    out, err = res.stdout or "", res.stderr or ""  # (None when not captured, or merged into stdout)
    return f"rc={res.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-6000:]}"


class LineReader:
    """Collects a pipe's lines in a thread; waits for a matching line."""

    def __init__(self, pipe: Any, name: str) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._t = threading.Thread(target=self._run, args=(pipe,), name=f"reader-{name}", daemon=True)
        self._t.start()

    def _run(self, pipe: Any) -> None:
        for line in iter(pipe.readline, ""):
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, match: Callable[[str], Any], timeout: float, start: int = 0) -> tuple[int, Any]:
        """Wait for the first line at index >= ``start`` for which ``match``
        is truthy; return (index, match result).  Raises on EOF or timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    m = match(self.lines[i])
                    if m:
                        return i, m
                    i += 1
                if self._eof:
                    raise EOFError("stream ended first")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no matching line within {timeout}s")
                self._cond.wait(left)

    def join(self, timeout: float) -> None:
        self._t.join(timeout)
