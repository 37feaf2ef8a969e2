"""Helpers for transport authors: a :class:`~monarch_core.hookspecs.Stream`
over a trio socket, with errors mapped into :mod:`monarch_core.errors`.

``SocketStream`` reads large messages straight into their destination buffer
(``recv_into``) and writes with ``send`` on memoryviews, so a 64 MiB tensor is
not copied on its way through.
"""

from __future__ import annotations

import contextlib
import errno
import socket as _stdsocket
from typing import Any

import trio

from monarch_core.errors import ConnectionClosed, TransportError
from monarch_core.hookspecs import Listener, Stream

__all__ = ["SocketListener", "SocketStream"]

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)


class SocketStream(Stream):
    """A :class:`Stream` over a connected ``trio.socket`` socket."""

    def __init__(self, sock: Any, peer: str = "?") -> None:
        self._sock = sock
        self.peer = peer
        self._closed = False
        if sock.family in (_stdsocket.AF_INET, _stdsocket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(_stdsocket.IPPROTO_TCP, _stdsocket.TCP_NODELAY, 1)

    async def send_all(self, data: Any) -> None:
        if self._closed:
            raise ConnectionClosed(f"stream to {self.peer} is closed")
        mv = memoryview(data)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        try:
            with mv:
                total = len(mv)
                sent = 0
                send = self._sock.send
                while sent < total:
                    sent += await send(mv[sent:])
        except (*_CLOSED, OSError) as e:
            raise self._closed_error(e) from None

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        try:
            return await self._sock.recv(max_bytes)
        except (*_CLOSED, OSError) as e:
            raise self._closed_error(e) from None

    async def receive_into(self, buffer: memoryview) -> int:
        try:
            return await self._sock.recv_into(buffer)
        except (*_CLOSED, OSError) as e:
            raise self._closed_error(e) from None

    def raw_socket(self) -> _stdsocket.socket | None:
        """The stdlib socket under this stream (see :meth:`Stream.raw_socket`).

        A subclass that overrides ``send_all``, ``receive_some`` or
        ``receive_into`` (to frame, compress or encrypt) gets ``None``
        unless it overrides this method too."""
        cls = type(self)
        if cls is not SocketStream and any(
            getattr(cls, m) is not getattr(SocketStream, m) for m in ("send_all", "receive_some", "receive_into")
        ):
            return None
        sock = getattr(self._sock, "_sock", None)  # a trio socket's stdlib socket
        return sock if isinstance(sock, _stdsocket.socket) else None

    def _closed_error(self, e: BaseException) -> ConnectionClosed:
        if isinstance(e, OSError):
            return ConnectionClosed(f"connection to {self.peer} broke: {e.strerror or e}")
        return ConnectionClosed(f"connection to {self.peer} closed: {e}")

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._sock.close()
        await trio.lowlevel.checkpoint()


class SocketListener(Listener):
    """A :class:`Listener` over a bound, listening ``trio.socket`` socket."""

    def __init__(self, sock: Any, address: str) -> None:
        self._sock = sock
        self.address = address

    async def accept(self) -> Stream:
        while True:
            try:
                conn, addr = await self._sock.accept()
            except _CLOSED as e:
                raise TransportError(f"listener {self.address} is closed: {e}") from None
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await trio.sleep(0.1)  # out of descriptors: back off, keep listening
                    continue
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                raise TransportError(f"listener {self.address} failed: {e}") from None
            return SocketStream(conn, peer=_peer(addr, self.address))

    async def aclose(self) -> None:
        self._sock.close()
        await trio.lowlevel.checkpoint()


def _peer(addr: Any, local: str) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in str(host) else f"{host}:{addr[1]}"
    return f"peer of {local}"
