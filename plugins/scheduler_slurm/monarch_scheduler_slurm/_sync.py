"""``sync_workspace`` on Slurm: use a filesystem the nodes share, else copy
through job steps.

1. **Shared?**  One step on the nodes (``srun --overlap``, one task per
   node) looks for a marker file this client has just written into each
   workspace directory (and, with ``conda=True``, into the environment's
   prefix).  A node that sees them all shares the client's files: nothing is
   copied, and its procs get the client's own paths (and interpreter).
   Markers, not device and inode numbers: an NFS mount has another device
   number on every machine.  ``MONARCH_SLURM_SYNC_COPY=1`` skips the look and
   always copies.
2. **Copy** (the other nodes): a step hashes the node's copies under
   ``sync_dir`` (node-local, default ``/tmp/monarch-{user}/job{job}/{node}``);
   the files that differ on some node go into one tar, which ``sbcast``
   (Slurm's own broadcast, over its tree of slurmds) puts on every node of the
   job; a step unpacks it (each file written under a temporary name and
   renamed over the old one, symbolic links kept, stale bytecode removed) and
   a last one removes the tar.  Nothing travels when nothing changed.

Every step has a timeout; a node that fails names itself in the error.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import logging
import os
import posixpath
import secrets
import stat
import tarfile
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import Environment, SyncedHost, Workspace

logger = logging.getLogger("monarch.slurm")

MARK = "monarch_slurm_sync"
#: Seconds one sync step may take.
STEP_TIMEOUT = 300.0

_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = (".pyc", ".pyo")

#: How a step's task answers: its JSON, compressed, in numbered short lines
#: ``<MARK> <node> <i> <n> <base64 chunk>`` (srun interleaves the output of
#: several tasks; a long line could be cut by another node's output).
ANSWER = r'''
def answer(obj):
    import base64, json, os, sys, zlib
    node = os.environ.get("SLURMD_NODENAME", "")
    data = base64.b64encode(zlib.compress(json.dumps(obj).encode())).decode()
    n = max(1, (len(data) + 399) // 400)
    sys.stdout.write("".join(f"%(mark)s {node} {i} {n} {data[i * 400:(i + 1) * 400]}\n" for i in range(n)))
    sys.stdout.flush()
''' % {"mark": MARK}

#: Step: which marker files does this node see?  stdin: {"markers": [[path, token], ...]}.
PROBE = r'''
import json, os, sys
req = json.loads(sys.stdin.readline())
seen = []
for path, token in req["markers"]:
    try:
        with open(path) as f:
            seen.append(f.read() == token)
    except OSError:
        seen.append(False)
answer({"%(mark)s": "probe", "node": os.environ.get("SLURMD_NODENAME", ""), "seen": seen})
''' % {"mark": MARK}

#: Step: SHA-256 of this node's copies.  stdin: {"nodes": {node: [[path, size], ...]}}.
HASHES = r'''
import hashlib, json, os, sys
node = os.environ.get("SLURMD_NODENAME", "")
req = json.loads(sys.stdin.readline())
res = {}
for path, size in req["nodes"].get(node, []):
    try:
        if size is None:
            res[path] = "link:" + os.readlink(path)
            continue
        if os.path.islink(path) or os.path.getsize(path) != size:
            res[path] = None
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        res[path] = h.hexdigest()
    except OSError:
        res[path] = None
home = req.get("home")
answer({"%(mark)s": "hashes", "node": node, "hashes": res, "home": home is None or os.path.isdir(home)})
''' % {"mark": MARK}

#: Step: unpack the broadcast tar.  stdin: {"tar": path, "token": t, "nodes": {node: {member: dest}}, "dirs": {node: [...]}}.
UNPACK = r'''
import json, os, shutil, sys, tarfile
node = os.environ.get("SLURMD_NODENAME", "")
req = json.loads(sys.stdin.readline())
dests = req["nodes"].get(node, {})
for d in req["dirs"].get(node, []):
    os.makedirs(d, exist_ok=True)
done = 0
with tarfile.open(req["tar"]) as tar:
    for m in tar:
        dest = dests.get(m.name)
        if dest is None:
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = os.path.join(os.path.dirname(dest), "." + os.path.basename(dest) + ".monarch-" + req["token"])
        if m.issym():
            os.symlink(m.linkname, tmp)
        else:
            with tar.extractfile(m) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(tmp, m.mode)
            os.utime(tmp, (m.mtime, m.mtime))
        if os.path.isdir(dest) and not os.path.islink(dest):
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        if dest.endswith(".py"):
            cache = os.path.join(os.path.dirname(dest), "__pycache__")
            stem = os.path.basename(dest)[:-3]
            try:
                for name in os.listdir(cache):
                    if name.endswith(".pyc") and name.split(".", 1)[0] == stem:
                        os.remove(os.path.join(cache, name))
            except OSError:
                pass
        done += 1
answer({"%(mark)s": "unpacked", "node": node, "files": done})
''' % {"mark": MARK}


def answers(stdout: str) -> dict[str, Any]:
    """Each node's answer, from the numbered lines of :data:`ANSWER` (other lines are ignored)."""
    parts: dict[str, dict[int, str]] = {}
    counts: dict[str, int] = {}
    for line in stdout.splitlines():
        words = line.split()
        if MARK in words:
            words = words[words.index(MARK):]
        if len(words) != 5 or words[0] != MARK or not words[2].isdigit() or not words[3].isdigit():
            continue
        parts.setdefault(words[1], {})[int(words[2])] = words[4]
        counts[words[1]] = int(words[3])
    out: dict[str, Any] = {}
    for node, chunks in parts.items():
        if len(chunks) == counts[node]:
            try:
                out[node] = json.loads(zlib.decompress(base64.b64decode("".join(chunks[i] for i in range(counts[node])))))
            except (ValueError, KeyError, zlib.error):
                continue
    return out


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree(src: Path, *, keep_links: bool) -> list[tuple[str, Path, int | None]]:
    """``(relative POSIX path, local path, size or None for a link)`` of the
    files under ``src`` (bytecode and ``__pycache__`` left out)."""
    out: list[tuple[str, Path, int | None]] = []
    for here, subdirs, names in os.walk(src):
        rel_dir = os.path.relpath(here, src)
        parts = () if rel_dir == "." else Path(rel_dir).parts
        if keep_links:
            for d in [d for d in subdirs if os.path.islink(os.path.join(here, d))]:
                subdirs.remove(d)
                out.append((posixpath.join(*parts, d), Path(here, d), None))
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            if name.endswith(_SKIP_SUFFIXES):
                continue
            p = Path(here, name)
            if keep_links and p.is_symlink():
                out.append((posixpath.join(*parts, name), p, None))
                continue
            try:
                st = p.stat()
            except OSError:
                logger.warning("sync_workspace: skipping %s (cannot stat it)", p)
                continue
            if stat.S_ISREG(st.st_mode):
                out.append((posixpath.join(*parts, name), p, st.st_size))
    return out


