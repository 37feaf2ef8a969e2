"""``sync_workspace`` over SFTP: copy what changed, nothing else.

For one host: list the local files of every workspace directory (``__pycache__``
and ``*.pyc`` left out), ask the host for the SHA-256 of its copies of the
same size (one exec of a small script, ``_bootstrap.HASHES``), and upload only
files that are missing, of another size or another content -- each to a
temporary name, then renamed over the old one (a proc importing meanwhile sees
the old file or the new one, never half of one), with the local mode and
modification time, and the replaced modules' stale bytecode removed.  Remote
files that no longer exist locally are left alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import stat
import time
from pathlib import Path

import paramiko

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import Workspace
from monarch_scheduler_ssh import _bootstrap
from monarch_scheduler_ssh._connect import Connection

logger = logging.getLogger("monarch.ssh")

_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


@dataclasses.dataclass(frozen=True)
class LocalFile:
    path: Path
    remote: str  # absolute remote path
    size: int
    mode: int
    mtime: float
    sha256: str


@dataclasses.dataclass
class SyncStats:
    """What one host's sync did."""

    uploaded: int = 0
    unchanged: int = 0
    bytes: int = 0
    seconds: float = 0.0


def local_files(workspace: Workspace, remote_root: str) -> tuple[list[LocalFile], list[str]]:
    """The files to mirror, and the remote directories they need."""
    files: list[LocalFile] = []
    dirs: list[str] = []
    for (src, _), dst_root in zip(workspace, workspace.remote_dirs(remote_root)):
        dirs.append(dst_root)
        for here, subdirs, names in os.walk(src):
            subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
            rel = os.path.relpath(here, src)
            rdir = dst_root if rel == "." else posixpath.join(dst_root, *Path(rel).parts)
            if rel != ".":
                dirs.append(rdir)
            for name in sorted(names):
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                p = Path(here, name)
                try:
                    st = p.stat()
                except OSError:  # a dangling symlink
                    logger.warning("sync_workspace: skipping %s (cannot stat it)", p)
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                files.append(LocalFile(p, posixpath.join(rdir, name), st.st_size, stat.S_IMODE(st.st_mode),
                                       st.st_mtime, _sha256(p)))
    return files, dirs


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def remote_hashes(conn: Connection, python: str, files: list[LocalFile], timeout: float, what: str) -> dict[str, str | None]:
    """SHA-256 of the remote copies that have the local size (None: missing or another size)."""
    if not files:
        return {}
    try:
        ch = conn.exec(_bootstrap.remote_command(python, _bootstrap.HASHES), timeout)
        ch.settimeout(timeout)
        ch.sendall((json.dumps({"files": [[f.remote, f.size] for f in files]}) + "\n").encode())
        ch.shutdown_write()
        out = bytearray()
        while True:
            chunk = ch.recv(1 << 20)
            if not chunk:
                break
            out += chunk
        err = b""
        while ch.recv_stderr_ready():
            err += ch.recv_stderr(65536)
        ch.close()
    except (OSError, EOFError, paramiko.SSHException) as e:
        raise AllocationError(f"{what}: could not compare the workspace with the host's copy: {type(e).__name__}: {e}") from None
    for line in bytes(out).splitlines():
        if line.startswith(_bootstrap.MARK.encode()):
            return dict(json.loads(line.decode())["hashes"])
    raise AllocationError(f"{what}: the remote Python {python!r} could not hash the workspace files"
                          + (f": {err.decode(errors='replace')[-2000:]}" if err else ""))


def sync_host(conn: Connection, python: str, workspace: Workspace, remote_root: str, timeout: float,
              what: str, token: str) -> SyncStats:
    """Mirror ``workspace`` under ``remote_root`` on one host; only changed files travel."""
    t0 = time.monotonic()
    files, dirs = local_files(workspace, remote_root)
    have = remote_hashes(conn, python, files, timeout, what)
    todo = [f for f in files if have.get(f.remote) != f.sha256]
    stats = SyncStats(unchanged=len(files) - len(todo))
    try:
        sftp = conn.sftp(timeout)
    except (OSError, EOFError, paramiko.SSHException) as e:
        raise AllocationError(f"{what}: the SSH server did not open SFTP (Subsystem sftp in its sshd_config?): {e}") from None
    try:
        made: set[str] = set()
        for d in dirs:
            _makedirs(sftp, d, made, what)
        for f in todo:
            tmp = posixpath.join(posixpath.dirname(f.remote), f".{posixpath.basename(f.remote)}.monarch-{token}")
            try:
                sftp.put(str(f.path), tmp, confirm=True)
                sftp.chmod(tmp, f.mode)
                sftp.utime(tmp, (f.mtime, f.mtime))
                try:
                    sftp.posix_rename(tmp, f.remote)
                except OSError:  # a server without posix-rename@openssh.com
                    _remove(sftp, f.remote)
                    sftp.rename(tmp, f.remote)
            except (OSError, EOFError, paramiko.SSHException) as e:
                _remove(sftp, tmp)
                raise AllocationError(f"{what}: could not write {f.remote} ({f.path}): {_why(e)}") from None
            stats.uploaded += 1
            stats.bytes += f.size
        _drop_stale_bytecode(sftp, [f.remote for f in todo if f.remote.endswith(".py")])
    finally:
        sftp.close()
    stats.seconds = time.monotonic() - t0
    return stats


def _drop_stale_bytecode(sftp: paramiko.SFTPClient, sources: list[str]) -> None:
    """Remove the ``__pycache__`` entries of replaced modules: a ``.pyc``
    records its source's mtime in whole seconds and its size, so a same-size
    edit within the same second would otherwise import the old code."""
    by_dir: dict[str, set[str]] = {}
    for src in sources:
        by_dir.setdefault(posixpath.dirname(src), set()).add(posixpath.basename(src)[:-3])
    for d, stems in by_dir.items():
        cache = posixpath.join(d, "__pycache__")
        try:
            names = sftp.listdir(cache)
        except (OSError, paramiko.SSHException):
            continue
        for name in names:
            if name.endswith(".pyc") and name.split(".", 1)[0] in stems:
                _remove(sftp, posixpath.join(cache, name))


def _makedirs(sftp: paramiko.SFTPClient, d: str, made: set[str], what: str) -> None:
    if d in made or d in ("", "/"):
        return
    try:
        st = sftp.stat(d)
    except FileNotFoundError:
        _makedirs(sftp, posixpath.dirname(d), made, what)
        try:
            sftp.mkdir(d)
        except (OSError, paramiko.SSHException) as e:
            raise AllocationError(f"{what}: could not create the directory {d}: {_why(e)}") from None
    except (OSError, paramiko.SSHException) as e:
        raise AllocationError(f"{what}: could not look at {d}: {_why(e)}") from None
    else:
        if st.st_mode is not None and not stat.S_ISDIR(st.st_mode):
            raise AllocationError(f"{what}: {d} exists and is not a directory")
    made.add(d)


def _remove(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except (OSError, paramiko.SSHException):
        pass


def _why(e: BaseException) -> str:
    if isinstance(e, PermissionError):
        return "permission denied"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
