"""Process-wide runtime state: the kernel, this proc's identity, the context.

In the client the runtime is created on first use (starting the kernel thread);
in a worker process ``_proc_main`` creates it before the loop starts.
"""

from __future__ import annotations

import atexit
import collections
import contextvars
import logging
import os
import sys
import threading
import uuid
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from monarch_core import settings
from monarch_core import _telemetry
from monarch_core._mesh._shape import Extent, Point

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._kernel._upper import ProcAgentProtocol

logger = logging.getLogger("monarch.actor")

ProcRef = tuple  # (proc_id, address)


class Recent(MutableMapping):
    """A mapping that keeps only its ``limit`` most recently set entries (the
    oldest go first): a record of what ended -- stopped actors -- that a long
    job does not grow.  Thread-safe for single operations."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._d: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __getitem__(self, k: Any) -> Any:
        return self._d[k]

    def get(self, k: Any, default: Any = None) -> Any:
        return self._d.get(k, default)

    def __setitem__(self, k: Any, v: Any) -> None:
        with self._lock:
            d = self._d
            d[k] = v
            d.move_to_end(k)
            while len(d) > self.limit:
                d.popitem(last=False)

    def __delitem__(self, k: Any) -> None:
        with self._lock:
            del self._d[k]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._d))

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class ProcRuntime:
    """Everything this process knows about itself."""

    kernel: Kernel
    agent: Any  # the proc agent (``_agent.ProcAgent``; the kernel sees a ``ProcAgentProtocol``)
    proc_id: str
    name: str
    is_client: bool
    transport: str
    root: ProcRef
    parent: ProcRef | None
    point: Point
    python_executable: str
    proc_mesh_name: str = "client"
    caches: dict[str, Any] = field(default_factory=dict)

    @property
    def ref(self) -> ProcRef:
        return (self.proc_id, self.kernel.address)


class Upper:
    """Entry points of the layers above the proc runtime, filled in when those
    modules are imported: the runtime calls up through these and never
    imports them (the layers contract in ``pyproject.toml``)."""

    #: ``kernel -> agent``: the client's proc agent (set by ``_mesh``).
    client_agent: Callable[[Kernel], ProcAgentProtocol] | None = None
    #: ``() -> ProcMesh``: ``_mesh.this_proc``.
    this_proc: Callable[[], Any] | None = None
    #: ``(agent, name, payload, buffers)``: ``_controller.spawn_local_controller`` (set by ``_mesh``).
    spawn_local_controller: Callable[..., None] | None = None
    #: ``_endpoint.EndpointProperty``: what marks an endpoint on an actor class.
    endpoint_property: type | None = None


upper = Upper()

_runtime: ProcRuntime | None = None
_runtime_lock = threading.Lock()
_shutdown_done = False

#: The actor (an ``_host.ActorHost``) whose code is running, if any.
current_actor: contextvars.ContextVar[Any] = contextvars.ContextVar("monarch_current_actor", default=None)
#: The rank of the message being handled, within the cast's extent.
current_message_rank: contextvars.ContextVar[Point | None] = contextvars.ContextVar(
    "monarch_message_rank", default=None
)

_telemetry.bind_current_actor(current_actor)  # spans and output lines name the actor they come from

_EMPTY = Extent([], [])
ROOT_POINT = Point(0, _EMPTY)


def current_runtime_or_none() -> ProcRuntime | None:
    return _runtime


def set_runtime(rt: ProcRuntime) -> None:
    global _runtime
    _runtime = rt


def runtime() -> ProcRuntime:
    """This process's runtime, starting the client kernel on first use."""
    rt = _runtime
    if rt is not None:
        return rt
    with _runtime_lock:
        if _runtime is not None:
            return _runtime
        if _runtime is None:
            if _shutdown_done:
                raise RuntimeError(
                    "the monarch context was shut down (shutdown_context() or interpreter exit); "
                    "no new meshes can be created in this process"
                )
            _start_client()
    return _runtime  # type: ignore[return-value]


