"""Starting proc processes: one spec format, used on this host and by worker loops.

A *proc spec* is a plain dict (picklable, sent to remote worker loops as is)
describing one proc to start: its identity, the ``BootstrapCommand`` fields,
its CPU/NUMA binding, and where to report (``status`` port, ``parent``
spawner, ``root`` client).  :func:`start_proc` turns it into an OS process on
the host that runs it: the environment is that host's, plus the command's
overrides, plus ``monarch_proc_env`` hook results.  A proc that runs the
default command is forked from the spawning process's fork server (see
``_zygote``); any other is exec'd.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from monarch_core._actor._bootstrap import (
    BOOTSTRAP_ENV,
    PROC_MODULE,
    BootstrapCommand,
    apply_bind,
)

logger = logging.getLogger("monarch.proc")


def make_spec(
    *,
    proc_id: str,
    name: str,
    rank: int,
    labels: tuple,
    sizes: tuple,
    describe: str,
    cmd: BootstrapCommand,
    default_program: bool,
    bind: dict | None,
    status: tuple,
    parent: tuple,
    root: tuple,
    transport: str,
    log_level: Any,
) -> dict:
    return {
        "proc_id": proc_id,
        "name": name,
        "rank": rank,
        "labels": list(labels),
        "sizes": list(sizes),
        "describe": describe,
        "program": cmd.program,
        "args": list(cmd.args),
        "env": dict(cmd.env),
        "arg0": cmd.arg0,
        "default_program": default_program,
        "bind": bind,
        "status": list(status),
        "parent": list(parent),
        "root": list(root),
        "transport": transport,
        "sys_path": [p for p in sys.path if p],
        "log_level": log_level,
    }


async def start_proc(kernel: Any, spec: dict, *, bind_spec: str | None) -> Any:
    """Start the OS process for ``spec`` as a child of this process (kernel
    loop).  Raises on failure to start (the caller reports it)."""
    from monarch_core._actor._agent import bootstrap_env_json
    from monarch_core._plugins import registry

    program = sys.executable if spec["default_program"] else spec["program"]
    cmd = BootstrapCommand(program=program, args=tuple(spec["args"]), env=spec["env"], arg0=spec["arg0"])
    env = cmd.build_env()
    hook = registry().pm.hook.monarch_proc_env
    if hook.get_hookimpls():
        coords = dict(zip(spec["labels"], _coords(spec["rank"], spec["sizes"])))
        for overrides in hook(proc_name=spec["name"], rank=spec["rank"], coords=coords):
            for k, v in (overrides or {}).items():
                if v is None:
                    env.pop(k, None)
                else:
                    env[k] = str(v)
    argv, cpus = apply_bind(cmd.argv(), spec["bind"])
    info = {
        "proc_id": spec["proc_id"],
        "name": spec["name"],
        "rank": spec["rank"],
        "labels": spec["labels"],
        "sizes": spec["sizes"],
        "transport": spec["transport"],
        "bind_spec": bind_spec,
        "parent": spec["parent"],
        "root": spec["root"],
        "status": spec["status"],
        "parent_pid": os.getpid(),
        "sys_path": spec["sys_path"],
        "python": program,
        "cpus": cpus,
        "log_level": spec["log_level"],
        "describe": spec["describe"],
        # A worker loop is its procs' parent but not their spawner's address
        # book: they tell it where they listen (for its heartbeats).
        "worker_loop": [kernel.proc_id, kernel.address] if getattr(kernel.agent, "is_host", False) else None,
    }
    zygote = _fork_server(kernel, cmd, argv, env)
    if zygote is not None:
        from monarch_core._actor._zygote import ForkServerUnavailable

        info["parent_pid"] = zygote.pid
        env[BOOTSTRAP_ENV] = bootstrap_env_json(info)
        kernel.expect_proc(spec["proc_id"])
        try:
            child = await zygote.fork(env, os.getcwd())
        except ForkServerUnavailable as e:
            logger.info("starting %s with exec: %s", spec["describe"], e)
        else:
            logger.debug("%s forked from fork server pid %d as pid %d", spec["describe"], zygote.pid, child.pid)
            return await kernel.spawn_process(spec["proc_id"], argv, env, describe=spec["describe"], child=child)
        info["parent_pid"] = os.getpid()
    env[BOOTSTRAP_ENV] = bootstrap_env_json(info)
    executable = cmd.program if cmd.arg0 is not None and argv[0] == cmd.arg0 else None
    return await kernel.spawn_process(spec["proc_id"], argv, env, describe=spec["describe"], executable=executable)


def _fork_server(kernel: Any, cmd: BootstrapCommand, argv: list[str], env: dict[str, str]) -> Any:
    """The zygote to fork this proc from, or ``None`` to exec it: only the
    default command (this Python, ``-m`` the proc module, no wrapper) with no
    change to start-up variables is forked (see ``_zygote``).  Worker loops
    exec their procs (they are the procs' parent, which their clients and
    tests rely on)."""
    from monarch_core._actor import _zygote

    if (
        argv != [sys.executable, "-m", PROC_MODULE]
        or cmd.arg0 is not None
        or getattr(kernel.agent, "is_host", False)
        or not _zygote.enabled()
    ):
        return None
    return _zygote.server_of(kernel).for_env(env)


def _coords(rank: int, sizes: list) -> list[int]:
    out = []
    for size in reversed(sizes):
        out.append(rank % size)
        rank //= size
    return list(reversed(out))
