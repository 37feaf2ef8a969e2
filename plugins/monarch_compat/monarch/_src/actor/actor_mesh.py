"""The reference's ``monarch._src.actor.actor_mesh`` names its examples import:
``monarch_core.actor``'s ``Channel``, ``Port``, ``PortReceiver``, ``Actor``,
``ValueMesh``, ``context`` and the ``ActorMesh`` class (what ``spawn``
returns)."""

from __future__ import annotations

from monarch_core.actor import Actor, ActorMesh, Channel, Port, PortReceiver, ValueMesh, context

__all__ = ["Actor", "ActorMesh", "Channel", "Port", "PortReceiver", "ValueMesh", "context"]
