"""The ``inproc`` transport: connections between kernels of one process, over
socket pairs (tests, the conformance kit)."""

from __future__ import annotations

import itertools
import socket as _stdsocket

import trio

from monarch_core.errors import ConnectError, TransportError
from monarch_core.hookspecs import Listener, Stream, Transport
from monarch_core.streams import SocketStream


_inproc_listeners: dict[str, "_InprocListener"] = {}
_inproc_ids = itertools.count(1)


class _InprocListener(Listener):
    def __init__(self, name: str) -> None:
        self.address = f"inproc://{name}"
        self._name = name
        self._send, self._recv = trio.open_memory_channel[Stream](64)
        self._token = trio.lowlevel.current_trio_token()

    async def accept(self) -> Stream:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise TransportError(f"listener {self.address} is closed") from None

    async def aclose(self) -> None:
        _inproc_listeners.pop(self._name, None)
        await self._recv.aclose()


class InprocTransport(Transport):
    """Connections between kernels of one process (socket pairs)."""

    name = "inproc"

    def default_bind_spec(self) -> str:
        return f"inproc://kernel-{next(_inproc_ids)}"

    def normalize(self, url: str) -> str:
        if not url.startswith("inproc://") or len(url) == len("inproc://"):
            raise ValueError(f"malformed inproc address {url!r}; expected inproc://NAME")
        return url

    async def listen(self, bind_spec: str) -> Listener:
        name = self.normalize(bind_spec)[len("inproc://") :]
        if name in _inproc_listeners:
            raise TransportError(f"inproc address {bind_spec} is already bound in this process")
        lst = _InprocListener(name)
        _inproc_listeners[name] = lst
        return lst

    async def connect(self, address: str) -> Stream:
        name = address[len("inproc://") :]
        lst = _inproc_listeners.get(name)
        if lst is None:
            raise ConnectError(f"nothing listens on {address} in this process", refused=True)
        a, b = _stdsocket.socketpair(_stdsocket.AF_UNIX, _stdsocket.SOCK_STREAM)  # (trio makes them non-blocking)

        def hand_over() -> None:  # runs on the listener's trio loop
            try:
                lst._send.send_nowait(SocketStream(trio.socket.from_stdlib_socket(b), peer=f"inproc client of {name}"))
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                b.close()

        try:
            if trio.lowlevel.current_trio_token() is lst._token:
                hand_over()
            else:  # the listener lives in another trio run (another kernel thread)
                lst._token.run_sync_soon(hand_over)
        except trio.RunFinishedError:
            a.close()
            b.close()
            raise ConnectError(f"{address} is not accepting connections (its kernel has stopped)") from None
        return SocketStream(trio.socket.from_stdlib_socket(a), peer=address)
