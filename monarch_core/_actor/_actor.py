"""The ``Actor`` base class."""

from __future__ import annotations

import logging
from typing import Any

from monarch_core._actor import _state
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
    """

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
