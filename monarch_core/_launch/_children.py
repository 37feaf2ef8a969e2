"""Child processes of a spawning process: start one, await its exit.

:func:`start_child` execs a proc's command as a child of this process and
returns a :class:`Child`; the fork server's :class:`~._fork_server.ForkedChild`
has the same interface.  Either is handed to the kernel
(``Kernel.adopt_child``), which watches it and turns its exit into a proc
failure (or a clean stop).  The interface the kernel relies on
(:class:`ChildProcess`) is the kernel's own protocol, so the kernel never
imports this package.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import trio

__all__ = ["Child", "close_pidfd", "start_child"]


def close_pidfd(child: Any) -> None:
    """Close ``child._pidfd`` once its process has been reaped (this
    module's :class:`Child` and the fork server's ``ForkedChild``)."""
    if child._pidfd is not None:
        try:
            os.close(child._pidfd)
        except OSError:
            pass
        child._pidfd = None


class Child:
    """A child process whose exit can be awaited on the trio loop (pidfd)."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._pidfd: int | None = None
        self._exited: trio.Event | None = None
        self._waiting = False
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # pragma: no cover - kernels without pidfd
            self._pidfd = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Wait for the exit (any number of tasks may wait at once: one
        watches the pidfd, the others wait for it)."""
        import trio  # (lazily: this module is imported by ``import monarch_core.actor``)

        if self._exited is None:
            self._exited = trio.Event()
        while self._waiting:
            await self._exited.wait()
            if self._popen.returncode is not None:
                return self._popen.returncode
        self._waiting = True
        try:
            while self._popen.poll() is None:  # the pidfd is readable once the process exited
                if self._pidfd is not None:
                    await trio.lowlevel.wait_readable(self._pidfd)
                else:  # pragma: no cover - kernels without pidfd
                    await trio.sleep(0.05)
            rc = self._popen.wait()
            close_pidfd(self)
        finally:
            self._waiting = False
        self._exited.set()
        return rc

    def terminate(self) -> None:
        if self._popen.poll() is None:
            self._popen.terminate()

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()


def start_child(
    argv: list[str], env: dict[str, str], *, cwd: str | None = None, executable: str | None = None
) -> Child:
    """Exec ``argv`` as a child of this process, in a new session.

    Call it on the kernel thread, which lives as long as the kernel: the
    child's parent-death signal fires when the forking thread exits, so a
    short-lived helper thread (``trio.lowlevel.open_process`` uses one) would
    kill the proc when that thread retires."""
    return Child(subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True, executable=executable))
