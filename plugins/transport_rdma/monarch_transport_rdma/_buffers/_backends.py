"""The backends: resolved once per process, connected once per owner proc.

:func:`load` calls the ``monarch_rdma_backends`` hook once and keeps the
backends whose ``unavailable()`` is ``None``, highest ``preference`` first.
:func:`route` picks the data path of one buffer for this holder: the first
backend (in that order, or the one ``MONARCH_RDMA_BACKEND`` forces) that
registered the buffer in its owner and connects to the owner proc.  Each
(owner proc, backend) is connected at most once; the outcome, a connection or
the reason there is none, is cached, so a transfer costs a dict lookup and no
pluggy call.  A buffer of this very process is copied in place (``local``)
unless a backend is forced.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import warnings
from typing import TYPE_CHECKING, Any, Mapping

from monarch_transport_rdma import _settings
from monarch_transport_rdma._buffers import _proto
from monarch_core.errors import ConfigError, RDMAError, SupervisionError

if TYPE_CHECKING:  # the contract's types are loaded with the backends, not when monarch_core.rdma is imported
    from monarch_core.hookspecs import MemoryRegion, RDMABackend, RDMAConnection, RemoteRegion

logger = logging.getLogger("monarch.rdma")

__all__ = ["RDMATcpFallbackWarning", "load", "route", "best_name", "forced", "is_available"]

#: The project's backend names and the distribution that provides each.
KNOWN = {"ibverbs": "monarch-transport-rdma", "process_vm": "monarch-transport-rdma", "channel": "monarch-transport-rdma"}


class RDMATcpFallbackWarning(Warning):
    """Transfers of an ``RDMABuffer`` go through the ``channel`` fallback (the
    proc's ordinary session), not RDMA or a same-host copy.  Issued once per
    process.  (Named as in the reference, whose fallback is TCP.)"""


class _Loaded:
    def __init__(self) -> None:
        self.backends: list[RDMABackend] = []  # available, preferred first
        self.by_name: dict[str, RDMABackend] = {}
        self.unavailable: dict[str, str] = {}  # name -> why not, in this process
        self.known: list[str] = []  # every name a plugin declared


_loaded: _Loaded | None = None
_load_lock = threading.Lock()


def load() -> _Loaded:
    """The backends of this process (the hook is called once)."""
    global _loaded
    got = _loaded
    if got is not None:
        return got
    with _load_lock:
        if _loaded is not None:
            return _loaded
        from monarch_core import runtime

        out = _Loaded()
        specs: dict[str, Any] = {}
        for spec in runtime.rdma_backend_specs():
            if spec.name in specs:
                logger.warning("RDMA backend %r is provided twice; keeping the first", spec.name)
                continue
            specs[spec.name] = spec
        for spec in sorted(specs.values(), key=lambda s: -s.preference):
            out.known.append(spec.name)
            try:
                backend = spec.load()
                why = backend.unavailable()
            except Exception as e:  # noqa: BLE001 - a broken backend must not break the others
                why = f"it failed to load: {type(e).__name__}: {e}"
                backend = None
            if why is not None or backend is None:
                out.unavailable[spec.name] = str(why)
                logger.debug("RDMA backend %s is not available in this process: %s", spec.name, why)
                continue
            backend.name = spec.name
            out.backends.append(backend)
            out.by_name[spec.name] = backend
        _loaded = out
        return out


def forced() -> str | None:
    """The backend ``MONARCH_RDMA_BACKEND`` names (``None``: ``auto``)."""
    raw = str(_settings.get("MONARCH_RDMA_BACKEND")).strip()
    if raw in ("", "auto"):
        return None
    known = load().known
    if raw not in known:
        hint = ""
        if raw in KNOWN:
            hint = f" {raw!r} is provided by {KNOWN[raw]}, which is not installed here (pip install ./plugins/transport_rdma in a monarch-core checkout)."
        raise ConfigError(
            f"MONARCH_RDMA_BACKEND={raw!r} names no installed RDMA backend; known: auto, {', '.join(known)}.{hint}"
        )
    return raw


def is_available(name: str) -> bool:
    return name in load().by_name


def unavailable_reason(name: str) -> str | None:
    got = load()
    if name in got.by_name:
        return None
    return got.unavailable.get(name, "no installed plugin provides it")


def best_name() -> str:
    """The forced backend, or the most preferred one available in this process."""
    f = forced()
    if f is not None:
        return f
    got = load()
    return got.backends[0].name if got.backends else "none"


# ---------------------------------------------------------------- owner side


def announces() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in load().backends:
        try:
            out[b.name] = dict(b.announce())
        except Exception as e:  # noqa: BLE001
            logger.warning("RDMA backend %s: announce() failed, holders will not use it: %s", b.name, e)
    return out


def register_all(region: MemoryRegion, what: str) -> dict[str, Any]:
    """Offer ``region`` to every available backend but the channel (which the
    core's service is): ``{backend: descriptor}`` of those that took it."""
    out: dict[str, Any] = {}
    for b in load().backends:
        if b.name == "channel":
            continue
        try:
            d = b.register(region)
        except Exception as e:  # noqa: BLE001 - the other backends still serve it
            logger.warning("RDMA backend %s could not register %s (the other backends serve it): %s", b.name, what, e)
            continue
        if d is not None:
            out[b.name] = dict(d)
    return out


def deregister_all(region: MemoryRegion, descriptors: Mapping[str, Any]) -> None:
    got = load()
    for name, d in descriptors.items():
        b = got.by_name.get(name)
        if b is None or name == "channel":
            continue
        try:
            b.deregister(region, d)
        except Exception as e:  # noqa: BLE001
            logger.warning("RDMA backend %s: deregister failed: %s", name, e)


def accept(name: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
    b = load().by_name.get(name)
    if b is None:
        raise RDMAError(f"backend {name!r} is not available in this proc: {unavailable_reason(name)}")
    return b.accept(request)


# ---------------------------------------------------------------- holder side


def _local_connection() -> RDMAConnection:
    """The owner is this process: copy in place."""
    global _LOCAL
    if _LOCAL is None:
        from monarch_core.hookspecs import RDMAConnection

        class _Local(RDMAConnection):
            def read(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
                ctypes.memmove(local.addr, remote.addr + offset, local.nbytes)

            def write(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
                ctypes.memmove(remote.addr + offset, local.addr, local.nbytes)

        _LOCAL = _Local()
    return _LOCAL


_LOCAL: RDMAConnection | None = None
#: (owner proc id, backend) -> connection, or the reason there is none.
_paths: dict[tuple[str, str], RDMAConnection | str] = {}
_path_locks: dict[tuple[str, str], threading.Lock] = {}
_paths_lock = threading.Lock()
_warned = False


def _path(info: tuple, backend: RDMABackend) -> RDMAConnection | str:
    from monarch_core.hookspecs import RDMAPeer

    _watch_deaths()
    proc_id = info[0]
    k = (proc_id, backend.name)
    got = _paths.get(k)
    if got is not None:
        return got
    with _paths_lock:
        lock = _path_locks.setdefault(k, threading.Lock())
    with lock:
        got = _paths.get(k)
        if got is not None:
            return got
        announce = info[5].get(backend.name)
        peer = RDMAPeer(proc_id=proc_id, host=info[3], pid=info[4], announce=announce or {})
        if announce is None:
            got = "not available in the owner's process"
        else:
            why = backend.reachable(peer)
            if why is not None:
                got = why
            else:
                try:
                    got = backend.connect(peer, lambda req: _proto.exchange(info, backend.name, req))
                    logger.debug("rdma.connect %s -> %s", backend.name, proc_id)
                except SupervisionError:
                    raise  # the owner proc is gone: no backend will reach it (nothing cached)
                except RDMAError as e:
                    got = str(e)
                except Exception as e:  # noqa: BLE001 - a backend's bug: fall back, say why
                    got = f"connect failed: {type(e).__name__}: {e}"
        if isinstance(got, str):
            logger.debug("RDMA backend %s does not reach %s: %s", backend.name, proc_id, got)
        _paths[k] = got
        return got


def route(handle: Any) -> tuple[str, RDMAConnection, RemoteRegion]:
    """The backend name, connection and remote region for transfers of ``handle``."""
    info = handle.proc
    name_forced = forced()
    me = _this_proc_id()
    dead = _dead_reason(info[0])
    if dead is not None:
        raise SupervisionError(f"the owner proc of {handle.name()} is gone: {dead}")
    if name_forced is None and info[0] == me:
        local = handle.local_memory()
        if local is not None:
            return "local", _local_connection(), _remote(handle, "local", {}, local.addr)
    got = load()
    reasons: dict[str, str] = {}
    candidates = [got.by_name[name_forced]] if name_forced in got.by_name else [] if name_forced else got.backends
    if name_forced is not None and not candidates:
        raise RDMAError(f"MONARCH_RDMA_BACKEND={name_forced}, but {name_forced} cannot work in this process: "
                        f"{unavailable_reason(name_forced)}; {handle.name()} cannot be transferred")
    for b in candidates:
        d = handle.descriptors.get(b.name)
        if d is None:
            reasons[b.name] = "did not register this buffer in its owner" + (
                f" ({handle.device} memory)" if handle.device != "cpu" else "")
            continue
        p = _path(info, b)
        if isinstance(p, str):
            reasons[b.name] = p
            continue
        if b.name == "channel" and name_forced is None:
            _warn_fallback(handle, {**got.unavailable, **reasons})
        return b.name, p, _remote(handle, b.name, d, handle.addr)
    why = "; ".join(f"{k}: {v}" for k, v in {**(got.unavailable if name_forced is None else {}), **reasons}.items())
    raise RDMAError(f"no RDMA backend reaches {handle.name()} from this proc ({why})")


def _remote(handle: Any, name: str, d: Mapping[str, Any], addr: int) -> RemoteRegion:
    from monarch_core.hookspecs import RemoteRegion

    return RemoteRegion(addr=addr, nbytes=handle.size, device=handle.device, writable=handle.writable,
                        descriptor=d, name=handle.name())


def _warn_fallback(handle: Any, reasons: Mapping[str, str]) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    why = "; ".join(f"{k}: {v}" for k, v in reasons.items() if k != "channel") or "no other backend is installed"
    warnings.warn(
        f"RDMABuffer transfers to {handle.owner} go through the channel fallback (chunked messages over the "
        f"proc's session), not RDMA: {why}. Set MONARCH_RDMA_BACKEND=channel to choose it and silence this "
        "warning; docs/rdma.md says what each backend needs.",
        RDMATcpFallbackWarning,
        stacklevel=_user_stacklevel(),
    )


def _user_stacklevel() -> int:
    """The ``stacklevel`` of the first caller outside monarch_core (for warnings)."""
    import os
    import sys
    import types

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    f: types.FrameType | None = sys._getframe(1)
    level = 1
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(here + os.sep):
        f, level = f.f_back, level + 1
    return level


def _dead_reason(proc_id: str) -> str | None:
    from monarch_core import runtime

    return runtime.proc_death(proc_id)


def _this_proc_id() -> str | None:
    from monarch_core import runtime

    return runtime.local_ref()[0] if runtime.started() else None


_watching = False


def _watch_deaths() -> None:
    """Once per process: forget the connections to a proc when it dies."""
    global _watching
    if _watching:
        return
    _watching = True
    from monarch_core import runtime

    runtime.on_proc_failed(lambda proc_id, reason, stopped: forget_proc(proc_id))


def forget_proc(proc_id: str) -> None:
    """Close and forget the connections to ``proc_id`` (it is gone)."""
    with _paths_lock:
        keys = [k for k in _paths if k[0] == proc_id]
        conns = [_paths.pop(k) for k in keys]
    for c in conns:
        if not isinstance(c, str):
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
