"""Controllers: the program-wide singleton actors of ``get_or_spawn_controller``, spawned on the root client."""

from __future__ import annotations

from typing import Any, TypeVar

from monarch_core._launch import _start
from monarch_core._proc import _send, _serial, _state
from monarch_core._actor._actor import Actor
from monarch_core._actor._actor_mesh import ActorMesh
from monarch_core._actor._endpoint import _map_future
from monarch_core._proc._future import Future
from monarch_core._actor._mesh_base import _EMPTY_REGION, _ProcSlot
from monarch_core._proc._port import OneReply
from monarch_core._proc import _control as C

T = TypeVar("T")


def get_or_spawn_controller(name: str, Class: type[T], *args: Any, **kwargs: Any) -> Future[T]:
    """The singleton actor ``name`` for the whole program, spawned (on the
    root client's process) from ``Class(*args, **kwargs)`` the first time.
    Works from the client and from inside actors."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"get_or_spawn_controller(name, ...): name must be a non-empty str, got {name!r}")
    if not (isinstance(Class, type) and issubclass(Class, Actor)):
        raise ValueError(
            f"get_or_spawn_controller({name!r}, {getattr(Class, '__name__', Class)!r}): the class must subclass Actor"
        )
    payload, bufs = _serial.dumps_spawn(Class, args, kwargs)
    _start.ensure_runtime()
    rt = _state.current()
    kernel = rt.kernel
    h = OneReply(kernel, "")
    reply = (rt.proc_id, kernel.address, h.port_id)
    root_id, root_addr = rt.root
    h.proc_id = root_id
    _send.control(kernel, root_id, root_addr, C.Controller(name, reply), payload, bufs, h.port_id)

    def build(ref: Any) -> Any:
        key, proc_id, address = ref
        ready = Future._resolved(True)._ensure()
        return ActorMesh(Class, name, key, [_ProcSlot(proc_id, address)], _EMPTY_REGION, None, ready, False)

    return _map_future(Future._of(h.cell), build)
