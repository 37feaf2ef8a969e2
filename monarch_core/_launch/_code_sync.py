"""``HostMesh.sync_workspace``: the core's part (checks, then the scheduler's
``Allocation.sync_workspace`` on a thread of its own, then what every proc
spawned there afterwards gets, and the ``auto_reload`` watcher).

Which hosts get what: the host mesh (or slice) names its hosts; hosts on this
machine (``this_host()``) need nothing copied; worker loops the client
attached to (``attach_to_workers``) have no scheduler that could copy files,
which is an error saying so; otherwise the allocation's scheduler copies, or
says it cannot (``NotImplementedError`` naming it).

What the scheduler returns per host (:class:`~monarch_core._workspace.SyncedHost`:
the host's directories of the workspace, the interpreter of a shipped
environment) is kept in the host mesh's shared state; ``spawn_procs`` reads
it once per call (:func:`spawn_overrides`), so a spawn costs one dict lookup
per host more, nothing per message.

``auto_reload=True``: a :class:`Watcher` thread (one per host mesh; the next
``sync_workspace`` call replaces it; ``stop()``/``shutdown()`` and the
client's exit end it) looks at the workspace's files every
``MONARCH_AUTO_RELOAD_INTERVAL`` seconds; on a change it syncs again (only
the changed files travel) and sends the running procs of those hosts one
``Reload`` control message naming the changed files, which reloads the
modules loaded from them (``monarch_core._proc._reload``).
"""

from __future__ import annotations

import atexit
import logging
import os
import posixpath
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from monarch_core import settings
from monarch_core._proc._future import Cell
from monarch_core._workspace import SyncedHost, Workspace
from monarch_core.errors import AllocationError, ConfigError, MonarchError

logger = logging.getLogger("monarch.launch")


def check_arguments(workspace: Any, conda: Any, auto_reload: Any) -> None:
    """``TypeError`` for anything but a :class:`Workspace` and two bools."""
    if not isinstance(workspace, Workspace):
        raise TypeError(
            f"sync_workspace(workspace) takes a Workspace, got {type(workspace).__name__}; e.g. "
            "from monarch_core.actor import Workspace; await hosts.sync_workspace(Workspace(dirs=['src/mypkg']))"
        )
    for name, value in (("conda", conda), ("auto_reload", auto_reload)):
        if not isinstance(value, bool):
            raise TypeError(f"sync_workspace({name}=...) must be True or False, got {value!r}")