def node_root(sync_dir: str, job_id: str, node: str) -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return posixpath.normpath(sync_dir.replace("{job}", job_id).replace("{node}", node).replace("{user}", user))


class SlurmSync:
    """One ``sync_workspace`` call on the nodes of one job (see the module docstring)."""

    def __init__(self, api: Any, job_id: str, python: str, sync_dir: str, *, force_copy: bool,
                 srun_args: Sequence[str] = (), progress: Any = None) -> None:
        self.api, self.job_id, self.python, self.sync_dir = api, job_id, python, sync_dir
        self.force_copy = force_copy
        #: ``progress(desc)``: a bar with ``show(status)`` and ``close()`` (on a terminal only), or None
        self.progress = progress
        self.srun_args = tuple(srun_args)
        self.token = secrets.token_hex(8)

    # ------------------------------------------------------------ steps

    def _step(self, nodes: Sequence[str], code: str, request: dict, kind: str) -> dict[str, dict]:
        """Run ``code`` once per node, ``request`` on its stdin; each node's answer line."""
        res = self.api.run_step(self.job_id, nodes, [self.python, "-c", ANSWER + code],
                                input=json.dumps(request) + "\n", timeout=STEP_TIMEOUT, extra=self.srun_args)
        out: dict[str, dict] = {}
        for node, obj in answers(res.stdout).items():
            if isinstance(obj, dict) and obj.get(MARK) == kind:
                out[node] = obj
        missing = [n for n in nodes if n not in out]
        if missing:
            said = (res.stderr.strip() or res.stdout.strip() or "(no output)")[-2000:]
            raise AllocationError(f"Slurm job {self.job_id}: the sync_workspace step ({kind}) did not answer on node(s) "
                                  f"{missing} (python {self.python!r}): {said}")
        return out

    def shared_nodes(self, nodes: Sequence[str], dirs: Sequence[Path]) -> set[str]:
        """The nodes that see the client's ``dirs`` themselves (markers)."""
        if self.force_copy or not nodes:
            return set()
        markers: list[tuple[str, str]] = []
        written: list[Path] = []
        try:
            for d in dirs:
                p = Path(d).resolve() / f".monarch-shared-{self.token}"
                try:
                    p.write_text(self.token)
                except OSError:
                    return set()  # cannot mark it: copy
                written.append(p)
                markers.append((str(p), self.token))
            answers = self._step(nodes, PROBE, {"markers": markers}, "probe")
        finally:
            for p in written:
                try:
                    p.unlink()
                except OSError:
                    pass
        return {n for n, a in answers.items() if a.get("seen") and all(a["seen"])}

    # ------------------------------------------------------------ the copy

    def copy(self, nodes: Sequence[str], trees: list[tuple[Path, dict[str, str], bool]],
             env: Environment | None = None) -> dict[str, int]:
        """Mirror each local tree ``(src, {node: remote root}, keep_links)``
        on ``nodes``; returns the files written per node.  ``env``: a venv
        among the trees, whose base interpreter must be on every node."""
        if not nodes:
            return {}
        entries: list[tuple[int, str, Path, int | None]] = []
        for i, (src, _roots, keep_links) in enumerate(trees):
            entries += [(i, rel, p, size) for rel, p, size in tree(src, keep_links=keep_links)]
        want: dict[tuple[int, str], str] = {}
        for i, rel, p, size in entries:
            want[(i, rel)] = "link:" + os.readlink(p) if size is None else _sha256(p)

        def dest(i: int, rel: str, node: str) -> str:
            return posixpath.join(trees[i][1][node], rel) if rel else trees[i][1][node]

        listing = {n: [[dest(i, rel, n), size] for i, rel, _p, size in entries] for n in nodes}
        home = env.home if env is not None else None
        have = self._step(nodes, HASHES, {"nodes": listing, "home": home}, "hashes") if entries else {}
        lacking = sorted(n for n, a in have.items() if not a.get("home", True))
        if lacking:
            assert env is not None  # (a node lacks ``home`` only when a venv's was asked for)
            raise AllocationError(
                f"Slurm job {self.job_id}: sync_workspace(conda=True) ships the virtual environment {env.prefix}, whose "
                f"interpreter is the base Python in {home} (pyvenv.cfg's home), and node(s) {lacking} have no such "
                f"directory. Install the same Python at {home} on every node, or ship a conda environment (its "
                "interpreter travels with it)"
            )
        todo: dict[str, dict[str, str]] = {}
        needed: set[tuple[int, str]] = set()
        for n in nodes:
            hashes = have.get(n, {}).get("hashes", {})
            for i, rel, _p, _size in entries:
                d = dest(i, rel, n)
                if hashes.get(d) != want[(i, rel)]:
                    todo.setdefault(n, {})[f"{i}/{rel}"] = d
                    needed.add((i, rel))
        dirs = {n: sorted({r[n] for _s, r, _k in trees}) for n in nodes}
        if not needed:
            return {n: 0 for n in nodes}
        bar = self.progress(f"Slurm job {self.job_id} sync_workspace") if self.progress is not None else None
        try:
            return self._send(nodes, entries, needed, todo, dirs, bar)
        finally:
            if bar is not None:
                bar.close()

    def _send(self, nodes: Sequence[str], entries: list, needed: set, todo: dict, dirs: dict, bar: Any) -> dict[str, int]:
        with tempfile.TemporaryDirectory(prefix="monarch-sync-") as tmp:
            local_tar = os.path.join(tmp, "workspace.tar")
            with tarfile.open(local_tar, "w") as tar:
                for i, rel, p, _size in entries:
                    if (i, rel) in needed:
                        tar.add(str(p), arcname=f"{i}/{rel}", recursive=False)
            remote_tar = f"/tmp/.monarch-sync-{self.token}.tar"
            if bar is not None:
                bar.show(f"sbcast {len(needed)} files, {os.path.getsize(local_tar) / 1e6:.1f} MB")
            self.api.broadcast(self.job_id, local_tar, remote_tar, timeout=STEP_TIMEOUT)
            if bar is not None:
                bar.show(f"unpacking on {len(todo)} node(s)")
            try:
                done = self._step(list(todo), UNPACK, {"tar": remote_tar, "token": self.token, "nodes": todo,
                                                       "dirs": dirs}, "unpacked")
            finally:
                try:
                    self.api.run_step(self.job_id, nodes, ["rm", "-f", remote_tar], timeout=60, extra=self.srun_args)
                except AllocationError as e:
                    logger.warning("sync_workspace: could not remove %s from the nodes: %s", remote_tar, e)
        return {n: int(done.get(n, {}).get("files", 0)) for n in nodes}

    # ------------------------------------------------------------ one call

    def sync(self, workspace: Workspace, nodes: Sequence[str], env: Environment | None) -> dict[str, SyncedHost]:
        t0 = time.monotonic()
        local_dirs = [p.resolve() for p in workspace.dirs]
        probe = local_dirs + ([env.prefix.resolve()] if env is not None else [])
        shared = self.shared_nodes(nodes, probe) if probe else set(nodes)
        out: dict[str, SyncedHost] = {}
        for n in nodes:
            if n in shared:
                out[n] = SyncedHost(paths=tuple(str(p) for p in local_dirs),
                                    python=str(env.prefix / env.python) if env is not None else None, local=True)
        copy = [n for n in nodes if n not in shared]
        if copy:
            roots = {n: node_root(self.sync_dir, self.job_id, n) for n in copy}
            trees: list[tuple[Path, dict[str, str], bool]] = []
            for (src, _name), i in zip(workspace, range(len(workspace))):
                trees.append((src, {n: workspace.remote_dirs(roots[n])[i] for n in copy}, False))
            if env is not None:
                trees.append((env.prefix, {n: env.remote_root(roots[n]) for n in copy}, True))
            written = self.copy(copy, trees, env)
            for n in copy:
                out[n] = SyncedHost(paths=tuple(workspace.remote_dirs(roots[n])),
                                    python=posixpath.join(env.remote_root(roots[n]), env.python) if env else None)
            logger.info("sync_workspace: Slurm job %s: %s copied to node-local %s (%s files written), %s shared; %.2fs",
                        self.job_id, copy, self.sync_dir, written, sorted(shared), time.monotonic() - t0)
        else:
            logger.info("sync_workspace: Slurm job %s: nodes %s share the workspace: nothing copied", self.job_id,
                        sorted(shared))
        return out
