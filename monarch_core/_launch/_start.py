"""Starting and stopping this process's runtime in a client.

:func:`ensure_runtime` is what the mesh API's entry points call first: it
starts this process's runtime when it has none -- a client's (its kernel
thread, its proc agent, telemetry's instrumentation and its listeners of the
runtime's events -- telemetry's hub is what the procs report to -- and the
listeners that keep the status record), on first use.  The runtime is read
with ``_proc._state.current()``, the one accessor.
:func:`shutdown` stops it (``shutdown_context``, interpreter exit).
:func:`build_runtime` assembles a runtime, in the one place it is: the
client's here, a proc's in :mod:`._proc_main`, a worker loop's in
:mod:`._worker`.  The state itself lives in ``_proc._state``, which imports
nothing above it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import uuid
from typing import Any, Callable

from monarch_core import _status, settings
from monarch_core._launch import _client_status
from monarch_core._proc import _state, _transport
from monarch_core._proc._instrumentation import Instrumentation, NoInstrumentation
from monarch_core._telemetry import _reporting
from monarch_core._telemetry import _runtime as _telemetry

__all__ = ["build_runtime", "ensure_runtime", "shutdown"]

logger = logging.getLogger("monarch.actor")


def ensure_runtime() -> None:
    """Start this process's runtime if it has none: a client's, on first use
    (its kernel thread, its proc agent, telemetry).  What the mesh API's
    entry points call first (``this_proc()``, ``this_host()``,
    ``hosts_from_config()``, ``context()``, ``monarch_core.runtime``...);
    the runtime itself is read with ``_state.current()``, the one accessor.
    Raises ``RuntimeError`` once the monarch context was shut down."""
    if _state.current_runtime_or_none() is not None:
        return
    with _state.runtime_lock:
        if _state.current_runtime_or_none() is not None:
            return
        if _state.is_shut_down():
            raise RuntimeError(
                "the monarch context was shut down (shutdown_context() or interpreter exit); "
                "no new meshes can be created in this process"
            )
        _start_client()


def build_runtime(*, proc_id: str, kernel_name: str, transport: Any, bind_spec: str | None,
                  agent: Callable[[Any], Any] | None = None, ready: bool = True,
                  instrumentation: Instrumentation | None = None, **fields: Any) -> _state.ProcRuntime:
    """Assemble this process's runtime and make it current: the one place it
    is (a client's start, ``_launch._proc_main``, ``_launch._worker``).

    A kernel for ``proc_id`` (named ``kernel_name``, on ``transport`` -- a
    ``Transport`` -- bound at ``bind_spec``), its agent (``agent(kernel)``,
    default a ``ProcAgent``), and the :class:`~._state.ProcRuntime` over both,
    with ``instrumentation`` (default ``NoInstrumentation``: nothing
    recorded) and an events bus nobody listens to yet (the caller subscribes
    its listeners to ``rt.events``), whose other fields are ``fields``
    (``name``, ``is_client``, ``root``, ``parent``, ``point``,
    ``python_executable``...).  A client's kernel thread starts here (``is_client=True``), and a client is its own root
    (no ``root``: this proc); a proc's or worker loop's kernel runs when its
    caller serves it.  ``ready``: the agent takes actor messages at once (a
    proc's waits until its bootstrap ran)."""
    from monarch_core._kernel._runtime import Kernel  # (lazily: importing the API loads no trio)
    from monarch_core._proc._agent import ProcAgent

    raise_fd_limit()
    kernel = Kernel(proc_id=proc_id, name=kernel_name, transport=transport, bind_spec=bind_spec)
    kernel.agent = proc_agent = (agent or ProcAgent)(kernel)
    if fields["is_client"]:
        kernel.start_thread()
    fields.setdefault("root", (proc_id, kernel.address))
    rt = _state.ProcRuntime(kernel=kernel, agent=proc_agent, proc_id=proc_id, transport=transport.name,
                            instrumentation=instrumentation or NoInstrumentation(), **fields)
    proc_agent.runtime = rt
    if ready:
        proc_agent.proc_ready.set()
    _state.set_runtime(rt)
    return rt


#: The soft ``RLIMIT_NOFILE`` a runtime asks for when its hard limit is unlimited.
FD_LIMIT_WANTED = 1 << 16


def raise_fd_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit (at
    most :data:`FD_LIMIT_WANTED` when that is unlimited); never lowers it.

    A client holds a connection (a socket) to every proc and worker loop it
    talks to, and a proc or worker loop to its peers, children and fork
    server: with the common default soft limit of 1024, a client of a few
    hundred hosts of several procs each would fail with ``OSError: [Errno
    24] Too many open files`` while the hard limit allows far more.  The
    kernel polls with epoll, so descriptors above 1024 are fine.  Children
    inherit the raised limit.  Where it cannot be raised (no ``resource``
    module, a refusal), nothing changes."""
    try:
        import resource
    except ImportError:  # (not a POSIX system)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT_WANTED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError) as e:
            logger.debug("could not raise the open-file limit from %d to %d: %s", soft, want, e)
        else:
            logger.debug("raised the open-file limit from %d to %d", soft, want)


def _start_client() -> None:
    from monarch_core._plugins import registry

    if settings.is_set("MONARCH_MALLOC_REUSE_MB"):  # procs tune malloc by default; a client only when asked
        _state.tune_malloc()
    choice = _transport.current_choice()
    proc_id = f"client-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    rt = build_runtime(proc_id=proc_id, kernel_name="client", transport=registry().transport(choice.name),
                       bind_spec=choice.bind_spec, name="client", is_client=True, parent=None,
                       point=_state.ROOT_POINT, python_executable=sys.executable,
                       instrumentation=_telemetry.Telemetry())
    _telemetry.subscribe(rt.events)  # telemetry's records of what the runtime tells
    _client_status.subscribe(rt.events)  # then this client's status record, for `monarch status`
    _reporting.start_client(rt)
    _status.start(proc_id)  # this client's record, for `monarch status`
    atexit.register(_atexit_shutdown)
    logger.debug("client kernel listening on %s", rt.kernel.address)


def _atexit_shutdown() -> None:
    try:
        shutdown(timeout=5.0)
    except Exception:  # pragma: no cover - best effort at exit
        logger.exception("error while shutting down the monarch context at exit")
    code = _state.requested_exit_code()
    if code:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def shutdown(timeout: float = 10.0) -> None:
    """Stop every proc this process owns and stop the kernel.  Idempotent."""
    rt = _state.current_runtime_or_none()
    if not _state.mark_shut_down() or rt is None:
        return
    try:
        rt.agent.shutdown_owned(timeout)  # ends with the ``proc_stopped`` event (allocations are given back)
    finally:
        if rt.is_client:  # what the procs shipped before they stopped goes to the sinks
            _reporting.close_client(rt.kernel)
            _status.stop()
        rt.kernel.stop_loop()
        rt.kernel.join(timeout)
        _state.clear_runtime()
