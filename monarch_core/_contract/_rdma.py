"""The data-plane seam of the plugin contract: RDMA backends.

:func:`monarch_rdma_backends` yields :class:`RDMABackendSpec` descriptions
of :class:`RDMABackend` s (one-sided memory transfer paths behind
``monarch_core.rdma.RDMABuffer``); a backend makes one :class:`RDMAConnection`
per peer proc and moves bytes between :class:`MemoryRegion` s and
:class:`RemoteRegion` s.  The section comment below states the rules.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from monarch_core._contract._common import _call_factory, hookspec

__all__ = [
    "MemoryRegion",
    "RDMABackend",
    "RDMABackendSpec",
    "RDMAConnection",
    "RDMAPeer",
    "RemoteRegion",
    "monarch_rdma_api",
    "monarch_rdma_backends",
]


# --------------------------------------------------------------------------
# data plane: one-sided memory transfers (``monarch_core.rdma``)
#
# A *backend* moves bytes between a buffer registered in one proc (its owner)
# and memory in another proc (the holder of an ``RDMABuffer`` handle), ideally
# without the owner's participation.  The core resolves the installed
# backends once per process (the hook below is called once), asks each one
# to register every buffer created in that process (``register``), and, in a
# holder, connects to each owner proc once (``connect``) and caches the
# connections in preference order: a transfer is then a plain method call on
# the first cached connection whose backend registered that buffer.  No
# pluggy call happens per transfer.
#
# Preference order (highest first; ``RDMABackendSpec.preference``):
#
#   ibverbs      100   monarch-transport-rdma: RDMA READ/WRITE over an RC queue pair
#   process_vm    50   monarch-transport-rdma: process_vm_readv/writev, same host only
#   channel        0   built in: chunked requests over the proc's session, served by
#                      the owner's proc (never its actor thread); always reachable
#
# ``MONARCH_RDMA_BACKEND=<name>`` forces one (``auto``, the default, takes
# the order above).  Backends raise only :class:`~monarch_core.errors.RDMAError`
# (or ``SupervisionError`` when the owner proc is gone, ``TimeoutError`` when a
# transfer passes its deadline); map ``OSError`` and library errors yourself.
#
# Everything a backend puts in a handle (``announce``, ``register``) or sends
# through ``exchange`` is plain data: ``marshal``-able values only (None, bool,
# int, float, str, bytes, and tuples/lists/dicts of them).


@dataclasses.dataclass(frozen=True)
class MemoryRegion:
    """Memory an owner registers (:meth:`RDMABackend.register`), or local
    memory a transfer reads into or writes from.

    ``addr`` is the address of the first byte in this process (a device
    pointer when ``device`` is not ``"cpu"``, e.g. ``"cuda:0"``); the core
    keeps the memory alive while it is registered.  ``writable`` is False for
    read-only memory (``bytes``): backends must refuse remote writes to it.
    """

    addr: int
    nbytes: int
    device: str = "cpu"
    writable: bool = True


@dataclasses.dataclass(frozen=True)
class RDMAPeer:
    """An owner proc, as a holder's handle describes it (:meth:`RDMABackend.connect`).

    ``host`` identifies the machine and pid namespace the owner runs in (two
    procs with the same ``host`` can name each other's pids); ``pid`` is its
    process id; ``announce`` is what this backend's :meth:`RDMABackend.announce`
    returned in the owner proc (``{}`` if the backend is not installed there).
    """

    proc_id: str
    host: str
    pid: int
    announce: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RemoteRegion:
    """One registered buffer of an owner proc, as a holder sees it.

    ``descriptor`` is what the backend's :meth:`RDMABackend.register` returned
    for it in the owner (an rkey and address, a pid and a liveness ticket
    ...).  ``name`` describes the buffer for error messages (id, size, owner).
    """

    addr: int
    nbytes: int
    device: str
    writable: bool
    descriptor: Mapping[str, Any]
    name: str = "buffer"


class RDMAConnection(abc.ABC):
    """A holder's data path to one owner proc, made once by
    :meth:`RDMABackend.connect` and cached for the life of the process.

    Called from the core's transfer threads, never from the kernel loop, possibly
    from several threads at once (make it thread-safe).  Blocking is expected.
    ``offset`` is from the start of ``remote``; the core has checked that
    ``offset + nbytes <= remote.nbytes`` and that the local memory holds
    ``nbytes``.  Raise :class:`~monarch_core.errors.RDMAError` naming
    ``remote.name`` on failure (a dropped buffer, a refused access),
    ``SupervisionError`` when the owner proc is gone, ``TimeoutError`` past
    ``deadline`` (a ``time.monotonic()`` value).
    """

    @abc.abstractmethod
    def read(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        """Copy ``local.nbytes`` bytes of ``remote`` from ``offset`` into ``local`` (host memory)."""

    @abc.abstractmethod
    def write(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        """Copy ``local.nbytes`` bytes of ``local`` (host memory) into ``remote`` at ``offset``."""

    def close(self) -> None:
        """Release what the connection holds (queue pairs ...).  Idempotent."""


class RDMABackend(abc.ABC):
    """One way to move a buffer's bytes, resolved once per process.

    Owner side (the proc that creates an ``RDMABuffer``): :meth:`announce`
    once, :meth:`register` per buffer, :meth:`deregister` when it is dropped
    or its owner stops, :meth:`accept` for a holder's :meth:`connect`.
    Holder side: :meth:`reachable` and :meth:`connect` once per owner proc,
    then the connection's ``read``/``write`` per transfer.
    """

    #: Canonical name (``RDMABackendSpec.name``), what ``RDMABuffer.backend`` says.
    name: str = ""
    #: Whether the owner takes no part in a transfer (RDMA, ``process_vm_readv``).
    one_sided: bool = True

    def unavailable(self) -> str | None:
        """``None`` when the backend can work in this process, else why not,
        with the fix (``"pyverbs is not installed: apt install python3-pyverbs"``).
        Called once per process; must be quick and must not raise."""
        return None

    def announce(self) -> Mapping[str, Any]:
        """Plain data about this process that holders need to connect
        (``{"pid": ..., "gid": ...}``); put in every handle.  Called once."""
        return {}

    @abc.abstractmethod
    def register(self, region: MemoryRegion) -> Mapping[str, Any] | None:
        """Make ``region`` reachable through this backend; return the plain
        data holders need to address it (it travels in the handle), or
        ``None`` when this backend cannot serve such memory (device memory,
        say).  Raise ``RDMAError`` on failure (the buffer is then served by
        the other backends)."""

    def deregister(self, region: MemoryRegion, descriptor: Mapping[str, Any]) -> None:
        """Make the region unreachable at once (later transfers must fail).
        The core keeps the memory alive a short grace period after this
        (``MONARCH_RDMA_RELEASE_GRACE``) for transfers already under way."""

    def reachable(self, peer: RDMAPeer) -> str | None:
        """``None`` when this process can try :meth:`connect` to ``peer``,
        else why not (``"pid 123 is on another host"``).  Quick, no I/O."""
        return None

    @abc.abstractmethod
    def connect(self, peer: RDMAPeer, exchange: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> RDMAConnection:
        """Make the data path to ``peer`` (once per owner proc, cached).

        ``exchange(request)`` delivers plain data to this backend's
        :meth:`accept` in the owner proc and returns its answer (a queue
        pair's number and address, say); it raises ``RDMAError`` /
        ``SupervisionError`` / ``TimeoutError``.  Raise ``RDMAError`` saying
        why when the peer cannot be reached this way (``process_vm_readv`` is
        refused by ptrace policy ...): the core then uses the next backend.
        Raise ``SupervisionError`` when the peer's process is gone."""

    def accept(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """Owner side of a holder's ``exchange`` (on the owner proc's RDMA
        service thread, not an actor's).  Default: refuse."""
        from monarch_core.errors import RDMAError

        raise RDMAError(f"the {self.name or type(self).__name__} backend takes no connection requests")


@dataclasses.dataclass(frozen=True)
class RDMABackendSpec:
    """What :func:`monarch_rdma_backends` returns.  ``factory``: a callable or a
    lazily imported ``"module:attr"`` (heavy libraries such as ``pyverbs`` are
    imported by the backend itself, inside ``unavailable``/``register``, not
    here).  ``preference``: higher is tried first (see the section comment)."""

    name: str
    factory: Callable[[], RDMABackend] | str
    preference: int = 10
    description: str = ""

    def load(self) -> RDMABackend:
        """Import (if needed) and call the factory."""
        return _call_factory(self.factory)


@hookspec
def monarch_rdma_backends() -> Sequence[RDMABackendSpec]:
    """Describe the one-sided data paths (RDMA backends) this plugin provides.

    Called once per process, the first time an ``RDMABuffer`` is created or
    used there (or ``get_rdma_backend()`` asks).  Every plugin's results are
    collected; a name given twice goes to the first registration (built-ins,
    then entry points in name order).  The core orders the backends by
    ``preference`` (highest first), drops those whose
    :meth:`RDMABackend.unavailable` gives a reason (logged at DEBUG), and per
    owner proc keeps the first ones that :meth:`RDMABackend.connect`;
    ``MONARCH_RDMA_BACKEND`` forces one by name.

    Complete example -- a backend for buffers of one process only (what the
    core's tests run; a real one reaches other processes)::

        import ctypes, os
        from monarch_core.errors import RDMAError
        from monarch_core.hookspecs import (
            RDMABackend, RDMABackendSpec, RDMAConnection, hookimpl)

        class _Copy(RDMAConnection):
            def read(self, remote, offset, local, deadline):
                ctypes.memmove(local.addr, remote.addr + offset, local.nbytes)
            def write(self, remote, offset, local, deadline):
                if not remote.writable:
                    raise RDMAError(f"{remote.name} is read-only")
                ctypes.memmove(remote.addr + offset, local.addr, local.nbytes)

        class SameProcess(RDMABackend):
            name = "same_process"
            def announce(self):
                return {"pid": os.getpid()}
            def register(self, region):
                return {} if region.device == "cpu" else None
            def reachable(self, peer):
                return None if peer.announce.get("pid") == os.getpid() else "another process"
            def connect(self, peer, exchange):
                return _Copy()

        @hookimpl
        def monarch_rdma_backends():
            return [RDMABackendSpec("same_process", SameProcess, preference=200,
                                    description="memmove within one process")]

    See ``docs/rdma.md`` for what the project's backends need and do.
    """


@hookspec(firstresult=True)
def monarch_rdma_api() -> Any:
    """Provide the implementation of ``monarch_core.rdma``: an object (a
    module) with the attributes ``RDMABuffer``, ``RDMAAction``,
    ``RDMATcpFallbackWarning``, ``get_rdma_backend``, ``is_ibverbs_available``
    and ``is_rdma_available``.  The first plugin that answers provides them
    (``monarch-transport-rdma`` does); with none installed, ``from
    monarch_core.rdma import RDMABuffer`` raises ``ImportError`` naming the
    plugin to install.  Called once per process, when a name is first used."""
