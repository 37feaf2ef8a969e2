"""This user's running monarch clients on this machine, for ``monarch status``.

Every client process (the one that starts the runtime: a script, a notebook
kernel, ``monarch torchrun``) keeps one small JSON record of itself in a
directory only its user can enter, and ``monarch status`` reads them; no
network, no daemon:

* the directory: ``$XDG_RUNTIME_DIR/monarch`` when ``XDG_RUNTIME_DIR`` names a
  directory, else ``/tmp/monarch-<uid>`` -- not ``$TMPDIR``'s: a second
  terminal, or a Slurm job step with a ``TMPDIR`` of its own, must find the
  same directory (and a program leaves nothing in its ``TMPDIR``); made 0700, and
  used only when it belongs to this user and nobody else can enter it (a
  directory someone else made, or one open to others, is refused: nothing is
  recorded and the reader says why);
* the record: ``<pid>.json`` (0600), written whole (to a temporary file, then
  renamed) after changes -- at once after a quiet spell, else coalesced
  (:data:`WRITE_GAP`: a program spawning thousands of meshes rewrites it a few
  times a second, not once per mesh) -- : the process (``pid``, its start ``started``, its
  command line ``argv``, ``cwd``), its meshes (host meshes: hosts and state;
  proc meshes: procs, how many run, failed or stopped, state, the host mesh
  and the actor meshes spawned on them) and the URLs its services publish
  (the dashboard's: :func:`publish_url`);
* removed when the client shuts down or exits; a record whose process is
  gone (it was killed) is stale: readers ignore and delete it.  A pid the
  system reused is told apart by the process's start time (``/proc``).

Standard library only: the listeners of the runtime's events in
``_launch._client_status`` write, the CLI reads.  Writing never raises: a record that cannot be written
is logged once at DEBUG on ``monarch.status`` and the program goes on.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from monarch_core.errors import MonarchError

__all__ = ["StatusDirError", "Record", "current", "directory", "format_records", "publish_url", "read_all",
           "start", "stop", "withdraw_url"]

logger = logging.getLogger("monarch.status")

#: The record format's version (``version`` in each file).
VERSION = 1
#: Stopped proc and actor meshes kept in a record (the newest), besides the running ones.
KEEP_STOPPED = 8
#: Seconds at least between two writes of a record; changes meanwhile are written
#: together at the end of the gap.  A write that took longer than a tenth of this
#: widens the gap to ten times its duration, so the record costs its process at
#: most ~10 % of a core however many meshes it lists.
WRITE_GAP = 0.2


class StatusDirError(MonarchError, OSError):
    """The status directory is not this user's private directory."""


#: where the directory is without ``XDG_RUNTIME_DIR`` (the same for every process of the user)
_SHARED_TMP = "/tmp"


