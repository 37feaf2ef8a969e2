"""``sync_workspace`` over SFTP: copy what changed, nothing else.

For one host: list the local files of every workspace directory (``__pycache__``
and ``*.pyc`` left out), ask the host for the SHA-256 of its copies of the
same size (one exec of a small script, ``_bootstrap.HASHES``), and upload only
files that are missing, of another size or another content -- each to a
temporary name, then renamed over the old one (a proc importing meanwhile sees
the old file or the new one, never half of one), with the local mode and
modification time, and the replaced modules' stale bytecode removed.  Remote
files that no longer exist locally are left alone.

``conda=True`` (:func:`sync_env`): the same for the client's environment
(``monarch_core._workspace.active_environment``), into
``<working dir>/.monarch/env/<name>``, symbolic links kept as links (a
venv's ``bin/python`` points at its base interpreter, which must exist on
the host: checked first, with an error naming it); a bar shows the bytes on
a terminal.
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
from typing import Any

import paramiko

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import Environment, Workspace
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


@dataclasses.dataclass(frozen=True)
class LocalLink:
    remote: str  # absolute remote path of the link
    target: str  # what it points to (a path inside the tree is rewritten to the remote tree)


def local_files(workspace: Workspace, remote_root: str) -> tuple[list[LocalFile], list[str]]:
    """The files to mirror, and the remote directories they need."""
    files, dirs, _links = tree_files(list(zip(workspace.dirs, workspace.remote_dirs(remote_root))))
    return files, dirs


def tree_files(pairs: list[tuple[Path, str]], *, keep_links: bool = False
               ) -> tuple[list[LocalFile], list[str], list[LocalLink]]:
    """The files under each local directory of ``pairs`` (with its remote
    root), the remote directories they need and, with ``keep_links``, the
    symbolic links (else a link is followed: its file is copied)."""
    files: list[LocalFile] = []
    dirs: list[str] = []
    links: list[LocalLink] = []
    for src, dst_root in pairs:
        dirs.append(dst_root)
        top = os.path.realpath(src)
        for here, subdirs, names in os.walk(src):
            rel = os.path.relpath(here, src)
            rdir = dst_root if rel == "." else posixpath.join(dst_root, *Path(rel).parts)
            if keep_links:
                for d in [d for d in subdirs if os.path.islink(os.path.join(here, d))]:
                    subdirs.remove(d)
                    links.append(_link(Path(here, d), posixpath.join(rdir, d), top, dst_root))
            subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
            if rel != ".":
                dirs.append(rdir)
            for name in sorted(names):
                if name.endswith(_SKIP_SUFFIXES):
                    continue
                p = Path(here, name)
                if keep_links and p.is_symlink():
                    links.append(_link(p, posixpath.join(rdir, name), top, dst_root))
                    continue
                try:
                    st = p.stat()
                except OSError:  # a dangling symlink
                    logger.warning("sync_workspace: skipping %s (cannot stat it)", p)
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                files.append(LocalFile(p, posixpath.join(rdir, name), st.st_size, stat.S_IMODE(st.st_mode),
                                       st.st_mtime, _sha256(p)))
    return files, dirs, links


def _link(p: Path, remote: str, top: str, dst_root: str) -> LocalLink:
    target = os.readlink(p)
    if os.path.isabs(target):
        real = os.path.normpath(target)
        if real == top or real.startswith(top + os.sep):  # inside the tree: point at the remote copy
            target = posixpath.join(dst_root, *Path(os.path.relpath(real, top)).parts)
    return LocalLink(remote, target)


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
    files, dirs = local_files(workspace, remote_root)
    return sync_tree(conn, python, files, dirs, [], timeout, what, token)


def sync_env(conn: Connection, python: str, env: Environment, remote_root: str, timeout: float, what: str,
             token: str, progress: Any = None) -> tuple[str, SyncStats]:
    """Mirror the client's environment ``env`` under ``remote_root``
    (``.monarch/env/<name>``); returns the interpreter there and the
    statistics.  ``progress(total_bytes)``: a bar for what travels."""
    dst = env.remote_root(remote_root)
    if env.home:
        _check_home(conn, env, timeout, what)
    files, dirs, links = tree_files([(env.prefix, dst)], keep_links=True)
    stats = sync_tree(conn, python, files, dirs, links, timeout, what, token, progress)
    return posixpath.join(dst, env.python), stats


def _check_home(conn: Connection, env: Environment, timeout: float, what: str) -> None:
    try:
        sftp = conn.sftp(timeout)
    except (OSError, EOFError, paramiko.SSHException) as e:
        raise AllocationError(f"{what}: the SSH server did not open SFTP (Subsystem sftp in its sshd_config?): {e}") from None
    try:
        sftp.stat(env.home)
    except (OSError, paramiko.SSHException):
        raise AllocationError(
            f"{what}: sync_workspace(conda=True) ships the virtual environment {env.prefix}, whose interpreter is "
            f"the base Python in {env.home} (pyvenv.cfg's home), and that directory does not exist there. Install "
            f"the same Python at {env.home} on every host, or ship a conda environment (its interpreter travels "
            "with it)"
        ) from None
    finally:
        sftp.close()


def sync_tree(conn: Connection, python: str, files: list[LocalFile], dirs: list[str], links: list[LocalLink],
              timeout: float, what: str, token: str, progress: Any = None) -> SyncStats:
    """Upload the ``files`` whose remote copy differs, create ``dirs`` and ``links``."""
    t0 = time.monotonic()
    have = remote_hashes(conn, python, files, timeout, what)
    todo = [f for f in files if have.get(f.remote) != f.sha256]
    stats = SyncStats(unchanged=len(files) - len(todo))
    bar = progress(sum(f.size for f in todo)) if progress is not None and todo else None
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
            if bar is not None:
                bar.advance(posixpath.basename(f.remote), f.size, "copied")
        for link in links:
            _symlink(sftp, link, what)
        _drop_stale_bytecode(sftp, [f.remote for f in todo if f.remote.endswith(".py")])
    finally:
        sftp.close()
        if bar is not None:
            bar.close()
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


def _symlink(sftp: paramiko.SFTPClient, link: LocalLink, what: str) -> None:
    try:
        if sftp.readlink(link.remote) == link.target:
            return
    except (OSError, paramiko.SSHException):
        pass
    _remove(sftp, link.remote)
    try:
        sftp.symlink(link.target, link.remote)
    except (OSError, paramiko.SSHException) as e:
        raise AllocationError(f"{what}: could not make the link {link.remote} -> {link.target}: {_why(e)}") from None


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
