"""Allocating hosts through a scheduler plugin (the client's side of the seam).

:func:`allocate` runs ``Scheduler.allocate`` on a thread of its own (never on
the kernel's trio loop: a blocking scheduler stalls nothing), with a timeout
and cancellation, checks what it returned, runs the readiness step (every
worker loop must answer ``host_hello``), and returns an :class:`AllocationRecord`.
The record turns ``report_lost`` calls into proc failures of the host mesh
built on it, passes ``report_notice`` calls to the host mesh's owner, and
releases the allocation exactly once: on ``HostMesh.shutdown()``, on a failed
allocation, at interpreter exit, after an unhandled supervision failure, on
SIGTERM (:func:`release_all`) -- through ``Allocation.detach()`` instead when
the client ends with the host mesh stopped (``HostMesh.stop()``).
"""

from __future__ import annotations

import inspect
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from monarch_core import settings
from monarch_core._proc import _lifecycle
from monarch_core.errors import AllocationError, ConfigError, MonarchError

logger = logging.getLogger("monarch.launch")

#: Seconds a scheduler's ``allocate`` plus the readiness step may take.
ALLOCATE_TIMEOUT: float = settings.get("MONARCH_ALLOCATE_TIMEOUT")
#: Seconds ``Allocation.release()`` may take before the core moves on.
RELEASE_TIMEOUT: float = settings.get("MONARCH_RELEASE_TIMEOUT")

_live: dict[int, AllocationRecord] = {}
_live_lock = threading.Lock()


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; what it returns is awaited, if awaitable, in a trio loop
    of its own (this thread): a scheduler's hooks may be ``async def``."""
    out = fn(*args, **kwargs)
    if inspect.isawaitable(out):
        import trio

        async def wait() -> Any:
            return await out

        return trio.run(wait)
    return out


def _takes_launch(fn: Any) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _host_name(host: Any) -> Any:
    """The name of a host a scheduler reports (a name, a ``HostHandle``, or ``None``: none)."""
    return host if host is None or isinstance(host, str) else getattr(host, "name", str(host))


class AllocationRecord:
    """One live allocation: its hosts, extent, lost hosts, and its release."""

    def __init__(self, scheduler: Any, request: Any) -> None:
        self.scheduler = scheduler
        self.request = request
        self.allocation: Any = None
        self.hosts: list = []
        self.labels: tuple[str, ...] = ()
        self.sizes: tuple[int, ...] = ()
        self.lost: dict[str, str] = {}
        self.on_lost: Any = None  # set by the host mesh: (host name, reason) -> None, any thread
        #: set by the host mesh: (host name or None, message) -> None, any thread
        self.on_notice: Any = None
        #: notices reported before the host mesh existed (delivered by it)
        self.notices: list[tuple[str | None, str]] = []
        self._released = False
        #: The host mesh is shutting down: workers ending now are not lost.
        self.closing = False
        #: ``HostMesh.stop()`` was the last thing done to the host mesh: the
        #: client's end detaches (``Allocation.detach``) instead of releasing.
        self.stopped = False
        self._lock = threading.Lock()

    @property
    def what(self) -> str:
        return f"scheduler {self.scheduler.name or type(self.scheduler).__name__!r} ({self.request.source})"

    # -- lost hosts (any thread) ---------------------------------------
    def report_lost(self, host: str, reason: str) -> None:
        host = _host_name(host)
        with self._lock:
            if self._released or self.closing or host in self.lost:
                return
            self.lost[host] = str(reason)
            cb = self.on_lost
        logger.warning("%s reports host %r lost: %s", self.what, host, reason)
        if cb is not None:
            cb(host, str(reason))

    # -- notices (any thread) ------------------------------------------
    def report_notice(self, host: str | None, message: str) -> None:
        """``WorkerLaunch.report_notice``: to the host mesh's owner (kept
        until the host mesh exists); dropped once released."""
        host = _host_name(host)
        with self._lock:
            if self._released:
                return
            cb = self.on_notice
            if cb is None:
                self.notices.append((host, str(message)))
        logger.warning("%s: %s", self.what, message)
        if cb is not None:
            cb(host, str(message))

    def listen_notices(self, cb: Any) -> list[tuple[str | None, str]]:
        """From now on notices go to ``cb``; returns those reported before."""
        with self._lock:
            self.on_notice = cb
            pending, self.notices = self.notices, []
        return pending

    # -- release (any thread but the kernel's) -------------------------
    def release(self, timeout: float | None = None, *, detach: bool = False) -> None:
        """Release the allocation once (later calls return at once); with
        ``detach``, through ``Allocation.detach()`` (the hosts are kept)."""
        with self._lock:
            if self._released:
                return
            self._released = self.closing = True
            alloc = self.allocation
        with _live_lock:
            _live.pop(id(self), None)
        if alloc is None:
            return
        limit = RELEASE_TIMEOUT if timeout is None else timeout
        done = threading.Event()
        err: list[BaseException] = []
        fn = (getattr(alloc, "detach", None) if detach else None) or alloc.release

        def run() -> None:
            try:
                _call(fn)
            except BaseException as e:  # noqa: BLE001
                err.append(e)
            finally:
                done.set()

        threading.Thread(target=run, name="monarch-release", daemon=True).start()
        if not done.wait(limit):
            logger.warning("releasing the hosts of %s did not finish within %.0fs", self.what, limit)
        elif err:
            logger.warning("releasing the hosts of %s failed: %s: %s", self.what, type(err[0]).__name__, err[0])