def directory(create: bool = False) -> Path:
    """This user's status directory (see the module docstring).  ``create``:
    make it (0700) when missing.  :class:`StatusDirError` when it exists but
    is not a directory of this user's that only they can enter."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isdir(base):
        d = Path(base) / "monarch"
    else:
        d = Path(_SHARED_TMP) / f"monarch-{os.getuid()}"
    if create:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        return d
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise StatusDirError(
            f"{d} is not a private directory of this user (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}): "
            f"monarch keeps its status records only in a directory that user {os.getuid()} owns and nobody else can "
            f"enter; remove it (or `chmod 700` it if it is yours) and start the job again"
        )
    return d


def _proc_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(record: dict[str, Any]) -> bool:
    """Whether the process of ``record`` still runs (and is the same process)."""
    try:
        pid = int(record["pid"])
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process now holds the pid: not ours, but it runs
    except (KeyError, TypeError, ValueError):
        return False
    want = record.get("pid_start")
    return want is None or _proc_start(pid) in (None, want)


class Record:
    """The record of this process: what :func:`start` made.  Thread-safe; a
    change rewrites the file at once, or within :data:`WRITE_GAP` seconds
    when it was written less than that ago (see :meth:`_write`)."""

    def __init__(self, path: Path, proc_id: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._failed = False
        self._written = 0.0  # when the file was last written (monotonic)
        self._gap = WRITE_GAP  # seconds until the next write may happen (widened by a slow write)
        self._timer: Optional[threading.Timer] = None  # the coalesced write, when one is due
        self.data: dict[str, Any] = {
            "version": VERSION, "pid": os.getpid(), "pid_start": _proc_start(os.getpid()), "started": time.time(),
            "argv": list(sys.argv), "cwd": os.getcwd(), "proc_id": proc_id, "host_meshes": {}, "proc_meshes": {},
            "actor_meshes": {}, "urls": {}, "stopped_meshes": 0,
        }
        self._procs: dict[str, str] = {}  # proc id -> its proc mesh

    # ----------------------------------------------------------- changes
    def host_mesh(self, name: str, state: str, hosts: Optional[int] = None, scheduler: Optional[str] = None) -> None:
        with self._lock:
            m = self.data["host_meshes"].setdefault(name, {"hosts": 0, "scheduler": "", "state": state})
            m["state"] = state
            if hosts is not None:
                m["hosts"] = hosts
            if scheduler is not None:
                m["scheduler"] = scheduler
            self._write()

    def proc_mesh_spawned(self, name: str, proc_ids: list[str], host_mesh: str, extent: dict[str, int]) -> None:
        with self._lock:
            self.data["proc_meshes"][name] = {"procs": len(proc_ids), "running": 0, "failed": 0, "stopped": 0,
                                              "extent": extent, "host_mesh": host_mesh, "state": "starting"}
            for p in proc_ids:
                self._procs[p] = name
            self._write()

    def proc_ready(self, proc_id: str) -> None:
        with self._lock:
            m = self._mesh_of(proc_id)
            if m is None:
                return
            m["running"] += 1
            if m["state"] == "starting" and m["running"] + m["failed"] >= m["procs"]:
                m["state"] = "running" if not m["failed"] else "degraded"
            self._write()

    def proc_ended(self, proc_id: str, stopped: bool) -> None:
        with self._lock:
            m = self._mesh_of(proc_id)
            self._procs.pop(proc_id, None)
            if m is None:
                return
            m["running"] = max(0, m["running"] - 1)
            m["stopped" if stopped else "failed"] += 1
            if not stopped and m["state"] in ("starting", "running"):
                m["state"] = "degraded"
            if m["failed"] + m["stopped"] >= m["procs"] and m["state"] not in ("stopping", "stopped"):
                m["state"] = "failed" if m["failed"] else "stopped"
            self._write()

    def proc_mesh_state(self, name: str, state: str) -> None:
        with self._lock:
            m = self.data["proc_meshes"].get(name)
            if m is None:
                return
            m["state"] = state
            if state == "stopped":
                m["running"] = 0
                self._procs = {p: n for p, n in self._procs.items() if n != name}
                for a in self.data["actor_meshes"].values():
                    if a["proc_mesh"] == name and a["state"] != "stopped":
                        a["state"] = "stopped"
            self._write()

    def actor_mesh(self, key: str, state: str, name: Optional[str] = None, class_name: Optional[str] = None,
                   proc_mesh: Optional[str] = None, extent: Optional[dict[str, int]] = None) -> None:
        with self._lock:
            a = self.data["actor_meshes"].get(key)
            if a is None:
                if name is None:
                    return
                a = self.data["actor_meshes"][key] = {"name": name, "class": class_name or "",
                                                      "proc_mesh": proc_mesh or "", "extent": extent or {}}
            a["state"] = state
            self._write()

    def url(self, name: str, url: Optional[str]) -> None:
        with self._lock:
            if url is None:
                self.data["urls"].pop(name, None)
            else:
                self.data["urls"][name] = url
            self._write()

    # ----------------------------------------------------------- file
    def _mesh_of(self, proc_id: str) -> Optional[dict[str, Any]]:
        name = self._procs.get(proc_id)
        return None if name is None else self.data["proc_meshes"].get(name)

    def _trim(self, which: str) -> None:
        """Keep the running meshes of ``which`` and the newest :data:`KEEP_STOPPED` stopped ones."""
        meshes = self.data[which]
        stopped = [k for k, m in meshes.items() if m.get("state") in ("stopped", "failed")]
        for k in stopped[:-KEEP_STOPPED] if len(stopped) > KEEP_STOPPED else ():
            del meshes[k]
            if which != "actor_meshes":
                self.data["stopped_meshes"] += 1

    def _write(self) -> None:
        """Write the record now if the last write is :attr:`_gap` old, else
        once at the end of the gap (one timer for all changes meanwhile).
        Called with the lock held."""
        if self._failed or self._timer is not None:
            return
        wait = self._written + self._gap - time.monotonic()
        if wait <= 0:
            self._write_now()
            return
        self._timer = threading.Timer(wait, self._write_later)
        self._timer.daemon = True
        self._timer.start()

    def _write_later(self) -> None:
        with self._lock:
            self._timer = None
            if not self._failed:
                self._write_now()

    def _write_now(self) -> None:
        t0 = time.monotonic()
        for which in ("host_meshes", "proc_meshes", "actor_meshes"):  # (here: once per write, not per change)
            self._trim(which)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(self.data, f)
            os.replace(tmp, self.path)
            self._written = time.monotonic()
            self._gap = max(WRITE_GAP, 10 * (self._written - t0))
        except OSError as e:
            self._failed = True
            logger.debug("cannot write the status record %s (monarch status will not list this process): %s",
                         self.path, e)

    def remove(self) -> None:
        """Delete the file (only from the process that made it: a forked child's exit leaves it)."""
        if self.data["pid"] != os.getpid():
            return
        with self._lock:
            self._failed = True  # no write after this
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            for p in (self.path, self.path.with_name(f".{self.path.name}.tmp")):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
                except OSError as e:
                    logger.debug("cannot remove the status record %s: %s", p, e)


_current: Optional[Record] = None
_current_lock = threading.Lock()
#: URLs published before the runtime started (kept for the record :func:`start` makes).
_pending_urls: dict[str, str] = {}


def start(proc_id: str) -> Optional[Record]:
    """Make and write this client's record (None when the directory is not
    usable: logged at DEBUG).  Idempotent within a process."""
    global _current
    with _current_lock:
        if _current is not None and _current.data["pid"] == os.getpid():
            return _current
        try:
            d = directory(create=True)
        except OSError as e:
            logger.debug("no status record for this process (monarch status will not list it): %s", e)
            return None
        rec = Record(d / f"{os.getpid()}.json", proc_id)
        rec.data["urls"].update(_pending_urls)
        rec._write()
        _current = rec
        return rec


def current() -> Optional[Record]:
    """This process's record, or None (no client runtime started, or the directory is unusable)."""
    rec = _current
    return rec if rec is not None and rec.data["pid"] == os.getpid() else None


def stop() -> None:
    """Remove this process's record (the client's shutdown, its exit)."""
    global _current
    with _current_lock:
        rec, _current = _current, None
    if rec is not None:
        rec.remove()


def publish_url(name: str, url: str) -> None:
    """List ``url`` as this client's service ``name`` (``"dashboard"``) in ``monarch status``."""
    _pending_urls[name] = url
    rec = current()
    if rec is not None:
        rec.url(name, url)


def withdraw_url(name: str) -> None:
    """The service ``name`` of this client stopped: ``monarch status`` no longer lists its URL."""
    _pending_urls.pop(name, None)
    rec = current()
    if rec is not None:
        rec.url(name, None)


def read_all(clean: bool = True) -> list[dict[str, Any]]:
    """The records of this user's live clients, oldest first.  ``clean``:
    delete stale ones (their process is gone).  Unreadable or foreign files
    are skipped.  :class:`StatusDirError` when the directory is not private."""
    d = directory()
    try:
        files = sorted(d.glob("*.json"))
    except OSError:
        return []
    out = []
    for p in files:
        try:
            data = json.loads(p.read_text())
            if not isinstance(data, dict) or data.get("version") != VERSION:
                continue
        except (OSError, ValueError):
            continue
        if not _alive(data):
            if clean:
                try:
                    p.unlink()
                except OSError:
                    pass
            continue
        out.append(data)
    out.sort(key=lambda r: (r.get("started", 0), r.get("pid", 0)))
    return out


def _age(seconds: float) -> str:
    s = int(max(0, seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _extent(extent: dict[str, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in extent.items()) + "}"


def format_records(records: list[dict[str, Any]], now: Optional[float] = None) -> str:
    """The text ``monarch status`` prints for ``records`` (from :func:`read_all`)."""
    now = time.time() if now is None else now
    lines: list[str] = []
    for r in records:
        argv = " ".join(r.get("argv") or []) or "?"
        lines.append(f"pid {r['pid']}  up {_age(now - float(r.get('started', now)))}  {argv}  (in {r.get('cwd', '?')})")
        for name, url in sorted((r.get("urls") or {}).items()):
            lines.append(f"  {name}: {url}")
        for name, m in (r.get("host_meshes") or {}).items():
            lines.append(f"  host mesh  {name}: {m['hosts']} host(s), scheduler {m['scheduler'] or '?'}, {m['state']}")
        for name, m in (r.get("proc_meshes") or {}).items():
            counts = f"{m['running']} running"
            if m["failed"]:
                counts += f", {m['failed']} failed"
            if m["stopped"] and m["state"] != "stopped":
                counts += f", {m['stopped']} stopped"
            lines.append(f"  proc mesh  {name} {_extent(m['extent'])}: {m['procs']} proc(s) ({counts}), "
                         f"{m['state']}, on {m['host_mesh'] or '?'}")
            for a in (r.get("actor_meshes") or {}).values():
                if a["proc_mesh"] == name:
                    lines.append(f"    actors   {a['name']} ({a['class']}) {_extent(a['extent'])}: {a['state']}")
        if r.get("stopped_meshes"):
            lines.append(f"  (and {r['stopped_meshes']} older stopped mesh(es))")
        if not (r.get("host_meshes") or r.get("proc_meshes")):
            lines.append("  (no mesh yet)")
    return "\n".join(lines)
