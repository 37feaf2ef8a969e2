"""``Workspace``: local directories to copy to the hosts of a host mesh
(``HostMesh.sync_workspace``).

Standard library only (``monarch_core.actor`` imports it and must stay
light); the copying is the scheduler's (``Allocation.sync_workspace`` in
``hookspecs``), the checks before it ``_launch._code_sync``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Union

__all__ = ["Environment", "SyncedHost", "Workspace", "active_environment"]

_PathLike = Union[str, "os.PathLike[str]"]

logger = logging.getLogger("monarch.workspace")


class Workspace:
    """One or more local directories (your project's code) and where each
    goes on the remote hosts, relative to their working directory.

    A workspace directory is a *root* of your code, as an entry of
    ``PYTHONPATH`` is (the reference's semantics): the directory that holds
    your packages, not a package itself.  For ``src/mypkg/__init__.py``,
    ``Workspace(dirs=["src"])`` makes ``import mypkg`` work on the hosts;
    ``Workspace(dirs=["src/mypkg"])`` would put ``mypkg``'s own folder on
    ``sys.path`` (its modules import as top-level ones, ``mypkg`` itself does
    not), so a directory that has an ``__init__.py`` is logged as a WARNING
    on ``monarch.workspace`` naming the directory to give instead.

    ``Workspace(dirs=[...])``: each directory keeps its own name remotely
    (``~/proj/trainer`` becomes ``<remote working dir>/trainer``).
    ``Workspace(dirs={local: remote, ...})``: explicit remote names, relative
    POSIX paths; ``""`` copies the directory's contents into the working
    directory itself.  ``Workspace()`` holds nothing (a sync copies nothing).

    After ``HostMesh.sync_workspace(workspace)``, every remote directory is
    first on the ``sys.path`` of the procs spawned on those hosts afterwards,
    so they import the copied code.

    Raises ``TypeError`` for the wrong types and ``ValueError`` for an empty
    local path, an absolute remote name or one that leaves the working
    directory (``..``), or two local directories sent to the same remote one.
    Whether the local directories exist is checked when they are synced.
    """

    __slots__ = ("_dirs",)

    def __init__(self, dirs: Sequence[_PathLike] | Mapping[_PathLike, str] | None = None) -> None:
        out: dict[Path, str] = {}
        if dirs is None:
            pass
        elif isinstance(dirs, Mapping):
            for src, dst in dirs.items():
                out[_local(src)] = _remote(dst, src)
        elif isinstance(dirs, (str, bytes, os.PathLike)):
            raise TypeError(
                f"Workspace(dirs=...) takes a list of directories or a dict {{local: remote}}, got the single path "
                f"{dirs!r}; write Workspace(dirs=[{str(dirs)!r}])"
            )
        elif isinstance(dirs, Sequence):
            for src in dirs:
                p = _local(src)
                out[p] = p.resolve().name if p.name in ("", ".", "..") else p.name
        else:
            raise TypeError(
                f"Workspace(dirs=...) takes a list of directories or a dict {{local: remote}}, got {type(dirs).__name__}"
            )
        seen: dict[str, Path] = {}
        for src, dst in out.items():
            if dst in seen:
                raise ValueError(
                    f"Workspace: {str(seen[dst])!r} and {str(src)!r} would both go to the remote directory "
                    f"{dst or '(the working directory)'!r}; give them different names with a dict, "
                    f"e.g. Workspace(dirs={{{str(seen[dst])!r}: 'a', {str(src)!r}: 'b'}})"
                )
            seen[dst] = src
        self._dirs = out
        for src in out:
            _warn_if_package(src)

    @property
    def dirs(self) -> dict[Path, str]:
        """Local directory -> remote name (relative to the remote working directory; ``""``: the directory itself)."""
        return dict(self._dirs)

    def remote_dirs(self, root: str) -> list[str]:
        """The remote directories under ``root`` (a host's working directory), in order."""
        return [posixpath.normpath(posixpath.join(root, dst)) if dst else root for dst in self._dirs.values()]

    def __iter__(self) -> Iterator[tuple[Path, str]]:
        return iter(self._dirs.items())

    def __len__(self) -> int:
        return len(self._dirs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Workspace) and self._dirs == other._dirs

    def __hash__(self) -> int:
        return hash(tuple(self._dirs.items()))

    def __repr__(self) -> str:
        return f"Workspace(dirs={ {str(k): v for k, v in self._dirs.items()} !r})"


def _warn_if_package(src: Path) -> None:
    """Log the mistake of giving a package's own folder as a workspace directory."""
    try:
        is_package = (src / "__init__.py").is_file()
    except OSError:
        return
    if is_package:
        parent = src.resolve().parent
        logger.warning(
            "Workspace: %s is a package (it has an __init__.py); a workspace directory goes on the procs' sys.path "
            "as a root of your code, so `import %s` would not find it on the hosts: give the directory that holds "
            "it, Workspace(dirs=[%r])", src, src.resolve().name, os.path.relpath(parent) if not src.is_absolute()
            else str(parent))


def _local(src: object) -> Path:
    if not isinstance(src, (str, os.PathLike)):
        raise TypeError(f"Workspace: a local directory must be a str or a path, got {src!r}")
    if not os.fspath(src):
        raise ValueError("Workspace: an empty local path would mean the current directory by accident; write '.'")
    return Path(os.path.expanduser(os.fspath(src)))


def _remote(dst: object, src: object) -> str:
    if not isinstance(dst, str):
        raise TypeError(f"Workspace: the remote name of {src!r} must be a str (a relative path), got {dst!r}")
    p = PurePosixPath(dst)
    if p.is_absolute() or ".." in p.parts:
        raise ValueError(
            f"Workspace: the remote name {dst!r} of {str(src)!r} must be a relative path inside the remote working "
            "directory (no leading '/', no '..'); set the working directory itself in the scheduler's configuration "
            "(cwd = ...)"
        )
    norm = posixpath.normpath(dst) if dst else ""
    return "" if norm == "." else norm


@dataclasses.dataclass(frozen=True)
class SyncedHost:
    """What one host holds after ``Allocation.sync_workspace``: what the
    allocation returns for it (a ``{host name: SyncedHost}`` mapping), and
    what the host mesh gives every proc it spawns there from then on.

    ``paths``: the host's directories of the workspace, in the workspace's
    order (put first on the procs' ``sys.path``; ``auto_reload`` maps a
    changed local file to its copy with them).  ``python``: the interpreter
    procs there run from now on (``conda=True``: the shipped environment's),
    or ``None`` (the worker loop's own).  ``local``: the paths are this
    client's own directories (a filesystem the host shares), nothing was
    copied."""

    paths: tuple[str, ...] = ()
    python: str | None = None
    local: bool = False


@dataclasses.dataclass(frozen=True)
class Environment:
    """The Python environment ``sync_workspace(conda=True)`` ships:
    ``prefix`` (its root directory), ``name`` (the directory it gets on the
    hosts, ``<working dir>/.monarch/env/<name>``), ``python`` (the
    interpreter, relative to ``prefix``), ``kind`` (``"conda"`` or
    ``"venv"``) and, for a venv, ``home`` (``pyvenv.cfg``'s: the base
    interpreter's directory, which must exist on every host too)."""

    prefix: Path
    name: str
    python: str
    kind: str
    home: str | None = None

    def remote_root(self, root: str) -> str:
        """Where it goes under ``root`` (a host's working directory)."""
        return posixpath.join(root, ".monarch", "env", self.name)


def active_environment() -> Environment:
    """The environment this client runs in: the active conda environment
    (``CONDA_PREFIX``), else the virtual environment at ``sys.prefix``.
    ``RuntimeError`` saying what to do for a system interpreter (nothing
    that could be copied without copying the system)."""
    conda = os.environ.get("CONDA_PREFIX")
    if conda and Path(conda).is_dir():
        prefix = Path(conda)
        return Environment(prefix, prefix.name or "base", _python_in(prefix), "conda")
    prefix = Path(sys.prefix)
    cfg = prefix / "pyvenv.cfg"
    if sys.prefix != sys.base_prefix and cfg.is_file():
        home = None
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                home = value.strip()
        return Environment(prefix, prefix.name, _python_in(prefix), "venv", home)
    raise RuntimeError(
        f"sync_workspace(conda=True): this client runs the system interpreter {sys.executable} ({sys.prefix}), "
        "neither a conda environment (CONDA_PREFIX is not set) nor a virtual environment, so there is no "
        "environment to ship. Run the client in one (python -m venv .venv && .venv/bin/pip install ...; or "
        "conda activate <env>), or leave conda=False and install the packages on the hosts"
    )


def _python_in(prefix: Path) -> str:
    """The interpreter's path relative to ``prefix`` (this one's, when it lives there)."""
    exe = Path(sys.executable)
    if exe.is_relative_to(prefix):
        return exe.relative_to(prefix).as_posix()
    for name in ("bin/python3", "bin/python"):
        if (prefix / name).exists():
            return name
    return "bin/python"
