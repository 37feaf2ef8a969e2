"""The RDMA service's messages: port messages of plain ``marshal`` tuples.

Requests go to the owner proc's service port (``_service.Service``) with a
reply reference ``(proc_id, address, port_id)`` and a tag; the reply is a port
message to that reference with the tag as its rank and :data:`OK` or
:data:`ERR` as its status (an ``ERR`` payload is ``marshal((kind, message))``)::

    ("r", id, key, offset, nbytes, reply, tag)             -> OK, buffers=[the bytes]
    ("w", id, key, offset, nbytes, reply, tag) + [bytes]    -> OK
    ("d", id, key, reply, tag)                              -> OK (drop; unknown ids too)
    ("x", backend, request, reply, tag)                     -> OK, marshal(answer) (a backend's exchange)
"""

from __future__ import annotations

import marshal
import threading
import time
from typing import Any

from monarch_core import runtime
from monarch_core.runtime import Cell, PortHandler
from monarch_core.errors import RDMAError, SupervisionError

OK, ERR = 0, 1
E_RDMA, E_VALUE = "rdma", "value"

#: This process's service port, once started (``_service.service()``).
service_port: int | None = None


def set_service_port(port_id: int) -> None:
    """Record the port of this proc's RDMA service (``_service.Service``)."""
    global service_port
    service_port = port_id


def reply(ref: tuple, tag: int, status: int, payload: bytes, buffers: list | None = None) -> None:
    """Send a reply to ``ref = (proc_id, address, port_id)`` with ``tag`` as its rank."""
    proc_id, address, port = ref
    runtime.send_to_port(proc_id, address, port, payload, buffers, rank=tag, status=status)


def error(ref: tuple, tag: int, kind: str, message: str) -> None:
    reply(ref, tag, ERR, marshal.dumps((kind, message)))


def raise_error(payload: Any, what: str) -> None:
    """Raise the error of an ``ERR`` reply."""
    try:
        kind, message = marshal.loads(bytes(payload))
    except Exception:  # noqa: BLE001
        kind, message = E_RDMA, "the owner's RDMA service sent an undecodable error"
    if kind == E_VALUE:
        raise ValueError(f"{what}: {message}")
    raise RDMAError(f"{what}: {message}")


class _OneShot(PortHandler):
    __slots__ = ("cell", "port_id", "proc_id")

    def __init__(self, proc_id: str) -> None:
        self.cell = Cell()
        self.proc_id = proc_id
        self.port_id = runtime.open_port(self)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.done()
        self.cell.set_result((status, payload, buffers))

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        self.done()
        self.cell.set_exception(exc)

    def done(self) -> None:
        runtime.close_port(self.port_id, self.proc_id)


def call(info: tuple, request: tuple, what: str, timeout: float) -> tuple[Any, list]:
    """Send ``request + (reply, tag)`` to the service of owner ``info`` and wait
    for the reply: ``(payload, buffers)`` of an ``OK``; raises the error of
    an ``ERR``, ``SupervisionError`` if the owner proc dies, ``TimeoutError``."""
    proc_id, address, port = info[0], info[1], info[2]
    h = _OneShot(proc_id)
    ref = (*runtime.local_ref(), h.port_id)
    runtime.send_to_port(proc_id, address, port, marshal.dumps(request + (ref, 0)), reply_port=h.port_id)
    if not h.cell.wait(timeout):
        h.done()
        raise TimeoutError(f"{what}: the owner proc {proc_id} did not answer within {timeout:g} s")
    try:
        status, payload, buffers = h.cell.result()
    except SupervisionError as e:
        raise SupervisionError(f"{what}: the owner proc is gone: {e}") from None
    if status != OK:
        raise_error(payload, what)
    return payload, buffers


def send_request(info: tuple, request: tuple, what: str, timeout: float, *, gone_ok: bool = False) -> Cell:
    """Send ``request`` now; the returned cell resolves with ``None`` on an
    ``OK``, or the error (``TimeoutError`` after ``timeout`` s).  ``gone_ok``:
    the owner proc's death counts as success (a drop: the registration went
    with it)."""
    proc_id, address, port = info[0], info[1], info[2]
    h = _OneShot(proc_id)
    out = Cell()

    def settle() -> None:
        try:
            status, payload, _ = h.cell.result()
            if status != OK:
                raise_error(payload, what)
        except SupervisionError as e:
            if gone_ok:
                out.set_result(None)
            else:
                out.set_exception(SupervisionError(f"{what}: the owner proc is gone: {e}"))
        except BaseException as e:  # noqa: BLE001 - the request's outcome
            out.set_exception(e)
        else:
            out.set_result(None)

    if not h.cell.add_callback(settle):
        settle()
    ref = (*runtime.local_ref(), h.port_id)
    runtime.send_to_port(proc_id, address, port, marshal.dumps(request + (ref, 0)), reply_port=h.port_id)

    def expire() -> None:
        if not h.cell.done():
            h.done()
            h.cell.set_exception(TimeoutError(f"{what}: the owner proc {proc_id} did not answer within {timeout:g} s"))

    t = threading.Timer(timeout, expire)
    t.daemon = True
    t.start()
    out.add_callback(t.cancel)
    return out


def exchange(info: tuple, backend: str, request: Any, timeout: float = 30.0) -> Any:
    """A backend's connection request to its ``accept`` in owner ``info``."""
    payload, _ = call(info, ("x", backend, dict(request)), f"connecting {backend} to {info[0]}", timeout)
    return marshal.loads(bytes(payload))


def now() -> float:
    return time.monotonic()
