"""Who may read the dashboard: this machine's loopback, with the token.

:class:`LoopbackTokenGuard` is an ASGI middleware in front of every route:

* the peer address must be ``127.0.0.1`` or ``::1`` (the server binds
  ``127.0.0.1`` only; this refuses anything that reached it otherwise);
* the ``Host`` header must name the loopback address and this port (a page of
  another site cannot drive the browser at it: DNS rebinding);
* the request carries the token, in the URL (``?token=...``: then a cookie,
  ``HttpOnly``, ``SameSite=Strict``, keeps it for the pages and the live
  stream) or in that cookie.  Tokens are compared in constant time
  (:func:`hmac.compare_digest`).

A refused request gets ``403`` and a text saying what to do instead.
"""

from __future__ import annotations

import hmac
from http.cookies import SimpleCookie
from typing import Any, Awaitable, Callable, MutableMapping
from urllib.parse import parse_qs

# (ASGI's types, as Starlette declares them)
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_PEERS = frozenset({"127.0.0.1", "::1"})


def cookie_name(port: int) -> str:
    return f"monarch_dashboard_{port}"


class LoopbackTokenGuard:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, *, token: str, port: int) -> None:
        self.app = app
        self.token = token.encode()
        self.port = port
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"})
        self.cookie = cookie_name(port)

    def _ok(self, candidate: str) -> bool:
        return bool(candidate) and hmac.compare_digest(candidate.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route speaks it
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client") or ("", 0)
        if client[0] not in LOOPBACK_PEERS:
            await _refuse(send, f"monarch dashboard: connections from {client[0] or 'an unknown address'} are not "
                          "served; the dashboard is for this machine's loopback only. From another machine, forward "
                          f"the port: ssh -L {self.port}:127.0.0.1:{self.port} <this host>, then open the printed URL "
                          "on your machine.")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or ()}
        if headers.get("host", "") not in self.hosts:
            await _refuse(send, f"monarch dashboard: Host {headers.get('host', '')!r} is not this dashboard's address; "
                          f"open http://127.0.0.1:{self.port}/?token=... as printed by the job.")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        from_url = (query.get("token") or [""])[0]
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except Exception:  # noqa: BLE001 - a malformed cookie header is no token
            pass
        morsel = jar.get(self.cookie)
        from_cookie = morsel.value if morsel is not None else ""
        if self._ok(from_url):
            await self.app(scope, receive, self._with_cookie(send, from_url))
        elif self._ok(from_cookie):
            await self.app(scope, receive, send)
        else:
            await _refuse(send, "monarch dashboard: this request has no valid token. Open the URL the job printed "
                          "(it ends with ?token=...), or run `monarch dashboard` as the same user on this machine "
                          "to print it again.")

    def _with_cookie(self, send: Send, token: str) -> Send:
        value = f"{self.cookie}={token}; Path=/; HttpOnly; SameSite=Strict".encode("latin-1")

        async def wrapped(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", value)]}
            await send(message)

        return wrapped


async def _refuse(send: Send, text: str) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