def start(
    record: Any,
    hosts: Sequence[Any],
    workspace: Workspace,
    conda: bool,
    auto_reload: bool,
    *,
    attached: bool,
    mesh: str,
    shared: dict | None = None,
) -> Cell:
    """Check, then sync on a thread of its own; the returned cell resolves
    to ``None`` or fails with the error (the caller awaits it).

    ``record``: the host mesh's ``AllocationRecord`` (``None`` for
    ``this_host()`` and attached worker loops); ``hosts``: the
    ``HostHandle`` s of the mesh or slice; ``attached``: the mesh has no
    allocation but remote worker loops (``attach_to_workers``, or a
    reference received from another process); ``shared``: the host mesh's
    shared state (``"synced"``: host name -> ``SyncedHost``; ``"watcher"``)."""
    check_arguments(workspace, conda, auto_reload)
    missing = [str(p) for p in workspace.dirs if not p.is_dir()]
    if missing:
        raise FileNotFoundError(
            f"sync_workspace: local workspace director{'ies' if len(missing) > 1 else 'y'} {missing} "
            "do not exist (paths are taken from the current working directory)"
        )
    shared = shared if shared is not None else {}
    cell = Cell()
    remote = [h for h in hosts if getattr(h, "address", None) is not None]
    if record is None:
        if remote and attached:
            raise NotImplementedError(
                f"sync_workspace on host mesh {mesh!r}: its worker loops were not started by a scheduler of this "
                "client (attach_to_workers, or a HostMesh received from another process), so there is no channel "
                "to copy files to their hosts. Copy the code yourself (rsync, a shared filesystem), or allocate the "
                "hosts with hosts_from_config through a scheduler that syncs (scheduler = \"ssh\" or \"slurm\"), "
                "in the process that allocated them"
            )
        # this machine: the procs see its files where they are
        here = local_synced(workspace)
        _remember(shared, {h.name: here for h in hosts})
        watcher = Watcher(None, [h.name for h in hosts], workspace, shared, mesh) if auto_reload else None
        _replace_watcher(shared, watcher)
        cell.set_result(None)
        return cell
    alloc = record.allocation
    from monarch_core.hookspecs import Allocation

    impl = getattr(type(alloc), "sync_workspace", None)
    if impl is None or impl is Allocation.sync_workspace:
        raise NotImplementedError(
            f"sync_workspace on host mesh {mesh!r}: {record.what} cannot copy a workspace to its hosts (its "
            "Allocation has no sync_workspace). Install the code on every host (or use a shared filesystem), or "
            "use a scheduler that syncs: ssh (SFTP), slurm (job steps), local (this machine: nothing to copy)"
        )
    if conda:
        from monarch_core._workspace import active_environment

        active_environment()  # a system interpreter: the error says what to do, before anything travels
    names = [h.name for h in hosts if h.name not in record.lost]
    skipped = [h.name for h in hosts if h.name in record.lost]
    if skipped:
        logger.warning("sync_workspace: skipping lost host(s) %s of %s", skipped, record.what)
    _replace_watcher(shared, None)  # no watcher syncs while this call does

    def run() -> None:
        try:
            sync_once(record, names, workspace, conda, shared, mesh)
            if auto_reload:
                _replace_watcher(shared, Watcher(record, names, workspace, shared, mesh))
            cell.set_result(None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            cell.set_exception(e)

    if names:
        threading.Thread(target=run, name=f"monarch-sync-{mesh}", daemon=True).start()
    else:
        cell.set_result(None)
    return cell


def sync_once(record: Any, names: list[str], workspace: Workspace, conda: bool, shared: dict, mesh: str) -> None:
    """One ``Allocation.sync_workspace`` call (blocking), its errors mapped
    into ours, its per-host result remembered."""
    from monarch_core._launch._alloc import _call

    try:
        out = _call(record.allocation.sync_workspace, workspace, names, conda=conda, auto_reload=False)
    except NotImplementedError as e:
        raise NotImplementedError(f"sync_workspace on host mesh {mesh!r}: {record.what}: {e or 'not supported'}") from None
    except (AllocationError, ConfigError) as e:
        raise e
    except MonarchError as e:
        raise AllocationError(f"{record.what} could not sync the workspace: {e}") from None
    except BaseException as e:  # noqa: BLE001 - named for the caller
        raise AllocationError(f"{record.what} could not sync the workspace: {type(e).__name__}: {e}") from None
    if isinstance(out, Mapping):
        _remember(shared, {h: v for h, v in out.items() if isinstance(v, SyncedHost)})


def local_synced(workspace: Workspace) -> SyncedHost:
    """A host that sees this client's files: the workspace's own directories."""
    return SyncedHost(paths=tuple(str(p.resolve()) for p in workspace.dirs), local=True)


def _remember(shared: dict, synced: Mapping[str, SyncedHost]) -> None:
    table = dict(shared.get("synced") or {})
    for name, host in synced.items():
        old = table.get(name)
        if old is not None and host.python is None and old.python is not None:
            host = SyncedHost(host.paths, old.python, host.local)  # a later sync without conda keeps the env
        table[name] = host
    shared["synced"] = table  # replaced whole: spawn_procs reads it without a lock


# ---------------------------------------------------------------- what spawn_procs gives a proc


def _client_env_prefixes() -> tuple[str, ...]:
    out = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)}
    conda = os.environ.get("CONDA_PREFIX")
    if conda:
        out.add(os.path.realpath(conda))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in out))


_remote_path_cache: tuple[tuple, tuple[str, ...]] = ((), ())


def remote_sys_path() -> tuple[str, ...]:
    """The client's ``sys.path`` as a proc on another host gets it: without
    the entries of the client's own Python installation and environment
    (its standard library, its site-packages), which the host's interpreter
    brings its own of; the rest (the client's code directories) stays.
    Computed again only when ``sys.path`` (or ``CONDA_PREFIX``) changed."""
    global _remote_path_cache
    key = (tuple(sys.path), os.environ.get("CONDA_PREFIX"))
    if _remote_path_cache[0] == key:
        return _remote_path_cache[1]
    prefixes = _client_env_prefixes()
    out = []
    for p in key[0]:
        if not p:
            continue
        real = os.path.realpath(p)
        if not real.startswith(prefixes) and real + os.sep not in prefixes:
            out.append(p)
    _remote_path_cache = (key, tuple(out))
    return _remote_path_cache[1]


