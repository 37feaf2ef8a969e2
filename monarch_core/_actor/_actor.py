"""The ``Actor`` base class."""

from __future__ import annotations

import logging
from typing import Any

from monarch_core._proc import _state
from monarch_core._mesh._shape import Extent, MeshTrait, Region


class Actor(MeshTrait):
    """Base class for actors.

    Subclass it and decorate the methods that form the actor's public API with
    ``@endpoint``.  Spawn with ``proc_mesh.spawn(name, MyActor, *args)``; the
    result is an actor mesh whose endpoints are called through the adverbs
    (``call``, ``call_one``, ``choose``, ``stream``, ``broadcast``).  Each actor
    handles one message at a time.  Optional hooks: ``__supervise__(self,
    failure)`` (handle a failure of a mesh this actor owns; truthy = handled)
    and ``__cleanup__(self, exc)`` (runs when the actor stops).

    Inside the actor, ``self`` is the real instance: ``self.method(...)`` calls
    the method directly, and the mesh-trait members describe the actor's own
    mesh.

    An endpoint may not be named like a member of the actor mesh
    (``size``, ``slice``, ``rename``, ``stop``, ``initialized``, ...): the
    mesh's own member would hide it.  Defining one raises ``TypeError`` when
    the class is created, naming the clash.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _refuse_hidden_endpoints(cls)

    @property
    def logger(self) -> logging.Logger:
        """A logger for user messages of this actor class (not under ``monarch.*``)."""
        cls = type(self)
        return logging.getLogger(f"{cls.__module__}.{cls.__qualname__}")

    @property
    def initialized(self) -> Any:
        return True

    # MeshTrait: an actor instance sees the mesh it belongs to.
    @property
    def _region(self) -> Region:
        host = _state.current_actor.get()
        if host is None or host.instance is not self:
            return Extent([], []).region
        return host.mesh_extent.region

    def _with_region(self, region: Region) -> Any:
        raise TypeError(
            "an actor instance cannot be sliced; slice the actor mesh returned by spawn() instead"
        )


def _refuse_hidden_endpoints(cls: type) -> None:
    """``TypeError`` if ``cls`` defines an endpoint that its actor mesh would
    hide behind one of its own members (``mesh.size`` is the mesh's size)."""
    from monarch_core._actor._actor_mesh import MESH_ATTRIBUTES
    from monarch_core._actor._endpoint import EndpointProperty

    for name, attr in cls.__dict__.items():
        if name in MESH_ATTRIBUTES and isinstance(attr, EndpointProperty):
            public = [n for n in sorted(MESH_ATTRIBUTES) if not n.startswith("_")]
            raise TypeError(
                f"endpoint {cls.__qualname__}.{name} is named like a member of the actor mesh: on the mesh "
                f"returned by spawn(), {name!r} is ActorMesh.{name}, so mesh.{name}.call(...) would never reach "
                f"the endpoint. Rename the endpoint (for example to {name + '_'!r} or {'get_' + name.lstrip('_')!r}). "
                f"Names an actor mesh keeps for itself: {', '.join(public)} (and names starting with '_' that "
                f"ActorMesh uses)."
            )
