"""The ``local`` scheduler: hosts on this machine, one worker loop each.

It uses the public scheduler contract only (``monarch_core.hookspecs``), as
any third-party scheduler would: it starts ``launch.command()`` as a child
process per host, reads each worker's address from its readiness line,
reports a worker that exits as a lost host, and kills the workers on release.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence

from monarch_core.errors import ConfigError
from monarch_core.hookspecs import (
    Allocation,
    AllocationRequest,
    HostHandle,
    Scheduler,
    WorkerLaunch,
    SyncedHost,
    Workspace,
    wait_worker_address,
)


class _LocalAllocation(Allocation):
    def __init__(self, procs: list[subprocess.Popen], hosts: list[HostHandle]) -> None:
        self.procs = procs
        self.hosts = hosts
        self.released = threading.Event()

    def sync_workspace(self, workspace: Workspace, hosts: Sequence[str], *, conda: bool = False,
                       auto_reload: bool = False) -> dict[str, SyncedHost]:
        """Nothing to copy: local hosts are this machine, and see its files
        where they are (the procs run this client's interpreter already, so
        ``conda`` changes nothing); the workspace's own directories go first
        on the ``sys.path`` of procs spawned afterwards (and ``auto_reload``
        maps changed files to them)."""
        paths = tuple(str(p.resolve()) for p in workspace.dirs)
        return {h: SyncedHost(paths=paths, local=True) for h in hosts}

    def release(self) -> None:
        self.released.set()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


class LocalScheduler(Scheduler):
    """``scheduler = "local"``: ``hosts`` (default 1) hosts on this machine,
    each a worker loop (``python -m monarch_core.worker``) started as a child
    of the calling process; the host's procs are that worker loop's children."""

    name = "local"
    params = frozenset({"hosts"})

    def validate(self, request: AllocationRequest) -> None:
        unknown = sorted(set(request.params) - self.params)
        if unknown:
            raise ConfigError(
                f"{request.source}: unknown parameter(s) {unknown} for scheduler 'local'; "
                f"it accepts {sorted(self.params)} (e.g. hosts = 2)"
            )
        n = request.params.get("hosts", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{request.source}: 'hosts' must be an integer >= 1, got {n!r}")

    def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> Allocation:
        n = int(request.params.get("hosts", 1))
        procs: list[subprocess.Popen] = []
        hosts: list[HostHandle] = []
        alloc = _LocalAllocation(procs, hosts)
        alloc.extent = {"hosts": n}
        try:
            for _ in range(n):  # all start at once; their imports overlap
                procs.append(subprocess.Popen(launch.command("127.0.0.1"), env=launch.environment(host="127.0.0.1"),
                                              stdout=subprocess.PIPE))
            for i, p in enumerate(procs):
                name = f"local{i}"
                address = wait_worker_address(p.stdout, launch.timeout, host=name)
                hosts.append(HostHandle(name=name, address=address, labels={"pid": str(p.pid)}))
                threading.Thread(target=_watch, args=(p, name, alloc, launch), daemon=True,
                                 name=f"monarch-local-{name}").start()
        except BaseException:
            alloc.release()
            raise
        return alloc


def _watch(p: subprocess.Popen, name: str, alloc: _LocalAllocation, launch: WorkerLaunch) -> None:
    rc = p.wait()
    if not alloc.released.is_set():
        launch.report_lost(name, f"its worker loop (pid {p.pid}) exited with code {rc}")