def allocate(scheduler: Any, request: Any, rt: Any, timeout: float | None = None) -> AllocationRecord:
    """Allocate, check and wait for the hosts of ``request`` (caller's thread,
    never the kernel loop).  Raises ``AllocationError`` (or ``ConfigError``).

    ``rt``: this process's runtime, or a function that starts it (a client
    whose kernel is not running yet): it is called once the scheduler has
    started on its own thread, so that the client's start (trio, its kernel,
    its listener) overlaps with the hosts' (connections, interpreters)."""
    from monarch_core._proc import _state, _transport
    from monarch_core._plugins import registry
    from monarch_core.hookspecs import WorkerLaunch

    if callable(rt):  # a starter: the runtime itself when it runs already
        rt = _state.current_runtime_or_none() or rt
    start = rt if callable(rt) else None
    if start is None:
        transport, python = rt.transport, rt.python_executable
    else:  # what the client runtime ``start`` makes will use (``_start._start_client``)
        transport, python = _transport.current_choice().name, sys.executable
    limit = ALLOCATE_TIMEOUT if timeout is None else float(timeout)
    record = AllocationRecord(scheduler, request)
    # what worker loops need to accept this client: the transport's
    # child_env(portable=True) (for tls, its credentials as inline PEM), and
    # its worker_credentials (per-worker credentials) if it has one
    t = registry().transport(transport)
    child_env = getattr(t, "child_env", None)
    launch = WorkerLaunch(
        transport=transport,
        scheme=_scheme_of(transport),
        python=python,
        credentials=dict(child_env(portable=True)) if child_env is not None else {},
        timeout=limit,
        report_lost=record.report_lost,
        notice_sink=record.report_notice,
        issue_credentials=getattr(t, "worker_credentials", None),
    )
    deadline = time.monotonic() + limit
    allocation, _started = _run_allocate(scheduler, request, launch, record, limit, meanwhile=start)
    if start is not None:  # (the starter started it)
        rt = _state.current()
    record.allocation = allocation
    with _live_lock:
        _live[id(record)] = record
    _install_sigterm()
    _lifecycle.subscribe("proc_stopped", _on_proc_stopped)
    try:
        _check(record, allocation, rt)
        wait_ready(rt, record.hosts, max(0.0, deadline - time.monotonic()), what=record.what)
    except BaseException:
        record.release()
        raise
    return record


