"""Where procs listen: the kernel's address book (:class:`AddressBook`).

A ``Kernel`` (``_runtime``) holds one.  It maps proc ids to the address each
listens on (learned from spawns, from the messages sent to a proc with its
address, and from the handshakes of procs that open sessions to this one),
lets an outbound session wait for an address that is announced but not yet
known, and resolves the transport of each address scheme once, so that no
plugin hook is called on the per-message path.
"""

from __future__ import annotations

from collections.abc import Container

import trio

from monarch_core.hookspecs import Transport


class AddressBook:
    """Proc id -> address, with waiters for addresses still to come.

    Written on the kernel's loop thread (:meth:`learn`, :meth:`expect`,
    :meth:`give_up`, :meth:`wait`); :attr:`addresses` and
    :meth:`transport_for` may be read from any thread."""

    def __init__(self, dead: Container[str]) -> None:
        """``dead``: the procs known to be gone (the kernel's ``dead`` table,
        read, never written): :meth:`wait` for one of them returns None."""
        #: proc id -> the address it listens on
        self.addresses: dict[str, str] = {}
        self._events: dict[str, trio.Event] = {}  # procs waited for, whose address is not known yet
        self._transports: dict[str, Transport] = {}  # address scheme -> its transport
        self._dead = dead

    def transport_for(self, address: str) -> Transport:
        """The transport of ``address``'s scheme (resolved through the plugin
        registry on first use, then cached; any thread)."""
        scheme = address.split("://", 1)[0]
        t = self._transports.get(scheme)
        if t is None:
            from monarch_core._plugins import registry

            t = registry().transport(scheme)
            self._transports[scheme] = t
        return t

    def learn(self, proc_id: str, address: str) -> None:
        """Record where ``proc_id`` listens and wake whoever waits for it."""
        self.addresses[proc_id] = address
        ev = self._events.pop(proc_id, None)
        if ev is not None:
            ev.set()

    def expect(self, proc_id: str) -> None:
        """Declare a proc whose address will be learned later: :meth:`wait`
        for it waits instead of failing (sessions to it do not dial yet)."""
        if proc_id not in self.addresses and proc_id not in self._events:
            self._events[proc_id] = trio.Event()

    def give_up(self, proc_id: str) -> None:
        """``proc_id`` is gone: wake whoever waits for its address (they
        find it in ``dead`` and get None)."""
        ev = self._events.pop(proc_id, None)
        if ev is not None:
            ev.set()

    async def wait(self, proc_id: str) -> str | None:
        """The address of ``proc_id`` once it is known, or None once the proc
        is dead (loop thread).  No timeout of its own: the wait ends when the
        address is learned (:meth:`learn`) or the proc is declared dead
        (:meth:`give_up`), or when the caller's cancel scope ends it."""
        while True:
            a = self.addresses.get(proc_id)
            if a is not None:
                return a
            if proc_id in self._dead:
                return None
            ev = self._events.get(proc_id)
            if ev is None:
                ev = self._events[proc_id] = trio.Event()
            await ev.wait()
