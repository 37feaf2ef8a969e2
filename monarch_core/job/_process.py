"""``ProcessJob``: several "hosts" on this machine, one worker loop each.

Each host is ``python -m monarch_core.worker`` listening on a Unix socket
(``ipc://@...``), started detached from the client (its own session), so
that it outlives the program that applied the job: the next run attaches
to the same worker loops (``attach_to_workers``) from the saved state.
``kill()`` shuts them down (their procs with them).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, NamedTuple, Optional

from monarch_core.job._trait import JobState, JobTrait

logger = logging.getLogger("monarch.job")

#: Seconds a worker loop may take to listen.
READY_TIMEOUT = 120.0
#: Seconds ``kill()`` waits for the worker loops and their procs to end.
KILL_TIMEOUT = 30.0


class ProcessState(NamedTuple):
    """One worker loop of a job: its pid and the address it listens on."""

    pid: int
    channel: str


class ProcessJob(JobTrait):
    """A job of ``meshes`` (name -> number of hosts), each host a worker
    loop process on this machine; ``env``: more environment for them."""

    def __init__(self, meshes: dict[str, int], env: Optional[dict[str, str]] = None) -> None:
        if not isinstance(meshes, dict) or not meshes:
            raise TypeError(f"ProcessJob(meshes=...) takes a dict of host mesh name -> number of hosts, such as "
                            f"{{'trainers': 2}}, got {meshes!r}")
        for name, n in meshes.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"ProcessJob: mesh name {name!r} must be an identifier (it is an attribute of "
                                 "the job's state)")
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"ProcessJob: meshes[{name!r}] must be an int >= 1, got {n!r}")
        super().__init__()
        self._meshes = dict(meshes)
        self._env = dict(env or {})
        self._host_to_pid: dict[str, ProcessState] = {}
        self._log_dir: Optional[str] = None
        self._live: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_live"] = []
        return state

    def _create(self, client_script: Optional[str]) -> None:
        if client_script is not None:
            raise RuntimeError("ProcessJob cannot run batch-mode scripts (apply(client_script=...)); use LocalJob "
                               "(the client on this host) or SlurmJob (the client in the allocation)")
        self._log_dir = tempfile.mkdtemp(prefix="monarch-process-job-")
        tag = uuid.uuid4().hex[:12]
        started: list[tuple[str, subprocess.Popen, str]] = []
        try:
            for mesh, count in self._meshes.items():
                for i in range(count):
                    key = f"{mesh}_{i}"
                    address = f"ipc://@monarch-job-{tag}-{key}"
                    log = os.path.join(self._log_dir, f"{key}.log")
                    env = {**os.environ, **self._env, "PYTHONUNBUFFERED": "1"}
                    with open(log, "w") as out:
                        p = subprocess.Popen([sys.executable, "-m", "monarch_core.worker", "--address", address],
                                             env=env, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True)
                    self._host_to_pid[key] = ProcessState(p.pid, address)
                    started.append((key, p, log))
            for key, p, log in started:
                _wait_ready(key, p, log, READY_TIMEOUT)
                logger.info("ProcessJob: worker loop %s (pid %d) listens on %s", key, p.pid,
                            self._host_to_pid[key].channel)
        except BaseException:
            self._kill()
            raise

    def _state(self) -> JobState:
        from monarch_core.actor import attach_to_workers

        dead = [k for k, p in self._host_to_pid.items() if not _alive(p.pid)]
        if dead:
            raise RuntimeError(f"ProcessJob: the worker loop(s) of {', '.join(sorted(dead))} are gone (see the logs "
                               f"in {self._log_dir}); kill() the job and apply it again")
        meshes = {}
        for mesh, count in self._meshes.items():
            addrs = [self._host_to_pid[f"{mesh}_{i}"].channel for i in range(count)]
            meshes[mesh] = attach_to_workers(addrs)
        self._live.extend(meshes.values())
        return JobState(meshes)

    def can_run(self, spec: JobTrait) -> bool:
        """The same meshes, and every worker loop still runs."""
        return (isinstance(spec, ProcessJob) and spec._meshes == self._meshes and bool(self._host_to_pid)
                and all(_alive(p.pid) for p in self._host_to_pid.values()))

    @property
    def worker_pids(self) -> dict[str, int]:
        """The pid of each host's worker loop (``"trainers_0"`` -> pid)."""
        return {k: p.pid for k, p in self._host_to_pid.items()}

    def _kill(self) -> None:
        """Shut the host meshes this process attached down (their procs stop
        first, so nothing reports a failure), then end every worker loop and
        whatever it still runs (SIGKILL of the process trees)."""
        for hm in self._live:
            try:
                hm.shutdown().get(timeout=KILL_TIMEOUT)
            except Exception as e:  # noqa: BLE001 - the process trees are ended below in any case
                logger.info("shutting %r down failed: %s", hm, e)
        self._live = []
        roots = [p.pid for p in self._host_to_pid.values() if _alive(p.pid)]
        tree = _descendants(roots)
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + KILL_TIMEOUT
        while time.monotonic() < deadline and any(_alive(p) for p in tree):
            time.sleep(0.05)
        left = [p for p in tree if _alive(p)]
        if left:
            logger.warning("ProcessJob.kill(): processes %s did not end within %.0fs", left, KILL_TIMEOUT)
        self._host_to_pid.clear()
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None


def _wait_ready(key: str, p: subprocess.Popen, log: str, timeout: float) -> None:
    """Until the worker loop ``key`` prints its readiness line into ``log``."""
    from monarch_core.hookspecs import WORKER_READY_PREFIX

    deadline = time.monotonic() + timeout
    while True:
        with open(log) as f:
            text = f.read()
        if WORKER_READY_PREFIX in text:
            return
        if p.poll() is not None:
            raise RuntimeError(f"ProcessJob: the worker loop of {key} exited with code {p.returncode} before it "
                               f"listened; its output:\n{text[-3000:]}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"ProcessJob: the worker loop of {key} did not listen within {timeout:.0f}s; its "
                               f"output:\n{text[-3000:]}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return state not in ("Z", "X", "x")


def _descendants(roots: list[int]) -> list[int]:
    """``roots`` and every live process below them (by parent pid, /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return list(roots)
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out
