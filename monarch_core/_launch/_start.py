"""Starting and stopping this process's runtime in a client.

:func:`runtime` is what the mesh API's entry points call: the runtime of this
process, starting the client's (its kernel thread, its proc agent, its
observer -- telemetry, whose hub the procs report to) on first use.
:func:`shutdown` stops it (``shutdown_context``, interpreter exit).  The
client's composition root, as :mod:`._proc_main` is a proc's; the state itself
lives in ``_proc._state``, which imports nothing above it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import uuid

from monarch_core import settings
from monarch_core._proc import _state, _transport
from monarch_core._telemetry import _observer, _reporting

__all__ = ["runtime", "shutdown"]

logger = logging.getLogger("monarch.actor")


def runtime() -> _state.ProcRuntime:
    """This process's runtime, starting the client kernel on first use."""
    rt = _state.current_runtime_or_none()
    if rt is not None:
        return rt
    with _state.runtime_lock:
        rt = _state.current_runtime_or_none()
        if rt is not None:
            return rt
        if _state.is_shut_down():
            raise RuntimeError(
                "the monarch context was shut down (shutdown_context() or interpreter exit); "
                "no new meshes can be created in this process"
            )
        _start_client()
    return _state.current()


def _start_client() -> None:
    from monarch_core._kernel._runtime import Kernel  # (lazily: importing the API loads no trio)
    from monarch_core._proc._agent import ProcAgent
    from monarch_core._plugins import registry

    if settings.is_set("MONARCH_MALLOC_REUSE_MB"):  # procs tune malloc by default; a client only when asked
        _state.tune_malloc()
    choice = _transport.current_choice()
    transport = registry().transport(choice.name)
    proc_id = f"client-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    kernel = Kernel(proc_id=proc_id, name="client", transport=transport, bind_spec=choice.bind_spec)
    agent = ProcAgent(kernel)
    kernel.agent = agent
    kernel.start_thread()
    ref = (proc_id, kernel.address)
    rt = _state.ProcRuntime(
        kernel=kernel,
        agent=agent,
        proc_id=proc_id,
        name="client",
        is_client=True,
        transport=choice.name,
        root=ref,
        parent=None,
        point=_state.ROOT_POINT,
        python_executable=sys.executable,
        observer=_observer.Telemetry(),
    )
    agent.runtime = rt
    agent.proc_ready.set()
    _state.set_runtime(rt)
    _reporting.start_client(rt)
    atexit.register(_atexit_shutdown)
    logger.debug("client kernel listening on %s", kernel.address)


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
        rt.kernel.stop_loop()
        rt.kernel.join(timeout)
        _state.clear_runtime()
