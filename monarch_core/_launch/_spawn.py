"""Starting procs: on this host, and through the worker loop of a remote host.

:func:`start_proc` turns a :class:`~._spec.ProcSpec` into an OS process on
the host that runs it (this process is its parent): the environment is that
host's, plus its transport's ``child_env()`` (credentials), plus the
command's overrides, plus ``monarch_proc_env`` hook results.
A proc that runs the default command is forked from the spawning process's
fork server (see ``_fork_server``, ``_zygote``); any other is exec'd (``_children``).

The client side of a spawn: :func:`spawn_local` starts the procs of a host
without a worker loop (``this_host()``), :func:`spawn_remote` asks a worker
loop to, and both send each proc its ``init`` (the bootstrap callable);
:class:`ProcStatus` collects every proc's ``hello`` (its address) and
``ready`` (its bootstrap ran), which resolves ``ProcMesh.initialized``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._kernel._ports import PortHandler
from monarch_core._launch._children import start_child
from monarch_core._launch._spec import ProcSpec
from monarch_core.errors import SupervisionError

from monarch_core._launch._bootstrap import (
    BOOTSTRAP_ENV,
    PROC_MODULE,
    BootstrapCommand,
    apply_bind,
)

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.proc")


async def start_proc(kernel: Kernel, spec: ProcSpec, *, bind_spec: str | None) -> Any:
    """Start the OS process for ``spec`` as a child of this process and hand
    it to the kernel to watch (kernel loop).  Raises on failure to start (the
    caller reports it)."""
    from monarch_core._plugins import registry

    program = sys.executable if spec.default_program else spec.command.program
    cmd = dataclasses.replace(spec.command, program=program)
    env = cmd.build_env(transport_env(kernel.transport))
    hook = registry().pm.hook.monarch_proc_env
    if hook.get_hookimpls():
        coords = dict(zip(spec.labels, _coords(spec.rank, spec.sizes)))
        for overrides in hook(proc_name=spec.name, rank=spec.rank, coords=coords):
            for k, v in (overrides or {}).items():
                if v is None:
                    env.pop(k, None)
                else:
                    env[k] = str(v)
    argv, cpus = apply_bind(cmd.argv(), spec.bind)
    info = {
        "proc_id": spec.proc_id,
        "name": spec.name,
        "rank": spec.rank,
        "labels": list(spec.labels),
        "sizes": list(spec.sizes),
        "transport": spec.transport,
        "bind_spec": bind_spec,
        "parent": list(spec.parent),
        "root": list(spec.root),
        "status": list(spec.status),
        "parent_pid": os.getpid(),
        "sys_path": list(spec.sys_path),
        "python": program,
        "cpus": cpus,
        "log_level": spec.log_level,
        "host_name": getattr(spec, "host_name", ""),
        "output": getattr(spec, "output", "direct"),
        "describe": spec.describe,
        # A worker loop is its procs' parent but not their spawner's address
        # book: they tell it where they listen (for its heartbeats).
        "worker_loop": [kernel.proc_id, kernel.address, os.getpid()] if getattr(kernel.agent, "is_host", False) else None,
    }
    zygote = _fork_server(kernel, cmd, argv, env)
    if zygote is not None:
        from monarch_core._launch._fork_server import ForkServerUnavailable

        info["parent_pid"] = zygote.pid
        env[BOOTSTRAP_ENV] = bootstrap_env_json(info)
        kernel.expect_proc(spec.proc_id)
        try:
            child = await zygote.fork(env, os.getcwd())
        except ForkServerUnavailable as e:
            logger.info("starting %s with exec: %s", spec.describe, e)
        else:
            logger.debug("%s forked from fork server pid %d as pid %d", spec.describe, zygote.pid, child.pid)
            kernel.adopt_child(spec.proc_id, child, describe=spec.describe)
            return child
        info["parent_pid"] = os.getpid()
    env[BOOTSTRAP_ENV] = bootstrap_env_json(info)
    executable = cmd.program if cmd.arg0 is not None and argv[0] == cmd.arg0 else None
    kernel.expect_proc(spec.proc_id)
    child = start_child(argv, env, executable=executable)
    import trio  # (lazily: ``import monarch_core.actor`` must not load trio)

    await trio.lowlevel.checkpoint()
    kernel.adopt_child(spec.proc_id, child, describe=spec.describe)
    return child


def transport_env(transport: Any) -> dict[str, str]:
    """This process's environment plus what procs need to use ``transport``
    as this process does (``Transport.child_env()``: its credentials)."""
    env = dict(os.environ)
    child_env = getattr(transport, "child_env", None)
    if child_env is not None:
        env.update(child_env())
    return env


def bootstrap_env_json(info: dict) -> str:
    """The ``MONARCH_PROC_BOOTSTRAP`` value a proc reads its identity from."""
    return json.dumps(info, separators=(",", ":"))


def _fork_server(kernel: Kernel, cmd: BootstrapCommand, argv: list[str], env: dict[str, str]) -> Any:
    """The zygote to fork this proc from, or ``None`` to exec it: only the
    default command (this Python, ``-m`` the proc module, no wrapper) with no
    change to start-up variables is forked (see ``_zygote``), by clients and
    worker loops alike (a worker loop's zygote starts with the worker loop,
    so a host's procs start in parallel from a warm parent)."""
    from monarch_core._launch import _fork_server

    if (
        argv != [sys.executable, "-m", PROC_MODULE]
        or cmd.arg0 is not None
        or not _fork_server.enabled()
    ):
        return None
    return _fork_server.server_of(kernel).for_env(env)


def _coords(rank: int, sizes: Any) -> list[int]:
    out = []
    for size in reversed(sizes):
        out.append(rank % size)
        rank //= size
    return list(reversed(out))


# ---------------------------------------------------------------- the spawning client's side


def host_proc_id(address: str) -> str:
    """The session key of the worker loop at ``address``."""
    return f"host@{address}"


async def spawn_local(rt: Any, entries: list, status: ProcStatus, boot_payload: tuple) -> None:
    """Start the OS processes of procs on this host (kernel loop), then send
    each its ``init``.  ``entries``: ``(slot, spec)`` pairs."""
    kernel = rt.kernel

    async def start(slot: Any, spec: ProcSpec) -> None:
        try:
            proc = await start_proc(kernel, spec, bind_spec=kernel.transport.child_bind_spec(kernel.address))
            slot.pid = proc.pid
            rt.agent.watch_child(slot.proc_id)
        except Exception as e:
            msg = f"could not start {spec.describe} with {spec.argv_for_errors()!r}: {type(e).__name__}: {e}"
            logger.error("%s", msg)
            slot.failed = msg
            kernel.proc_failed(slot.proc_id, msg)
            status.fail(SupervisionError(msg), slot.proc_id)
            return
        send_init(kernel, slot, spec, boot_payload, status)

    import trio

    # All at once: the fork server gets every request in one go (no round
    # trip between two forks), and exec'd procs start their imports together.
    async with trio.open_nursery() as nursery:
        for slot, spec in entries:
            nursery.start_soon(start, slot, spec)


def send_init(kernel: Kernel, slot: Any, spec: ProcSpec, boot_payload: tuple, status: ProcStatus) -> None:
    header = C.encode(C.Init(tuple(spec.status), spec.rank))
    kernel.send(slot.proc_id, None, W.K_CONTROL, 0, header, boot_payload[0], boot_payload[1], status.port_id)


def spawn_remote(rt: Any, address: str, entries: list, status: ProcStatus, boot_payload: tuple) -> None:
    """Ask the worker loop at ``address`` to start procs (kernel loop)."""
    from monarch_core._proc import _serial

    kernel = rt.kernel
    host_id = host_proc_id(address)
    for slot, _spec in entries:
        kernel.expect_proc(slot.proc_id)
    payload, bufs = _serial.dumps([spec for _slot, spec in entries])
    kernel.send(host_id, address, W.K_CONTROL, 0, C.encode(C.HostSpawn()), payload, bufs, status.port_id)
    for slot, spec in entries:
        send_init(kernel, slot, spec, boot_payload, status)


class ProcStatus(PortHandler):
    """Collects hello/ready from newly spawned procs (any thread); ``cell``
    resolves when every proc is ready, or fails with the first error."""

    def __init__(self, kernel: Kernel, slots: list, describe: Callable[[int], str]) -> None:
        from monarch_core._proc._future import Cell

        self.kernel = kernel
        self.slots = slots
        self.cell = Cell()
        self.ready = 0
        self.lock = threading.Lock()
        self.describe = describe
        self.port_id = kernel.add_port(self)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        from monarch_core._proc import _serial

        try:
            msg = _serial.loads(payload, buffers)
        except Exception as e:
            msg, status = e, W.S_ERROR
        if status == W.S_ERROR:
            self._fail(msg if isinstance(msg, BaseException) else RuntimeError(str(msg)), rank)
            return
        if msg[0] == "hello":
            _tag, proc_id, address, pid = msg
            slot = self.slots[rank]
            slot.address = address
            slot.pid = pid
            slot.ready.set()
            if self.kernel.in_loop():
                self.kernel.learn_address(proc_id, address)
            else:
                self.kernel.call_soon(self.kernel.learn_address, proc_id, address)
        elif msg[0] == "ready":
            with self.lock:
                self.ready += 1
                done = self.ready == len(self.slots)
            if 0 <= rank < len(self.slots):
                from monarch_core._proc import _state

                _state.observer().proc_ready(self.slots[rank].proc_id, self.slots[rank].pid, done)
            if done:
                self.kernel.remove_port(self.port_id)
                self.cell.set_result(True)

    def _fail(self, exc: BaseException, rank: int | None) -> None:
        self.kernel.remove_port(self.port_id)
        self.cell.set_exception(exc)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        for s in self.slots:
            if s.proc_id == proc_id:
                s.failed = str(exc)
                s.ready.set()
        self._fail(SupervisionError(f"a proc failed while starting: {exc}"), None)
