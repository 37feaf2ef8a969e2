"""Per-proc devices: which accelerator each proc that ``spawn_procs`` starts sees.

Contract (docs/configuration.md, "Devices of procs"):

* The spawning client decides each proc's *device index* (:func:`plan`):
  its coordinate along the first per-host dimension named in
  ``MONARCH_DEVICE_DIMS`` (default ``gpus``, then ``gpu``, as the reference's
  tensor-engine workers read it); in a spawn with per-host dimensions but
  none of those names, its position among its host's procs (row-major over
  ``per_host``: ``{"dp": 2, "tp": 2}`` gives 0..3); in a spawn with no
  per-host dimension (one proc per host), none.  ``MONARCH_PROC_DEVICES=0``
  turns the assignment off.
* The host that starts the proc maps the index through *its own*
  environment (:func:`assign`): with ``CUDA_VISIBLE_DEVICES`` set there, the
  proc gets the entry at its index (``"3,5"`` gives ``3`` and ``5``; UUIDs
  stay UUIDs); without it, the index itself.  An index past the host's
  devices (its list's length, else its ``/dev/nvidiaN`` count, when it has
  any) gets ``CUDA_VISIBLE_DEVICES=""`` -- no device, as a CUDA program on a
  host with too few GPUs would find -- and one WARNING on ``monarch.mesh``
  per proc mesh and host, naming the fix.
* A ``CUDA_VISIBLE_DEVICES`` that the proc's ``BootstrapCommand`` or a
  ``monarch_proc_env`` hook sets wins: the proc then has no assignment.
* Inside the proc, :func:`current` (``monarch_core.runtime.proc_devices()``)
  is what it was given (:class:`ProcDevices`), or ``None``.

(No ``from __future__ import annotations``: :class:`ProcDevices` travels in
the ``ProcSpec``, which the proc checks against the field types.)
"""

import dataclasses
import functools
import logging
import math
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Optional

from monarch_core import settings

__all__ = ["CUDA_ENV", "ProcDevices", "apply", "assign", "current", "plan", "set_current"]

logger = logging.getLogger("monarch.mesh")

CUDA_ENV = "CUDA_VISIBLE_DEVICES"


@dataclasses.dataclass(frozen=True)
class ProcDevices:
    """The device assignment of one proc.

    ``dim``: the per-host dimension whose coordinate is the index (``None``:
    the proc's position among its host's procs); ``index``: the device index
    on its host.  Filled in by the host that starts the proc: ``visible``,
    the ``CUDA_VISIBLE_DEVICES`` the proc got (``""``: none, the index is
    past the host's devices), and ``host_visible``, the starting host's own
    ``CUDA_VISIBLE_DEVICES`` (``None``: unset there, every device visible)."""

    dim: Optional[str]
    index: int
    visible: Optional[str] = None
    host_visible: Optional[str] = None


def plan(per_host: Mapping[str, int], local: int) -> Optional[ProcDevices]:
    """The device index of the ``local``-th proc (row-major) of a host in a
    spawn with ``per_host`` dimensions, or ``None`` (no assignment: turned
    off, or no per-host dimension).  Reads the settings (client side)."""
    if not per_host or not settings.get("MONARCH_PROC_DEVICES"):
        return None
    labels = list(per_host)
    for dim in settings.get("MONARCH_DEVICE_DIMS"):
        if dim in per_host:
            below = math.prod(per_host[d] for d in labels[labels.index(dim) + 1:])
            return ProcDevices(dim, (local // below) % per_host[dim])
    return ProcDevices(None, local)


def assign(planned: Optional[ProcDevices], host_env: Mapping[str, str], *, mesh: str, host: str,
           describe: str) -> Optional[ProcDevices]:
    """``planned`` completed on the host that starts the proc, whose
    environment is ``host_env``: the ``CUDA_VISIBLE_DEVICES`` the proc gets
    (see the module docstring).  Logs the WARNING for an index past the
    host's devices (once per ``mesh`` and ``host``)."""
    if planned is None:
        return None
    host_visible = host_env.get(CUDA_ENV)
    if host_visible is not None:
        entries = [e.strip() for e in host_visible.split(",") if e.strip()]
        count, seen = len(entries), f"{CUDA_ENV}={host_visible!r}"
    else:
        entries, count, seen = None, _device_files(), "its /dev/nvidiaN devices"
    if entries is not None and planned.index < len(entries):
        visible = entries[planned.index]
    elif entries is None and (count == 0 or planned.index < count):
        visible = str(planned.index)  # (no NVIDIA device here: the index, harmless, as the reference)
    else:
        visible = ""
        if count > 0:
            _warn_once(mesh, host, describe, planned, count, seen)
    return dataclasses.replace(planned, visible=visible, host_visible=host_visible)


_warned: set = set()
_warned_lock = threading.Lock()


def _warn_once(mesh: str, host: str, describe: str, planned: ProcDevices, count: int, seen: str) -> None:
    with _warned_lock:
        if (mesh, host) in _warned:
            return
        _warned.add((mesh, host))
    if planned.dim:
        where, fix = f"along {planned.dim!r}", f"spawn at most {count} along {planned.dim!r} per host"
    else:
        where, fix = "(its position among its host's procs)", f"spawn at most {count} procs per host"
    logger.warning(
        "%s has device index %d %s, but its host shows %d device(s) (%s): it, and every other proc of %r past "
        "them, gets %s='' (no device). To fix: %s; or share devices through another per-host dimension "
        "(per_host={'gpus': %d, 'share': 2}); or set MONARCH_PROC_DEVICES=0 to give every proc all of its "
        "host's devices",
        describe, planned.index, where, count, seen, mesh, CUDA_ENV, fix, count)


@functools.lru_cache(maxsize=1)
def _device_files() -> int:
    """How many NVIDIA devices this host has (``/dev/nvidiaN``; 0 when none, or no ``/dev``)."""
    try:
        return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


def apply(env: dict, overrides: Sequence[Mapping[str, object]], assigned: Optional[ProcDevices]
          ) -> Optional[ProcDevices]:
    """Set ``assigned.visible`` as ``CUDA_VISIBLE_DEVICES`` in ``env`` (the
    proc's environment) unless one of ``overrides`` (the command's, the
    ``monarch_proc_env`` hooks') names that variable; the assignment the proc
    keeps (``None`` when one does: what the user or plugin set wins)."""
    if assigned is None or any(CUDA_ENV in o for o in overrides):
        return None
    env[CUDA_ENV] = assigned.visible if assigned.visible is not None else ""
    return assigned


_current: Optional[ProcDevices] = None


def set_current(devices: Optional[ProcDevices]) -> None:
    """This proc's assignment (``_proc_main``, at start)."""
    global _current
    _current = devices


def current() -> Optional[ProcDevices]:
    """This proc's assignment, or ``None`` (none, or not a spawned proc)."""
    return _current
