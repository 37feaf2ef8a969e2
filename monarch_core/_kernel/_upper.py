"""What the kernel needs from the layers around it, as typed protocols.

The kernel sits below the actor layer and never imports it (the layers
contract in ``pyproject.toml`` checks this).  It reaches the layer above only
through the protocols defined here, which that layer implements:

- :class:`ProcAgentProtocol`: the proc agent (``_proc._agent.ProcAgent``,
  ``_launch._worker.WorkerLoopAgent``) that the kernel hands control messages
  and messages for actors it does not know;
- :class:`MailboxProtocol`: an actor's mailbox (``_proc._host.ActorHost``),
  what ``Kernel.actors`` maps actor ids to.

:class:`InboundKernel` is the part of ``Kernel`` that the inbound poller
(``_inbound.py``, ``_poller.py``) call, so that they need not import ``_runtime``
(which imports it): the dependency inside the kernel is one-way.  (This
module imports nothing of the kernel, so its types stay loose there.)
"""

from __future__ import annotations

from typing import Any, Callable, Protocol


class MailboxProtocol(Protocol):
    """An actor the kernel routes messages to (``Kernel.actors[actor_id]``).

    The kernel checks only an actor message's key (``h[0]``, a str, which it
    routes on); the header's other fields are the actor layer's, and so is
    their shape.  :meth:`enqueue` and :meth:`ProcAgentProtocol.no_such_actor`,
    where an actor message enters that layer, check it before they take the
    message: a header of the wrong shape raises
    :class:`~monarch_core.errors.ProtocolError` naming ``sender``, which the
    kernel lets through to the reader of the connection that carried it (that
    connection is dropped)."""

    def enqueue(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """Queue one message (its decoded actor header: 9 fields, a traced
        call's context as a tenth); any thread, must not block.  Raises
        ``ProtocolError`` for a header of the wrong shape (see above)."""


class ProcAgentProtocol(Protocol):
    """The proc agent (``Kernel.agent``)."""

    #: a worker loop's agent (``_launch._worker.WorkerLoopAgent``): the procs this
    #: process starts tell it where they listen (the launch layer reads it)
    is_host: bool

    def handle_control(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """Handle one control message (``h[0]`` is the op name; ``_control.decode(h)`` its message); on the kernel loop."""

    def forward_tree(self, kernel: Any, header: bytes, payload: Any, buffers: list, sender: str) -> None:
        """Forward a cast-tree message this proc is on the way of (and deliver
        its own part); on the thread that read it (``_proc._tree.forward``)."""

    def no_such_actor(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """An actor message for an actor this proc does not (yet) run; any
        thread.  Raises ``ProtocolError`` for a header of the wrong shape, as
        :meth:`MailboxProtocol.enqueue` does."""


class InboundKernel(Protocol):
    """The kernel as the inbound poller sees it."""

    def route(self, kind: int, flags: int, header: bytes, payload: Any, buffers: list, sender: str) -> None: ...

    def call_soon(self, fn: Callable, *args: Any) -> None: ...

    def end_session(self, session: str, fence: Any) -> None: ...

    def acks_at_once(self, sender: str) -> bool: ...

    def inbound_poller(self) -> Any: ...  # the ``_poller.Poller``
