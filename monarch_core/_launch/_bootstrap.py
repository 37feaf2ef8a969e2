"""How procs are started: ``BootstrapCommand`` and ``default_bootstrap_cmd``.

(No ``from __future__ import annotations``: a proc checks the command in its
``ProcSpec`` against the field types, which are then objects.)
"""

import dataclasses
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

PROC_MODULE = "monarch_core._launch._proc_main"
BOOTSTRAP_ENV = "MONARCH_PROC_BOOTSTRAP"
_BIND_KEYS = ("cpunodebind", "membind", "physcpubind", "cpus")


@dataclasses.dataclass(frozen=True)
class BootstrapCommand:
    """The OS command that starts a proc.

    ``program`` is executed with ``args``; ``arg0`` (if set) is what the
    process sees as ``argv[0]``.  ``env`` holds *overrides* applied on top of
    the spawning process's environment: a value of ``None`` removes that
    variable.  The command must end up running
    ``python -m monarch_core._launch._proc_main`` (directly or through a wrapper
    such as ``numactl`` or a container launcher); the proc finds its identity in
    the ``MONARCH_PROC_BOOTSTRAP`` variable, which monarch sets.

    ``inherit_env`` (default ``True``, as in the reference): whether the proc
    starts from the spawning process's environment.  With ``False`` it gets
    only ``env`` and the ``MONARCH_*`` variables monarch needs there (the
    spawning process's settings and its transport's credentials), so a
    remote host's procs see what the command says and nothing of the
    launching shell.
    """

    program: str
    args: tuple[str, ...] = ("-m", PROC_MODULE)
    env: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    arg0: str | None = None
    inherit_env: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.program, str) or not self.program:
            raise TypeError(f"BootstrapCommand.program must be a non-empty str, got {self.program!r}")
        object.__setattr__(self, "args", tuple(self.args))
        for k, v in dict(self.env).items():
            if not isinstance(k, str) or not (v is None or isinstance(v, str)):
                raise TypeError(
                    f"BootstrapCommand.env maps str to str (or None to remove a variable); got {k!r}: {v!r}"
                )
        object.__setattr__(self, "env", dict(self.env))
        if not isinstance(self.inherit_env, bool):
            raise TypeError(f"BootstrapCommand.inherit_env must be True or False, got {self.inherit_env!r}")

    def with_env(self, env: Mapping[str, str | None] | None = None, /, **kwargs: str | None) -> "BootstrapCommand":
        """A copy with more environment overrides (``None`` removes a variable)."""
        return dataclasses.replace(self, env={**self.env, **(env or {}), **kwargs})

    def with_args(self, *args: str) -> "BootstrapCommand":
        return dataclasses.replace(self, args=tuple(args))

    def argv(self) -> list[str]:
        return [self.arg0 or self.program, *self.args]

    def build_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment; with ``inherit_env=False``
        only its ``MONARCH_*`` variables) with the overrides applied."""
        env = dict(os.environ if base is None else base)
        if not self.inherit_env:
            env = {k: v for k, v in env.items() if k.startswith("MONARCH_")}
        return apply_overrides(env, self.env)


def apply_overrides(env: dict[str, str], overrides: Mapping[str, Any]) -> dict[str, str]:
    """``env`` with ``overrides`` applied in place: a value of ``None`` removes
    the variable, any other is set as text."""
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def default_bootstrap_cmd(python_executable: str | None = None) -> BootstrapCommand:
    """The default command: this process's Python (or ``python_executable``)
    running the monarch proc module, inheriting this process's environment."""
    return BootstrapCommand(program=python_executable or sys.executable)


def validate_proc_bind(proc_bind: Any, nprocs: int) -> list[dict[str, str]] | None:
    """Check ``proc_bind`` (one dict per proc) and return it normalised."""
    if proc_bind is None:
        return None
    if not isinstance(proc_bind, (list, tuple)):
        raise TypeError(f"proc_bind must be a list of dicts (one per proc), got {type(proc_bind).__name__}")
    if len(proc_bind) != nprocs:
        raise ValueError(
            f"proc_bind has {len(proc_bind)} entries but {nprocs} procs are being spawned per host (proc_bind "
            f"length ({len(proc_bind)}) must equal procs_per_host ({nprocs})); give exactly one dict per proc "
            "(math.prod(per_host.values()))"
        )
    out = []
    for i, d in enumerate(proc_bind):
        if not isinstance(d, Mapping):
            raise TypeError(f"proc_bind[{i}] must be a dict, got {type(d).__name__}")
        bad = [k for k in d if k not in _BIND_KEYS]
        if bad:
            raise ValueError(f"proc_bind[{i}] has unknown keys {bad}; known keys: {list(_BIND_KEYS)}")
        out.append({k: str(v) for k, v in d.items()})
        if ("cpunodebind" in d or "membind" in d) and shutil.which("numactl") is None:
            raise RuntimeError(
                f"proc_bind[{i}] uses {'cpunodebind' if 'cpunodebind' in d else 'membind'}, which needs "
                "numactl; install it (apt-get install numactl) or bind with 'cpus' instead"
            )
    return out


def parse_cpu_list(spec: str) -> set[int]:
    """``"0-3,6"`` → ``{0, 1, 2, 3, 6}``."""
    cpus: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if part:
            first, dash, last = part.partition("-")  # "N" or "N-M"
            cpus.update(range(int(first), int(last if dash else first) + 1))
    return cpus


def apply_bind(cmd_argv: list[str], bind: Mapping[str, str] | None) -> tuple[list[str], str | None]:
    """Prefix ``numactl`` for node/memory binding; return the CPU list for
    ``sched_setaffinity`` (done by the proc itself) separately."""
    if not bind:
        return cmd_argv, None
    numa = [f"--{k}={bind[k]}" for k in ("cpunodebind", "membind") if k in bind]
    prefix = [shutil.which("numactl") or "numactl", *numa] if numa else []
    return prefix + cmd_argv, bind.get("cpus") or bind.get("physcpubind")