def _start_client() -> None:
    from monarch_core._proc import _transport
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._plugins import registry

    if settings.is_set("MONARCH_MALLOC_REUSE_MB"):  # procs tune malloc by default; a client only when asked
        tune_malloc()
    choice = _transport.current_choice()
    transport = registry().transport(choice.name)
    proc_id = f"client-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    kernel = Kernel(proc_id=proc_id, name="client", transport=transport, bind_spec=choice.bind_spec)
    if upper.client_agent is None:
        raise RuntimeError("the monarch client runtime starts from monarch_core.actor: import it first")
    agent = upper.client_agent(kernel)
    kernel.agent = agent
    kernel.start_thread()
    ref = (proc_id, kernel.address)
    rt = ProcRuntime(
        kernel=kernel,
        agent=agent,
        proc_id=proc_id,
        name="client",
        is_client=True,
        transport=choice.name,
        root=ref,
        parent=None,
        point=ROOT_POINT,
        python_executable=sys.executable,
    )
    agent.runtime = rt
    agent.proc_ready.set()
    set_runtime(rt)
    _telemetry.configure_process(proc_id=proc_id, name="client", is_root=True)
    from monarch_core._telemetry._hub import hub

    hub.start()  # the root's sinks: settings, plugins (procs ship their telemetry here)
    atexit.register(_atexit_shutdown)
    logger.debug("client kernel listening on %s", kernel.address)


def tune_malloc(env: dict | None = None) -> bool:
    """Let large buffers reuse freed memory (glibc only).

    Every large message a proc receives lands in a new buffer.  A freshly
    mapped 64 MiB buffer costs ~16k page faults (~35 ms on a VM, five times
    the copy itself); from the heap, once a buffer of that size has been
    freed, the next one reuses its pages.  glibc serves large requests from
    a non-main thread's arena with fresh mappings whatever the threshold, so
    the process uses one arena (threads allocating at the same time then
    share its lock).  The cost: up to this many MiB of freed memory may stay
    in the process for reuse.  True if applied (call before threads start)."""
    try:
        mb = settings.get("MONARCH_MALLOC_REUSE_MB", env)
    except ValueError as e:  # a proc must start: say so, and go on without the tuning
        logging.getLogger("monarch.proc").warning("%s", e)
        return False
    if mb <= 0:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    size = mb << 20
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
    return (
        bool(mallopt(M_MMAP_THRESHOLD, size))
        and bool(mallopt(M_TRIM_THRESHOLD, size))
        and bool(mallopt(M_ARENA_MAX, 1))
    )


_requested_exit_code = 0


def request_exit_code(code: int) -> None:
    """Make the interpreter exit with ``code`` (used by the default
    unhandled-fault hook, which ends the client with exit code 1)."""
    global _requested_exit_code
    _requested_exit_code = code


def _atexit_shutdown() -> None:
    try:
        shutdown(timeout=5.0)
    except Exception:  # pragma: no cover - best effort at exit
        logger.exception("error while shutting down the monarch context at exit")
    if _requested_exit_code:
        import sys as _sys

        _sys.stdout.flush()
        _sys.stderr.flush()
        os._exit(_requested_exit_code)


def shutdown(timeout: float = 10.0) -> None:
    """Stop every proc this process owns and stop the kernel.  Idempotent."""
    global _runtime, _shutdown_done
    with _runtime_lock:
        rt = _runtime
        if rt is None or _shutdown_done:
            _shutdown_done = True
            return
        _shutdown_done = True
    try:
        rt.agent.shutdown_owned(timeout)
    finally:
        _release_allocations()
        if rt.is_client:  # what the procs shipped before they stopped goes to the sinks
            _close_telemetry(rt)
        rt.kernel.stop_loop()
        rt.kernel.join(timeout)
        with _runtime_lock:
            _runtime = None


def _close_telemetry(rt: ProcRuntime) -> None:
    try:
        from monarch_core._telemetry._hub import hub

        if not rt.kernel.in_loop():  # the batches delivered so far wait in the loop's queue: let them through
            done = threading.Event()
            rt.kernel.call_soon(done.set)
            done.wait(1.0)
        hub.close()
    except Exception:  # pragma: no cover - best effort at exit
        logger.exception("closing the telemetry sinks failed")


def _release_allocations() -> None:
    """Give back every host allocation still held (whatever stopping the
    meshes managed), each within ``MONARCH_RELEASE_TIMEOUT`` s."""
    alloc = sys.modules.get("monarch_core._launch._alloc")
    if alloc is None:
        return
    try:
        alloc.release_all()
    except Exception:  # pragma: no cover - best effort at exit
        logger.exception("releasing host allocations failed")


def is_shut_down() -> bool:
    return _shutdown_done