def _run_allocate(scheduler: Any, request: Any, launch: Any, record: AllocationRecord, limit: float,
                  meanwhile: Any = None) -> tuple[Any, Any]:
    """Run the scheduler's ``allocate`` on a thread of its own within
    ``limit`` seconds; ``meanwhile()`` runs on the caller's thread while it
    does (its failure cancels the allocation).  Returns the allocation and
    what ``meanwhile`` returned (None without one)."""
    fn = scheduler.allocate
    args = (request, launch) if _takes_launch(fn) else (request,)
    box: dict[str, Any] = {}
    done = threading.Event()
    trio_token: list = []

    def run() -> None:
        try:
            if inspect.iscoroutinefunction(fn):
                import trio

                async def main() -> Any:
                    trio_token.append((trio.lowlevel.current_trio_token(), trio.CancelScope()))
                    with trio_token[0][1]:
                        return await fn(*args)
                    raise AllocationError(f"{record.what}: allocation cancelled")

                box["value"] = trio.run(main)
            else:
                box["value"] = _call(fn, *args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            done.set()
            if launch.cancelled.is_set() and "value" in box:
                late = AllocationRecord(record.scheduler, record.request)
                late.allocation = box["value"]
                logger.warning("%s returned hosts after the core gave up; releasing them", record.what)
                late.release()

    t = threading.Thread(target=run, name=f"monarch-allocate-{request.name}", daemon=True)
    t.start()

    def give_up() -> None:
        launch.cancelled.set()
        if trio_token:
            token, scope = trio_token[0]
            try:
                token.run_sync_soon(scope.cancel)
            except RuntimeError:
                pass

    deadline = time.monotonic() + limit
    started = None
    try:
        if meanwhile is not None:
            started = meanwhile()
        while not done.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                give_up()
                raise AllocationError(
                    f"{record.what} did not allocate hosts within {limit:.0f}s; it was cancelled "
                    "(MONARCH_ALLOCATE_TIMEOUT, or hosts_from_config(..., timeout=) sets the limit)"
                )
    except BaseException:  # Ctrl-C, SystemExit: cancel it too
        if not done.is_set():
            give_up()
        raise
    if "error" in box:
        e = box["error"]
        if isinstance(e, (AllocationError, ConfigError)):
            raise e
        if isinstance(e, MonarchError):
            raise AllocationError(f"{record.what} could not allocate hosts: {e}") from e
        raise AllocationError(f"{record.what} could not allocate hosts: {type(e).__name__}: {e}") from e
    return box["value"], started


def _check(record: AllocationRecord, allocation: Any, rt: Any) -> None:
    """The allocation is well formed and speaks the client's transport."""
    from monarch_core.hookspecs import HostHandle

    hosts = list(getattr(allocation, "hosts", None) or ())
    if not hosts:
        raise AllocationError(f"{record.what} returned no hosts (Allocation.hosts is empty)")
    for h in hosts:
        if not isinstance(h, HostHandle):
            raise AllocationError(f"{record.what} returned {h!r} in Allocation.hosts; expected HostHandle objects")
    names = [h.name for h in hosts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AllocationError(f"{record.what} returned hosts with the same name: {dup}; host names must be unique")
    extent = getattr(allocation, "extent", None)
    if extent is None:
        extent = {getattr(allocation, "dim", "hosts") or "hosts": len(hosts)}
    if not isinstance(extent, Mapping) or not extent or not all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 1
        for k, v in extent.items()
    ):
        raise AllocationError(
            f"{record.what} returned Allocation.extent={extent!r}; expected dimension names mapped to sizes >= 1, "
            "e.g. {'hosts': 4} or {'racks': 2, 'hosts': 2}"
        )
    n = math.prod(extent.values())
    if n != len(hosts):
        raise AllocationError(
            f"{record.what} returned {len(hosts)} hosts but Allocation.extent={dict(extent)} holds {n}"
        )
    from monarch_core._plugins import registry

    for h in hosts:
        if h.address is None:
            continue
        scheme = h.address.split("://", 1)[0] if "://" in h.address else ""
        try:
            name = registry().transport(scheme).name if scheme else None
        except Exception:  # noqa: BLE001 - unknown scheme
            name = None
        if name != rt.transport:
            raise AllocationError(
                f"{record.what} returned host {h.name!r} at {h.address!r}, whose scheme {scheme or '(none)'!r} is not "
                f"this client's transport {rt.transport!r}: worker loops must listen on "
                f"{_scheme_of(rt.transport)}:// (start them with WorkerLaunch.command()), or enable "
                f"{scheme!r} in the client (enable_transport) before hosts_from_config"
            )
    record.hosts = hosts
    record.labels = tuple(extent)
    record.sizes = tuple(extent.values())


def wait_ready(rt: Any, hosts: list, timeout: float, *, what: str) -> dict[str, dict]:
    """The readiness step: every host's worker loop answers ``host_hello``
    within ``timeout`` s, else ``AllocationError`` naming those that did not.
    Returns each answering host's info (hostname, pid, address) by name."""
    named = [h for h in hosts if h.address is not None]
    answers, missing = hello_workers(rt, [h.address for h in named], timeout)
    if missing:
        raise AllocationError(
            f"{what}: {len(missing)} of {len(named)} worker loops did not answer within {timeout:.0f}s: "
            + ", ".join(f"{h.name} ({h.address}{_why(missing[h.address])})" for h in named if h.address in missing)
            + ". Is `python -m monarch_core.worker` running there, and reachable from this host?"
        )
    return {h.name: answers[h.address] for h in named}


def _why(miss: tuple[str, Any]) -> str:
    kind, detail = miss
    if kind == "failed":
        return f"; {detail}"
    return f"; last error: {detail}" if detail is not None else ""


def hello_workers(rt: Any, addresses: list[str], timeout: float) -> tuple[dict[str, dict], dict[str, tuple[str, Any]]]:
    """Send ``host_hello`` to the worker loops at ``addresses`` and wait up
    to ``timeout`` s for all of them (caller's thread, never the kernel loop).

    Returns ``(answers, missing)``: each answering worker's info (hostname,
    pid, address) by address, and for each other one ``("silent", the
    kernel's last error for it or None)`` or ``("failed", the exception its
    answer carried)``.  When any is missing, the sessions the hellos opened are closed
    (the caller gives up on them all: none may keep reconnecting)."""
    from monarch_core._proc._port import OneReply
    from monarch_core._proc import _control as C
    from monarch_core._kernel import _wire as W
    from monarch_core._launch._spawn import host_proc_id

    kernel = rt.kernel
    waits = []
    for a in addresses:
        r = OneReply(kernel, "")
        r.proc_id = host_proc_id(a)
        waits.append((a, r.proc_id, r))

    async def say_hello() -> set[str]:
        # on the loop, so that the sessions the hellos open are known exactly
        opened = {hid for _a, hid, _r in waits if _live_session(kernel, hid) is None}
        for a, hid, r in waits:
            kernel.send(hid, a, W.K_CONTROL, 0,
                        C.encode(C.HostHello((rt.proc_id, kernel.address, r.port_id))), b"", [], r.port_id)
        return opened

    opened = kernel.run(say_hello)
    deadline = time.monotonic() + timeout
    answers: dict[str, dict] = {}
    missing: dict[str, tuple[str, Any]] = {}
    try:
        for a, hid, r in waits:
            if not r.cell.wait(max(0.0, deadline - time.monotonic())):
                missing[a] = ("silent", kernel.last_error(hid))
                continue
            try:
                answers[a] = r.cell.result()
            except Exception as e:  # noqa: BLE001
                missing[a] = ("failed", e)
    except BaseException:  # Ctrl-C while waiting: nothing of it may live on
        close_sessions(kernel, opened, "the wait for the worker loops was interrupted")
        raise
    if missing:
        close_sessions(kernel, opened, "the worker loops did not all answer: " + ", ".join(sorted(missing)))
    return answers, missing


def _live_session(kernel: Any, proc_id: str) -> Any:
    """The kernel's outbound session to ``proc_id`` if one runs (loop thread)."""
    out = kernel._outbound.get(proc_id)
    return out if out is not None and out.failed is None else None


def close_sessions(kernel: Any, proc_ids: set[str], why: str) -> None:
    """End the outbound sessions to ``proc_ids``: no more connection attempts,
    and whatever they still carry fails with ``ConnectError(why)``."""
    from monarch_core.errors import ConnectError

    async def close() -> None:
        for pid in proc_ids:
            out = _live_session(kernel, pid)
            if out is not None:
                out.fail(ConnectError(why))

    if proc_ids:
        try:
            kernel.run(close)
        except RuntimeError:  # the kernel is gone, and its sessions with it
            pass


#: Transports whose addresses cannot leave this machine.
_LOCAL_ONLY = ("ipc", "inproc")


def prepare_transport(scheduler: Any, request: Any) -> None:
    """Step 0 of the scheduler contract, before the client's runtime starts:
    enable ``scheduler.transport`` when the client enabled none (at
    ``scheduler.client_address(request)`` if it names one) and ask it for
    session credentials; a client already on a local-only transport gets a
    ``ConfigError`` that says what to call instead."""
    from monarch_core._proc import _transport
    from monarch_core._plugins import registry
    from monarch_core.hookspecs import SESSION_CREDENTIALS

    want = getattr(scheduler, "transport", None)
    if not want:
        return
    what = f"scheduler {scheduler.name or type(scheduler).__name__!r} ({request.source})"
    choice = _transport.enabled_choice()
    if choice is None:
        address = None
        pick = getattr(scheduler, "client_address", None)
        if pick is not None:
            try:
                address = pick(request)
            except (ConfigError, AllocationError):
                raise
            except Exception as e:  # noqa: BLE001 - a plugin's bug or an unreachable host
                raise AllocationError(f"{what} could not find this client's address: {type(e).__name__}: {e}") from e
        _transport.enable_transport(address or want)
        choice = _transport.enabled_choice()
        logger.info("%s: enabled transport %s for its hosts", what, address or want)
    elif choice.name in _LOCAL_ONLY and want not in _LOCAL_ONLY:
        raise ConfigError(
            f"{what} starts hosts on other machines, which need the {want!r} transport, but this process "
            f"already uses {choice.label} (it cannot leave this machine). Call "
            f"enable_transport({want!r}) (or a URL such as '{want}://<an address the hosts can reach>:0') "
            "before any other monarch call, or leave the transport to hosts_from_config"
        )
    if choice is not None and choice.name == want:
        registry().transport(want).set_credentials(ca=SESSION_CREDENTIALS)


def _scheme_of(transport: str) -> str:
    """The URL scheme of ``transport`` (its first; its name if it has none).
    (``transport_specs`` does not raise: a plugin's failing hook is left out.)"""
    from monarch_core._plugins import registry

    spec = registry().transport_specs().get(transport)
    return spec.schemes[0] if spec is not None and spec.schemes else transport


def _on_proc_stopped(why: str) -> None:
    """This process stops (``shutdown_context``, interpreter exit): give back
    every allocation it still holds, whatever stopping its meshes managed."""
    release_all()


def release_all(timeout: float | None = None) -> None:
    """Release every live allocation (interpreter exit, shutdown_context,
    SIGTERM), each within ``timeout`` s, in parallel; one whose host mesh
    was stopped is detached (``Allocation.detach``)."""
    with _live_lock:
        records = list(_live.values())
    threads = [threading.Thread(target=r.release, args=(timeout,), kwargs={"detach": r.stopped}, daemon=True)
               for r in records]
    for t in threads:
        t.start()
    limit = RELEASE_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + limit
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


_sigterm_installed = False


def _install_sigterm() -> None:
    """A client holding allocations turns SIGTERM into SystemExit (when nobody
    else handles it), so interpreter exit releases them."""
    global _sigterm_installed
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # pragma: no cover
        return
    _sigterm_installed = True


def _on_sigterm(signum: int, frame: Any) -> None:
    logger.warning("SIGTERM: releasing the allocated hosts and exiting")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(128 + signum)
