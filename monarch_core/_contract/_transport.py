"""The transport seam of the plugin contract: byte-stream channels.

:class:`Stream`, :class:`Listener` and :class:`Transport` are what a transport
plugin implements; :func:`monarch_transports` yields :class:`TransportSpec`
descriptions of them.  :data:`TRUST_ALL` and :data:`SESSION_CREDENTIALS` are
the special ``ca=`` values of :meth:`Transport.set_credentials`.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from monarch_core._contract._common import _call_factory, hookspec

__all__ = [
    "Listener",
    "SESSION_CREDENTIALS",
    "Stream",
    "TRUST_ALL",
    "Transport",
    "TransportSpec",
    "monarch_transports",
]

#: The ``ca=`` value that means "authenticate nobody" (the reference API's);
#: :meth:`Transport.set_credentials` of a transport without authentication
#: accepts it, one that authenticates refuses it.
TRUST_ALL = "trust_all_connections"

#: The ``ca=`` value that asks an authenticating transport for *session*
#: credentials, unless the user configured credentials of their own: a
#: short-lived CA in this process's memory that signs this process's
#: certificate and, through :meth:`Transport.worker_credentials`, one for each
#: worker loop a scheduler starts.  The core passes it before the client's
#: runtime starts when a scheduler that declares :attr:`Scheduler.transport`
#: allocates hosts.  A transport without authentication ignores it.
SESSION_CREDENTIALS = "session"


class Stream(abc.ABC):
    """A reliable, ordered, bidirectional byte stream (one connection).

    The kernel puts framing, sequence numbers, acknowledgements and
    retransmission on top; a stream only moves bytes.  All methods are called
    from the kernel's trio loop.  Errors must be mapped to
    :class:`~monarch_core.errors.ConnectionClosed` (peer gone / broken) or
    :class:`~monarch_core.errors.TransportError`.
    """

    #: Human-readable description of the peer, for error messages and logs.
    peer: str = "?"

    #: True when the transport has established who the peer is (TLS with
    #: client certificates): the kernel then receives its large messages at
    #: their announced size from the first.  Otherwise (None: undeclared) the
    #: peer is proven by delivering a message, and until then the kernel's
    #: unproven-peer limits apply (``MONARCH_UNPROVEN_*``; a Unix socket whose
    #: peer runs as this user counts as authenticated).
    authenticated: bool | None = None

    @abc.abstractmethod
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte of ``data`` or raise ``ConnectionClosed``."""

    @abc.abstractmethod
    async def receive_some(self, max_bytes: int = 65536) -> bytes | bytearray:
        """Return at least one byte, or ``b""`` at end of stream."""

    async def receive_into(self, buffer: memoryview) -> int:
        """Fill a prefix of ``buffer``; return the count (0 at end of stream).

        Optional: the default copies from :meth:`receive_some`.  Transports
        that can read straight into ``buffer`` (``recv_into``) should override
        it so that large tensors are received without an extra copy.
        """
        data = await self.receive_some(len(buffer))
        n = len(data)
        buffer[:n] = data
        return n

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the stream.  Idempotent; never raises."""

    def raw_socket(self) -> Any:
        """The connected, non-blocking stdlib socket under this stream, or a
        *record layer* with a socket's interface, for the kernel's fast path
        -- or ``None`` (the default: the kernel uses the trio methods only).

        Optional.  Called once per connection, after the handshake; from
        then on the kernel reads and writes what it returns directly, from
        other threads (its poller, callers' threads), and calls
        :meth:`send_all`/:meth:`receive_into` too.

        * A ``socket.socket``: only when the bytes on it *are* the stream's
          bytes (no framing, compression or encryption of the stream's own).
        * A record layer (TLS: the tls transport's ``TlsSocket``): an object
          whose ``send``/``sendmsg``/``recv``/``recv_into`` carry the
          stream's plaintext with non-blocking socket semantics
          (``BlockingIOError``, ``0`` at the end), plus ``fileno``,
          ``shutdown``, ``getsockopt``/``setsockopt``, and two more: a
          ``pending()`` that is true when plaintext may be ready although
          the descriptor is not readable (the kernel reads again before it
          waits), and a ``pending_output()`` that counts bytes it accepted
          but has not sent yet (the kernel then calls :meth:`send_all`,
          which must send them).  Every method must be safe to call from
          several threads at once, and :meth:`send_all`/:meth:`receive_into`
          must go through the same layer.

        A compressing stream, or one that cannot meet this, returns ``None``.
        ``monarch_core.testing`` checks either kind.
        """
        return None


class Listener(abc.ABC):
    """Accepts incoming :class:`Stream` s on one bound address."""

    #: The URL other processes should dial to reach this listener.  For a bind
    #: spec with port 0 this holds the port actually bound.
    address: str = ""

    @abc.abstractmethod
    async def accept(self) -> Stream:
        """Wait for and return the next incoming connection.

        A connection that fails during accept-time work (a TLS handshake with a
        bad certificate, say) is logged and skipped, not raised: only a closed
        or broken listener raises (``TransportError``).
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop listening.  Idempotent; never raises."""


class Transport(abc.ABC):
    """One kind of channel, resolved once and then called directly.

    A transport knows how to parse and format its addresses, bind a listener
    and dial an address.  ``listen`` and ``connect`` run on the kernel's trio
    loop.
    """

    #: Canonical name, e.g. ``"ipc"``.
    name: str = ""

    @abc.abstractmethod
    def default_bind_spec(self) -> str:
        """A bind spec for a new proc when the user gave no explicit address,
        e.g. ``"ipc://@monarch-<random>"`` or ``"tcp://myhost:0"``."""

    def normalize(self, url: str) -> str:
        """Validate ``url`` (one of this transport's schemes) and return its
        canonical form; raise ``ValueError`` naming the accepted forms."""
        return url

    def child_bind_spec(self, parent_address: str) -> str:
        """The bind spec for a proc spawned by a process that listens at
        ``parent_address`` (default: :meth:`default_bind_spec`).  TCP uses it
        so that child procs advertise the same routable host as their parent."""
        return self.default_bind_spec()

    @abc.abstractmethod
    async def listen(self, bind_spec: str) -> Listener:
        """Bind ``bind_spec`` and return a listener (``TransportError`` on failure)."""

    @abc.abstractmethod
    async def connect(self, address: str) -> Stream:
        """Dial ``address`` (``ConnectError`` naming it on failure).

        When the peer's machine answers that nothing listens there
        (``ECONNREFUSED``, a missing Unix socket), raise
        ``ConnectError(..., refused=True)``: a few refusals after a
        connection broke tell the kernel that the proc is gone, not merely
        unreachable (which retries until the delivery timeout)."""

    def set_credentials(self, *, ca: str | None = None, cert: str | None = None, key: str | None = None) -> None:
        """Use these credentials in this process (optional).

        The core calls it with what the user passed to
        ``attach_to_workers(ca=, private_key=, cert=)`` or
        ``run_worker_loop_forever(...)`` (``--ca/--key/--cert``), before the
        transport listens or dials; each value is a file path or inline PEM,
        or ``None`` (not given: keep the transport's own default source,
        e.g. environment variables).  Raise ``ValueError``/``TypeError``/
        ``FileNotFoundError`` naming the bad argument.  The default accepts
        no credentials: it allows only ``ca="trust_all_connections"`` (the
        reference API's "no authentication") and ``ca=SESSION_CREDENTIALS``
        (nothing to make), and raises ``ValueError`` otherwise.

        ``ca=SESSION_CREDENTIALS`` (:data:`SESSION_CREDENTIALS`): make
        credentials for this session if none are configured (``tls`` does,
        see ``docs/transports.md``); configured ones win.
        """
        if cert is None and key is None and ca in (None, TRUST_ALL, SESSION_CREDENTIALS):
            return
        raise ValueError(
            f"the {self.name or type(self).__name__} transport takes no credentials (ca=, private_key=, cert=); "
            "use a transport that authenticates, such as tls://"
        )

    def prepare(self) -> None:
        """Build now what every connection of this process will need, e.g.
        TLS contexts from the credentials in effect (optional; default:
        nothing).

        A fork server calls it once, after its imports and before it forks
        any proc, so that the procs inherit the result instead of each
        building it again.  It must not raise for missing or unusable
        credentials, and must not make credentials of its own: a proc that
        uses the transport reports those problems itself.
        """

    def child_env(self, *, portable: bool = False) -> Mapping[str, str]:
        """Environment variables a process started by this one needs to use
        this transport as this process does, e.g. its credentials (optional;
        default: none).

        The core adds them to the environment of every proc this process
        starts (under the ``BootstrapCommand`` overrides and the
        ``monarch_proc_env`` results) and, with ``portable=True``, puts them
        in :attr:`WorkerLaunch.credentials` for the worker loops a scheduler
        starts, possibly on other hosts: then no value may name a file of
        this host (inline PEM instead).  The values hold secrets: never log
        them.
        """
        return {}

    def worker_credentials(self, host: str) -> Mapping[str, str]:
        """Environment variables for one worker loop that will listen on
        ``host`` (the name or address passed to :meth:`WorkerLaunch.command`),
        possibly on another machine: what it needs to accept this process
        and be accepted by it (optional).

        The default is ``child_env(portable=True)``: every worker gets this
        process's own credentials.  ``tls`` with session credentials
        (:data:`SESSION_CREDENTIALS`) instead issues a key and certificate
        for that worker alone, valid for ``host``.  Schedulers call it through
        :meth:`WorkerLaunch.credentials_for`.  The values hold secrets: pass
        them over the scheduler's own channel (an SSH session's stdin, a file
        only the job's user can read), never on a command line.
        """
        return self.child_env(portable=True)


@dataclasses.dataclass(frozen=True)
class TransportSpec:
    """What :func:`monarch_transports` returns: a transport's description.

    ``factory`` is either a zero-argument callable returning a
    :class:`Transport`, or a ``"module:attribute"`` string imported only when
    the transport is first used, so that listing plugins stays cheap.
    """

    name: str
    schemes: tuple[str, ...]
    factory: Callable[[], Transport] | str
    description: str = ""
    #: Other names accepted by ``enable_transport`` (``"unix"`` for ``"ipc"``).
    aliases: tuple[str, ...] = ()

    def load(self) -> Transport:
        """Import (if needed) and call the factory."""
        return _call_factory(self.factory)


@hookspec
def monarch_transports() -> Sequence[TransportSpec]:
    """Describe the transports this plugin provides.

    Called once, the first time a transport is resolved (``enable_transport``,
    the first mesh, ``monarch plugins``).  Return a sequence of
    :class:`TransportSpec`; every plugin's results are collected.  A scheme
    claimed by two plugins goes to the one registered first (built-ins first,
    then entry points in name order), and the clash is logged.

    Complete example -- a transport over Unix sockets in a directory (it
    passes ``monarch_core.testing.check_transport``; the project's tests run
    this code)::

        # my_transport/plugin.py
        import errno, os, uuid
        import trio
        from monarch_core.hookspecs import (
            Listener, Stream, Transport, TransportSpec, hookimpl)
        from monarch_core.errors import ConnectError, ConnectionClosed, TransportError

        _BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

        class _S(Stream):
            def __init__(self, s, peer): self._s, self.peer = s, peer
            async def send_all(self, data):
                try: await self._s.send_all(data)
                except _BROKEN as e: raise ConnectionClosed(f"{self.peer}: {e}") from None
            async def receive_some(self, max_bytes=65536):
                try: return await self._s.receive_some(max_bytes)
                except _BROKEN as e: raise ConnectionClosed(f"{self.peer}: {e}") from None
            async def aclose(self): await self._s.aclose()

        class _L(Listener):
            def __init__(self, lst, address, path):
                self._l, self.address, self._path = lst, address, path
            async def accept(self):
                try: return _S(await self._l.accept(), f"client of {self.address}")
                except _BROKEN as e: raise TransportError(f"{self.address}: {e}") from None
            async def aclose(self):
                path, self._path = self._path, None
                if path is not None:
                    try: os.unlink(path)          # leave no socket file behind
                    except OSError: pass
                await self._l.aclose()

        class DirTransport(Transport):
            name = "dir"
            def default_bind_spec(self):
                return f"dir:///tmp/monarch-{uuid.uuid4().hex}"
            def normalize(self, url):
                if not url.startswith("dir:///") or "\\0" in url:
                    raise ValueError(f"malformed dir address {url!r}; expected dir:///absolute/path")
                return url
            async def listen(self, spec):
                path = self.normalize(spec)[len("dir://"):]
                sock = trio.socket.socket(trio.socket.AF_UNIX)
                try:
                    await sock.bind(path); sock.listen()
                except OSError as e:
                    sock.close()
                    raise TransportError(f"cannot listen on {spec}: {e}") from None
                return _L(trio.SocketListener(sock), spec, path)
            async def connect(self, address):
                path = self.normalize(address)[len("dir://"):]
                try: return _S(await trio.open_unix_socket(path), address)
                except OSError as e:  # refused: nothing listens there (the kernel counts these)
                    raise ConnectError(f"cannot connect to {address}: {e}",
                                       refused=e.errno in (errno.ECONNREFUSED, errno.ENOENT)) from None

        @hookimpl
        def monarch_transports():
            return [TransportSpec(name="dir", schemes=("dir",),
                                  factory="my_transport.plugin:DirTransport",
                                  description="Unix sockets in a directory")]

    and in ``pyproject.toml``::

        [project.entry-points.monarch]
        dir = "my_transport.plugin"

    after which ``enable_transport("dir")`` and ``enable_transport("dir:///tmp/x")``
    select it.  Test it with the conformance kit::

        import trio
        from monarch_core.testing import check_transport
        from my_transport.plugin import DirTransport

        def test_dir_transport_conforms():
            trio.run(check_transport, DirTransport())

    ``docs/plugin-authors.md`` (section "A transport") states the rest of
    the contract: ``child_bind_spec``, ``ConnectError(refused=True)``,
    cancellation and concurrency of ``send_all``, and the
    :meth:`Stream.raw_socket` fast path.
    """
