"""The proc specification: everything needed to start one proc, anywhere.

A :class:`ProcSpec` is built by the spawning client (``HostMesh.spawn_procs``,
through a :class:`~._spawn.Launch`) and either started on this host
(:func:`~._spawn.start_proc`) or pickled to the worker loop of a remote host,
which starts it there.  The host that starts it fills in what only it knows
(its pid, the bind spec, the CPU list, whether it is a worker loop) and hands
the same spec to the proc: :meth:`ProcSpec.to_env` encodes it into
``MONARCH_PROC_BOOTSTRAP``, :meth:`ProcSpec.from_env` decodes and checks it in
the proc (``_proc_main``), field by field.  The environment a proc gets is
the *starting* host's, plus the command's overrides, plus the
``monarch_proc_env`` hook results; nothing of the client's environment
travels except ``env`` (the ``BootstrapCommand`` overrides).

(No ``from __future__ import annotations`` here: the proc checks its spec
against the field types, which are then objects, not strings to evaluate.)
"""

import dataclasses
import json
import sys
import types
import typing
from typing import Any, Literal, Union

from monarch_core._launch._bootstrap import BOOTSTRAP_ENV, BootstrapCommand
from monarch_core._launch._devices import ProcDevices

__all__ = ["ProcSpec"]


@dataclasses.dataclass(frozen=True)
class ProcSpec:
    """One proc to start (picklable; sent to worker loops as is)."""

    proc_id: str
    #: The proc mesh's name.
    name: str
    #: Rank in the proc mesh, and the mesh's dimensions.
    rank: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    #: ``"proc <name>{coords}"`` (and the host, when it has a name), for reports.
    describe: str
    #: The ``BootstrapCommand`` to run (on the starting host: with the program that runs).
    command: BootstrapCommand
    #: The command is the default one: the *starting* host's Python runs it
    #: (a worker loop's own interpreter, not the client's path).
    default_program: bool
    #: ``proc_bind`` entry (``cpus``/``cpunodebind``/``membind``) or ``None``.
    bind: dict[str, str] | None
    #: The port the proc's ``hello``/``ready`` go to: ``(proc_id, address, port)``.
    status: tuple[str, str, int]
    #: The proc's owner (its death ends the proc) and the root client: ``(proc_id, address)``.
    parent: tuple[str, str]
    root: tuple[str, str]
    #: The transport's name (``ipc``, ``tcp``, ``tls``...).
    transport: str
    log_level: int | str = "WARNING"
    #: The host's name in its host mesh (``HostHandle.name``): how the proc's output and telemetry name it.
    host_name: str = ""
    #: Where its stdout/stderr go (``monarch_core._proc._output``): ``"direct"`` (inherited),
    #: ``"stream"`` (to the client), ``"file"`` (a per-host log file).
    output: Literal["direct", "stream", "file"] = "direct"
    sys_path: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(p for p in sys.path if p))
    #: Its device index (``_devices.plan``; ``None``: none); the starting host fills in the
    #: ``CUDA_VISIBLE_DEVICES`` it gets (``_devices.assign``), ``None`` again when the command or a hook sets it.
    devices: ProcDevices | None = None
    # -- filled in by the host that starts it (``start_proc``) --
    #: Where the proc's kernel listens (``None``: its transport's default).
    bind_spec: str | None = None
    #: The proc's parent process (this host's spawner, or its fork server): it exits once re-parented.
    parent_pid: int = 0
    #: CPUs the proc pins itself to (``sched_setaffinity``), from ``bind``.
    cpus: str | None = None
    #: ``(proc_id, address, pid)`` of the worker loop that started it (it heartbeats the proc), or ``None``.
    worker_loop: tuple[str, str, int] | None = None

    def argv_for_errors(self) -> list[str]:
        """The command line, as error messages show it."""
        return [self.command.program, *self.command.args]

    def to_env(self) -> str:
        """The ``MONARCH_PROC_BOOTSTRAP`` value that hands this spec to its proc (JSON)."""
        return json.dumps(vars(self), default=vars, separators=(",", ":"))  # (the command: its fields too)

    @classmethod
    def from_env(cls, raw: str) -> "ProcSpec":
        """The spec encoded by :meth:`to_env`, every field checked against its
        type; ``ValueError`` naming the field otherwise."""
        try:
            fields = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{BOOTSTRAP_ENV} is not JSON: {e}") from None
        return _conform(fields, cls, "ProcSpec")


def _conform(value: Any, hint: Any, where: str) -> Any:
    """``value`` (decoded JSON) as type ``hint``: lists become tuples, dicts
    dataclasses; ``ValueError`` naming ``where`` when it does not fit."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"{BOOTSTRAP_ENV}: {where} must be an object, got {value!r}")
        # (ProcSpec's and BootstrapCommand's modules leave annotations as objects: no evaluation)
        hints = {f.name: f.type for f in dataclasses.fields(hint)}
        try:
            return hint(**{k: _conform(v, hints[k], f"{where}.{k}") if k in hints else v for k, v in value.items()})
        except TypeError as e:  # a missing or unknown field, or the dataclass's own check
            raise ValueError(f"{BOOTSTRAP_ENV}: {where}: {e}") from None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        for option in args:
            try:
                return _conform(value, option, where)
            except ValueError:
                pass
    elif origin is Literal:
        if value in args:
            return value
    elif origin is tuple and isinstance(value, list):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_conform(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) == len(value):
            return tuple(_conform(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    elif origin is not None and isinstance(value, dict):  # dict[str, str], Mapping[str, str | None]
        return {_conform(k, args[0], where): _conform(v, args[1], f"{where}[{k!r}]") for k, v in value.items()}
    elif type(value) is hint or (hint is type(None) and value is None):  # str, int, bool, None
        return value
    shown = hint.__name__ if isinstance(hint, type) and origin is None else str(hint).replace("typing.", "")
    raise ValueError(f"{BOOTSTRAP_ENV}: {where} must be {shown}, got {value!r}")
