"""The exception tree of monarch-core, in one place.

Every error the framework raises on purpose derives from :class:`MonarchError`,
except where the contract of the reference API names a builtin
(``ValueError`` for ``call_one`` on many actors, ``TypeError`` for bad endpoint
arguments, ``IndexError``/``TypeError`` for bad slicing, ``TimeoutError`` for
``Future.get(timeout=...)``, ``RuntimeError`` for lifecycle misuse)::

    Exception
    ├── ActorError                       a remote endpoint, __init__ or proc bootstrap raised (user code)
    ├── MonarchError
    │   ├── PluginError                  an unknown or broken plugin name
    │   │   ├── UnknownTransportError    (also a ValueError)
    │   │   └── UnknownSchedulerError    (also a ValueError)
    │   ├── ConfigError                  hosts_from_config problems (also a ValueError)
    │   ├── AllocationError              a scheduler could not provide ready hosts
    │   │   └── SlurmCommandError        monarch-scheduler-slurm: a Slurm command failed
    │   ├── TransportError               a channel could not be opened / broke
    │   │   ├── ConnectError             could not reach an address
    │   │   ├── ConnectionClosed         the peer went away
    │   │   │   └── AuthenticationError  the peer failed authentication (TLS)
    │   │   └── ProtocolError            malformed frame or handshake
    │   ├── UndeliverableMessageError    a message could not be delivered
    │   ├── SupervisionError             an actor or proc this caller depends on failed
    │   ├── RDMAError                    a buffer transfer or registration failed (monarch_core.rdma)
    │   ├── TensorEngineError            monarch-tensor-engine (monarch_tensor_engine._protocol)
    │   │   ├── TensorOpError            an op on a distributed tensor failed on a proc (also a RuntimeError)
    │   │   ├── MeshMismatch             a tensor of one mesh used inside another (also a RuntimeError)
    │   │   └── MemberDied               a collective's group lost a member, on the procs (also a RuntimeError)
    │   ├── ScriptError                  monarch-spmd: a rank's script failed (also a RuntimeError)
    │   ├── JobFailed                    monarch-spmd: a launch whose ranks did not all succeed (also a RuntimeError)
    │   └── DebuggerError                monarch-debugger (monarch_debugger._errors): monarch debug's errors
    │       ├── RankSpecError            a bad attach/cast rank argument (also a ValueError)
    │       ├── CommandError             the debug server refused a command
    │       ├── Disconnected             the debug server went away
    │       └── CliError                 a problem monarch debug reports and exits on
    └── (builtins named by the API contract)

Plugins map their library exceptions (``OSError``, ``trio.BrokenResourceError``,
``ssl.SSLError``, ``paramiko.SSHException`` ...) into this tree at the plugin
boundary; nothing from a third-party library escapes to user code.
"""

from __future__ import annotations

__all__ = [
    "ActorError",
    "AllocationError",
    "AuthenticationError",
    "ConfigError",
    "ConnectError",
    "ConnectionClosed",
    "EndpointDefinitionError",
    "MonarchError",
    "PluginError",
    "ProtocolError",
    "RDMAError",
    "SupervisionError",
    "TransportError",
    "UndeliverableMessageError",
    "UnknownSchedulerError",
    "UnknownTransportError",
]


class MonarchError(Exception):
    """Base class of the errors monarch-core raises on purpose."""


class PluginError(MonarchError):
    """A plugin could not be found, loaded, or used."""


class UnknownTransportError(PluginError, ValueError):
    """No installed plugin provides the requested transport."""


class UnknownSchedulerError(PluginError, ValueError):
    """No installed plugin provides the requested scheduler."""


class ConfigError(MonarchError, ValueError):
    """The project configuration (``monarch.toml`` / ``[tool.monarch]``) is missing,
    malformed, or does not define what was asked for.  The message names the file."""


class EndpointDefinitionError(MonarchError, TypeError, ValueError):
    """An endpoint decorator applied where it cannot work (``@concurrent_endpoint``
    on a synchronous method).  Both a ``TypeError`` and a ``ValueError``:
    torchmonarch 0.7.0 raises the latter, and code catches either."""


class AllocationError(MonarchError):
    """A scheduler could not provide hosts whose worker loops answer.

    Raised by ``hosts_from_config`` (and ``monarch_core.testing.check_scheduler``)
    when ``Scheduler.allocate`` fails or takes longer than its timeout, when
    the allocation it returns is malformed (no hosts, an extent that does not
    match them, a transport other than the client's), or when worker loops do
    not answer in time.  The message names the scheduler, the configuration
    entry and the hosts concerned; whatever was allocated has been released.
    """