def spawn_overrides(shared: dict, host_name: str, base_path: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """``(sys_path, python)`` for the procs spawned on ``host_name`` now:
    the synced directories first, then ``base_path``; the shipped
    environment's interpreter or ``None``."""
    synced = (shared.get("synced") or {}).get(host_name)
    if synced is None:
        return base_path, None
    return tuple(synced.paths) + tuple(p for p in base_path if p not in synced.paths), synced.python


# ---------------------------------------------------------------- auto_reload


_watchers: weakref.WeakSet = weakref.WeakSet()


def _replace_watcher(shared: dict, new: Watcher | None) -> None:
    old = shared.get("watcher")
    shared["watcher"] = new
    if old is not None:
        old.stop()
    if new is not None:
        new.start()


def stop_watcher(shared: dict) -> None:
    """The host mesh stops or shuts down: its watcher ends (joined)."""
    _replace_watcher(shared, None)


@atexit.register
def _stop_all() -> None:
    for w in list(_watchers):
        w.stop()


def snapshot(workspace: Workspace) -> dict[Path, tuple[int, int]]:
    """Every file of the workspace: ``(size, mtime_ns)`` (bytecode and ``__pycache__`` left out)."""
    out: dict[Path, tuple[int, int]] = {}
    for src in workspace.dirs:
        for here, subdirs, names in os.walk(src):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in names:
                if name.endswith((".pyc", ".pyo")):
                    continue
                p = Path(here, name)
                try:
                    st = p.stat()
                except OSError:
                    continue
                out[p] = (st.st_size, st.st_mtime_ns)
    return out


def changed_files(before: Mapping[Path, Any], after: Mapping[Path, Any]) -> list[Path]:
    """Files new or different in ``after`` (removed ones are left alone, as the copy leaves them)."""
    return sorted(p for p, v in after.items() if before.get(p) != v)


def remote_files(workspace: Workspace, synced: SyncedHost, changed: Sequence[Path]) -> list[str]:
    """Where the host holds ``changed`` (local files of ``workspace``)."""
    out = []
    for (src, _), root in zip(workspace, synced.paths):
        for p in changed:
            try:
                rel = p.relative_to(src)
            except ValueError:
                continue
            out.append(posixpath.join(root, *rel.parts))
    return out


class Watcher:
    """Polls a workspace and, on a change, syncs it and reloads the changed
    modules in the running procs of the host mesh's hosts ``names``."""

    def __init__(self, record: Any, names: list[str], workspace: Workspace, shared: dict, mesh: str) -> None:
        self.record, self.names, self.workspace, self.shared, self.mesh = record, names, workspace, shared, mesh
        self.interval: float = settings.get("MONARCH_AUTO_RELOAD_INTERVAL")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"monarch-auto-reload-{mesh}", daemon=True)
        self._seen = snapshot(workspace)

    def start(self) -> None:
        _watchers.add(self)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        _watchers.discard(self)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                now = snapshot(self.workspace)
                changed = changed_files(self._seen, now)
                if not changed:
                    continue
                if self.record is not None:
                    sync_once(self.record, self.names, self.workspace, False, self.shared, self.mesh)
                self._seen = now
                if not self._stop.is_set():
                    self._reload(changed)
            except Exception as e:  # noqa: BLE001 - the next change tries again
                logger.warning("auto_reload of host mesh %r: %s: %s", self.mesh, type(e).__name__, e)

    def _reload(self, changed: list[Path]) -> None:
        from monarch_core._proc import _reload

        synced = self.shared.get("synced") or {}
        per_host = {name: remote_files(self.workspace, synced[name], changed) for name in self.names if name in synced}
        slots = [s for pm in list(self.shared.get("procs") or ()) for s in pm._slots
                 if getattr(s, "host_name", None) in per_host]
        if not slots:
            return
        answers = _reload.reload_in(slots, lambda s: per_host[s.host_name], timeout=60.0)
        for describe, (reloaded, errors) in answers.items():
            if reloaded:
                logger.info("auto_reload: %s reloaded %s", describe, ", ".join(reloaded))
            for e in errors:
                logger.warning("auto_reload: %s: %s", describe, e)
