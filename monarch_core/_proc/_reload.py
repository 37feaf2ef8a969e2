"""Reloading changed modules in running procs (``sync_workspace(auto_reload=True)``).

The client's watcher (``_launch._code_sync.Watcher``) syncs a changed
workspace, then :func:`reload_in` sends each running proc of those hosts one
``Reload`` control message with the host's paths of the changed files; the
proc (:func:`on_reload`, on a thread of its own: a module's top level may
block) reloads, with ``importlib.reload`` and in the order they were first
imported, the modules whose ``__file__`` is one of them, and answers with the
names it reloaded and what it could not.

What a reload can and cannot do (docs/workspace.md says the same):

* module-level names (functions, constants) are the new ones for every
  caller that looks them up through the module (``mod.f()``);
* classes: the module gets new class objects; the functions of the new
  class are also set on the old one, so objects made before the reload
  (actors already spawned included) run the new method bodies.  Their
  state (``self.x``) is what it was: ``__init__`` does not run again, and
  an endpoint added or removed changes nothing for an actor mesh spawned
  before;
* ``from mod import f`` bindings made elsewhere before the reload keep the
  old object; C extensions (``.so``) cannot be reloaded (reported as an
  error); a module not imported yet needs nothing (the next import reads
  the new file), and a new file just becomes importable.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from monarch_core._kernel import _wire as W
from monarch_core._proc import _control as C
from monarch_core._proc import _state
from monarch_core._proc._port import send_to_port

logger = logging.getLogger("monarch.proc")

_EXTENSIONS = (".so", ".pyd", ".dylib")


def modules_of(paths: Iterable[str], modules: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    """``(name, module)`` of the loaded modules whose file is one of ``paths``, in import order."""
    wanted = {os.path.realpath(p) for p in paths}
    out = []
    for name, mod in list((sys.modules if modules is None else modules).items()):
        f = getattr(mod, "__file__", None)
        if isinstance(f, str) and os.path.realpath(f) in wanted:
            out.append((name, mod))
    return out


def reload_paths(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """Reload the modules loaded from ``paths``; ``(reloaded names, errors)``."""
    reloaded: list[str] = []
    errors: list[str] = []
    importlib.invalidate_caches()
    for name, mod in modules_of(paths):
        if str(getattr(mod, "__file__", "")).endswith(_EXTENSIONS):
            errors.append(f"{name}: a C extension ({mod.__file__}) cannot be reloaded; start new procs to load it")
            continue
        old_classes = {k: v for k, v in vars(mod).items() if isinstance(v, type) and v.__module__ == name}
        try:
            new = importlib.reload(mod)
        except BaseException as e:  # noqa: BLE001 - reported to the client
            errors.append(f"{name}: reloading it raised {type(e).__name__}: {e}")
            continue
        for k, old in old_classes.items():
            cls = vars(new).get(k)
            if isinstance(cls, type) and cls is not old:
                _patch_class(old, cls)
        reloaded.append(name)
    return reloaded, errors


def _patch_class(old: type, new: type) -> None:
    """Give ``old`` the functions of ``new`` (objects made before the reload run the new bodies)."""
    for attr, value in vars(new).items():
        if isinstance(value, (types.FunctionType, staticmethod, classmethod, property)):
            try:
                setattr(old, attr, value)
            except (AttributeError, TypeError):
                pass


def on_reload(reply: tuple, paths: Sequence[str]) -> None:
    """A ``Reload`` reached this proc: reload off the kernel's loop, then answer."""

    def run() -> None:
        try:
            out = reload_paths(paths)
        except BaseException as e:  # noqa: BLE001
            out = ([], [f"{type(e).__name__}: {e}"])
        for name in out[0]:
            logger.info("auto_reload: reloaded %s", name)
        send_to_port(reply, -1, W.S_VALUE, [out[0], out[1]])

    threading.Thread(target=run, name="monarch-reload", daemon=True).start()


# ---------------------------------------------------------------- the client's side


class _Answer:
    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.port_id = 0
        self.done = threading.Event()
        self.value: Any = None

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        from monarch_core._proc import _serial

        self.kernel.remove_port(self.port_id)
        try:
            v = _serial.loads(payload, buffers)
        except Exception as e:  # noqa: BLE001
            v = ([], [f"an answer that could not be decoded ({e})"])
        self.value = v if status == W.S_VALUE else ([], [str(v)])
        self.done.set()

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        self.kernel.remove_port(self.port_id)
        self.value = ([], [str(exc)])
        self.done.set()


def reload_in(slots: Sequence[Any], paths_for: Callable[[Any], list[str]],
              timeout: float) -> dict[str, tuple[list[str], list[str]]]:
    """Send ``Reload`` to the running procs of ``slots`` (each with its
    host's paths) and wait for their answers (blocking, at most ``timeout``
    s in all): proc description -> ``(reloaded, errors)``."""
    rt = _state.current()
    kernel = rt.kernel
    waits = []
    for slot in slots:
        paths = paths_for(slot)
        if not paths or slot.proc_id in kernel.dead or not slot.ready.is_set():
            continue
        a = _Answer(kernel)
        port = a.port_id = kernel.add_port(a)
        kernel.send(slot.proc_id, slot.address, W.K_CONTROL, 0,
                    C.encode(C.Reload((rt.proc_id, kernel.address, port), tuple(paths))), b"", [], port)
        waits.append((slot, a))
    deadline = time.monotonic() + timeout
    out = {}
    for slot, a in waits:
        name = slot.describe or slot.proc_id
        if a.done.wait(max(0.0, deadline - time.monotonic())):
            reloaded, errors = a.value
            out[name] = (list(reloaded), list(errors))
        else:
            kernel.remove_port(a.port_id)
            out[name] = ([], [f"no answer within {timeout:.0f}s"])
    return out
