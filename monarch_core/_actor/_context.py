"""The context API: who is running, and for which message."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

from monarch_core._actor._mesh import this_proc
from monarch_core._launch import _start
from monarch_core._proc import _state
from monarch_core._mesh._shape import Point


def _this_proc(_instance: Any) -> Any:
    """``proc`` of an actor or client instance: the ``ProcMesh`` of the proc it runs on."""
    return this_proc()


class ClientInstance:
    """``context().actor_instance`` outside any actor: the root client."""

    name = "client"
    class_name = "client"

    def __init__(self, rt: _state.ProcRuntime) -> None:
        self.proc_id = rt.proc_id
        self.rank = rt.point
        self.actor_id = f"{rt.proc_id}.{rt.name}"
        self.display_name = rt.name

    proc = property(_this_proc)

    def __repr__(self) -> str:
        return f"<{self.name} on {self.proc_id}>"


class ActorInstance:
    """``context().actor_instance`` inside an actor: the running actor's
    ``name``, ``rank`` (its ``Point`` in its mesh), ``actor_id``,
    ``proc_id``, ``key``, ``class_name``, ``display_name``... (those of the
    runtime's actor host, read through), ``proc``: the ``ProcMesh`` of
    the proc it runs on, and :meth:`stop`."""

    __slots__ = ("_host", "__weakref__")

    def __init__(self, host: Any) -> None:
        self._host = host

    proc = property(_this_proc)

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor gracefully, as the reference's ``Instance.stop``:
        it finishes the message it is handling (this call returns at once),
        then the messages already queued for it, and stops (its cleanup runs,
        the meshes it owns stop); later messages are refused as by a stopped
        actor.  An actor stopping itself when its work is done is a normal
        end, not a failure: no supervision event reaches its owner.  Stopping
        again, or stopping an actor already stopping, does nothing more."""
        self._host.request_stop(reason or "stopped itself (actor_instance.stop())", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorInstance) and other._host is self._host

    def __hash__(self) -> int:
        return id(self._host)

    def __repr__(self) -> str:
        return repr(self._host)


#: actor host -> its ActorInstance (made once per actor).
_views: weakref.WeakKeyDictionary[Any, ActorInstance] = weakref.WeakKeyDictionary()


def _instance(host: Any) -> ActorInstance:
    view = _views.get(host)
    if view is None:
        view = _views[host] = ActorInstance(host)
    return view


@dataclasses.dataclass(eq=False, slots=True)
class Context:
    """What ``context()`` returns: ``actor_instance`` (the running actor: its
    ``rank``, ``actor_id``, ``name``, ``proc``) and ``message_rank`` (the
    current message's ``Point`` within the cast that delivered it)."""

    actor_instance: Any
    message_rank: Point


def context() -> Context:
    """The Context of the running actor; on the client, the root client context."""
    host = _state.current_actor.get()
    if host is not None:
        rank = _state.current_message_rank.get()
        return Context(_instance(host), host.rank if rank is None else rank)
    _start.ensure_runtime()
    rt = _state.current()
    inst = rt.caches.get("client_instance")
    if inst is None:
        inst = rt.caches["client_instance"] = ClientInstance(rt)
    return Context(inst, rt.point)


def current_rank() -> Point:
    """The current message's position within its mesh, as a ``Point``."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """Size of each dimension of the mesh that received the current message."""
    return dict(context().message_rank.extent.as_dict())


def current_actor_name() -> str:
    """The actor id of the running actor, as a string (``"client"`` ... on the client)."""
    return str(context().actor_instance.actor_id)
