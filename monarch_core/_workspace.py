"""``Workspace``: local directories to copy to the hosts of a host mesh
(``HostMesh.sync_workspace``).

Standard library only (``monarch_core.actor`` imports it and must stay
light); the copying is the scheduler's (``Allocation.sync_workspace`` in
``hookspecs``), the checks before it ``_launch._code_sync``'s.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Union

__all__ = ["Workspace"]

_PathLike = Union[str, "os.PathLike[str]"]


class Workspace:
    """One or more local directories (your project's code) and where each
    goes on the remote hosts, relative to their working directory.

    ``Workspace(dirs=[...])``: each directory keeps its own name remotely
    (``~/proj/trainer`` becomes ``<remote working dir>/trainer``).
    ``Workspace(dirs={local: remote, ...})``: explicit remote names, relative
    POSIX paths; ``""`` copies the directory's contents into the working
    directory itself.  ``Workspace()`` holds nothing (a sync copies nothing).

    After ``HostMesh.sync_workspace(workspace)``, every remote directory is
    on the ``PYTHONPATH`` of the procs spawned on those hosts afterwards, so
    they import the copied code.

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