class TransportError(MonarchError):
    """A channel could not be opened, or broke while in use."""


class ConnectError(TransportError):
    """The address could not be reached (refused, unreachable, timed out).

    ``refused`` is True when the peer's machine answered that nothing listens
    there (``ECONNREFUSED``, or a missing Unix socket): the kernel then knows the
    proc is gone rather than temporarily unreachable."""

    def __init__(self, message: str = "", *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class ConnectionClosed(TransportError):
    """The peer closed the connection, or it broke."""


class AuthenticationError(ConnectionClosed):
    """The peer failed authentication (e.g. its TLS certificate is missing,
    expired, or not signed by the configured CA)."""


class ProtocolError(TransportError):
    """The peer sent bytes that are not a valid monarch frame or handshake."""


class UndeliverableMessageError(MonarchError):
    """A message could not be delivered to its destination.

    The message names the destination and why (the proc is gone, the actor was
    stopped, no acknowledgement within the delivery timeout); for a call, the
    call first, as for :class:`SupervisionError`.
    """


class SupervisionError(MonarchError):
    """An actor or proc that the caller depends on has failed.

    Raised by calls whose destination died (process exit, signal, actor
    failure), was stopped, or belongs to an actor mesh that has already
    failed.  The text starts with the call (adverb, endpoint, actor mesh and
    class, each rank concerned with its coordinates, proc and host), then
    says why; for a cascade, the chain from the first failure up.
    """


class ActorError(Exception):
    """Deterministic problem with the user's code in a remote endpoint.

    ``exception`` is the exception the endpoint raised (reconstructed on the
    caller's side when it could be pickled, otherwise a ``RuntimeError`` carrying
    its text).  ``str()`` holds the message, where it failed and the remote
    traceback.  Where it failed, as far as known (``None`` otherwise):
    ``actor`` (the actor mesh's name and the actor's coordinates, e.g.
    ``"trainers{'gpus': 1/4}"``), ``endpoint``, ``actor_class`` (the class's
    qualified name), ``proc`` (the proc, by the names the user gave) and
    ``host`` (the machine the proc ran on).
    """

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        *,
        remote_traceback: str | None = None,
        actor: str | None = None,
        endpoint: str | None = None,
        actor_class: str | None = None,
        proc: str | None = None,
        host: str | None = None,
    ) -> None:
        self.exception = exception
        self.message = message
        self.remote_traceback = remote_traceback
        self.actor = actor
        self.endpoint = endpoint
        self.actor_class = actor_class
        self.proc = proc
        self.host = host
        super().__init__(exception, message)

    def where(self) -> str:
        """Where it failed, in words (empty when nothing is known):
        ``"actor trainers{'gpus': 1/4} (class Trainer), endpoint step, on proc
        procs0{'gpus': 1/4} on host node7"``."""
        parts = []
        if self.actor:
            parts.append(f"actor {self.actor}" + (f" (class {self.actor_class})" if self.actor_class else ""))
        if self.endpoint:
            parts.append(f"endpoint {self.endpoint}")
        if self.proc:
            on = f"on {self.proc}" if self.proc.startswith("proc") else f"on proc {self.proc}"
            if self.host and f"on host {self.host}" not in on:
                on += f" on host {self.host}"
            parts.append(on)
        elif self.host:
            parts.append(f"on host {self.host}")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        where = f" ({where})" if where else ""
        tb = self.remote_traceback
        if tb is None:
            tb = f"{type(self.exception).__name__}: {self.exception}\n"
        return (
            f"{self.message}{where}\n"
            f" Traceback of where the remote call failed (most recent call last):\n{tb}"
        ).rstrip("\n")

    def __reduce__(self):  # keep keyword-only fields across pickling
        return (
            _rebuild_actor_error,
            (self.exception, self.message, self.remote_traceback, self.actor, self.endpoint,
             self.actor_class, self.proc, self.host),
        )


def _rebuild_actor_error(exception, message, tb, actor, endpoint, actor_class=None, proc=None,
                         host=None) -> ActorError:
    return ActorError(exception, message, remote_traceback=tb, actor=actor, endpoint=endpoint,
                      actor_class=actor_class, proc=proc, host=host)


class RDMAError(MonarchError):
    """An ``RDMABuffer`` transfer, registration or release failed: the buffer
    was dropped, its owner stopped, no backend can reach its owner, a backend
    refused the access.  The message names the buffer, its owner and the sizes.
    (Size mismatches and unsuitable memory are ``ValueError``, a transfer past
    its ``timeout`` is ``TimeoutError``, a dead owner proc ``SupervisionError``.)"""
