"""The HTTP side: a Starlette app served by Hypercorn on trio, in a daemon thread.

Why this stack: the client's kernel already runs trio, and Hypercorn is the
well-kept ASGI server that runs on trio natively; Starlette (on anyio, so on
trio too) gives routing, responses and static files.  The server runs its own
trio loop on the ``monarch-dashboard`` thread -- never the kernel's loop -- so
nothing it does can delay a message.

Routes (all behind :class:`~monarch_dashboard._auth.LoopbackTokenGuard`):
``/`` (to ``/job``), ``/job``, ``/endpoints``, ``/failures``, ``/logs``,
``/timeline`` (pages), ``/events?page=...`` (the live stream: server-sent
events, one ``update`` with the page's new rendering whenever the model
changed, at most :data:`MIN_INTERVAL` apart, and a comment every
:data:`KEEPALIVE` s otherwise), ``/api/state`` (the model as JSON),
``POST /timeline/record`` (trace every call for a few seconds),
``/trace.json`` (the last recording, for Perfetto) and ``/static/...``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any, Optional
from urllib.parse import parse_qs

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.responses import StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from monarch_dashboard import _render
from monarch_dashboard._auth import LoopbackTokenGuard
from monarch_dashboard._model import JobModel

logger = logging.getLogger("monarch.dashboard")

#: seconds between two updates of one live page, at least
MIN_INTERVAL = 0.5
#: seconds of silence after which the stream sends a comment (keeps proxies and ssh -L tunnels open)
KEEPALIVE = 15.0
START_TIMEOUT = 10.0
#: seconds the stop waits for the live pages to receive "job ended"
ENDED_DRAIN = 3.0


class Server:
    """Serves ``model`` on ``127.0.0.1:port`` (0: a free port) with ``token``."""

    def __init__(self, model: JobModel, *, token: str, port: int = 0,
                 record: Optional[Callable[[float], None]] = None, trace_path: Callable[[], Optional[str]] = lambda: None) -> None:
        self.model = model
        self.token = token
        self._record = record
        self._trace_path = trace_path
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind(("127.0.0.1", port))
        except OSError as e:
            self._sock.close()
            raise OSError(f"the dashboard cannot listen on 127.0.0.1:{port}: {e}; set MONARCH_DASHBOARD_PORT to a free "
                          "port, or 0 for any") from e
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self._trio_token: Optional[trio.lowlevel.TrioToken] = None
        self._changed: Optional[trio.Event] = None
        self._stop: Optional[trio.Event] = None
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.failed: Optional[BaseException] = None
        #: live streams open now (the server thread counts them; :meth:`drain` waits for 0)
        self._open_streams = 0
        model.listen(self.notify)

    # -------------------------------------------------------------- the app
    def app(self) -> Any:
        static = str(resources.files("monarch_dashboard") / "static")
        routes = [Route("/", self._root), Route("/events", self._events), Route("/api/state", self._state),
                  Route("/trace.json", self._trace), Route("/timeline/record", self._start_recording, methods=["POST"]),
                  Mount("/static", StaticFiles(directory=static), name="static")]
        routes += [Route(f"/{p}", self._page_route(p)) for p in _render.PAGES]
        return LoopbackTokenGuard(Starlette(routes=routes), token=self.token, port=self.port)

    async def _root(self, request: Request) -> Response:
        return RedirectResponse("/job", status_code=303)

    def _page_route(self, name: str) -> Callable[[Request], Any]:
        async def route(request: Request) -> Response:
            q = dict(request.query_params)
            q.pop("token", None)
            return HTMLResponse(_render.page(self.model, name, q), headers={"cache-control": "no-store"})
        return route

    async def _events(self, request: Request) -> Response:
        q = dict(request.query_params)
        q.pop("token", None)
        name = q.pop("page", "job")
        if name not in _render.PAGES:
            return PlainTextResponse(f"unknown page {name!r}; the pages are {', '.join(_render.PAGES)}", status_code=400)
        return StreamingResponse(self._stream(name, q), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    async def _stream(self, name: str, q: dict[str, str]) -> AsyncIterator[str]:
        """The live stream of page ``name``: an ``update`` per change; once the job
        ended (:meth:`JobModel.end`), its last ``update`` and then ``ended`` (the
        page shows "job ended at HH:MM:SS" and stops reconnecting), and the stream closes."""
        seen = -1
        self._open_streams += 1
        try:
            yield "retry: 2000\n\n"
            while True:
                changed = self._changed
                assert changed is not None
                if self.model.version != seen:
                    seen = self.model.version
                    msg: dict[str, Any] = {"version": seen, "html": _render.live(self.model, name, q),
                                           "failures": self.model.counts()["failures"]}
                    if name == "logs":
                        msg["meshes"] = self.model.log_meshes()
                    yield "event: update\ndata: " + json.dumps(msg) + "\n\n"
                    if not self.model.ended_ns:
                        await trio.sleep(MIN_INTERVAL)
                    continue
                if self.model.ended_ns:
                    yield "event: ended\ndata: " + json.dumps({"ended": _render.hms(self.model.ended_ns)}) + "\n\n"
                    return
                with trio.move_on_after(KEEPALIVE) as scope:
                    await changed.wait()
                if scope.cancelled_caught:
                    yield ": keepalive\n\n"
        finally:
            self._open_streams -= 1

    async def _state(self, request: Request) -> Response:
        m = self.model
        rows = [{"mesh": r.mesh, "endpoint": r.endpoint, "calls": r.calls, "errors": r.errors,
                 "caller_errors": r.caller_errors, "raised": r.raised, "p50_ns": r.p(50),
                 "p99_ns": r.p(99), "request_bytes": r.request_bytes, "reply_bytes": r.reply_bytes,
                 "calls_per_s": r.rate, "ranks": [{"rank": k.rank, "calls": k.calls, "p50_ns": k.p(50),
                                                   "mean_ns": k.mean_ns, "slow": k.slow} for k in r.ranks]}
                for r in m.endpoint_rows()]
        return JSONResponse({"version": m.version, "tree": m.tree(), "meshes": m.mesh_summaries(), "endpoints": rows,
                             "failures": m.failure_view(), "failure_groups": m.failure_groups(),
                             "counts": m.counts(), "ended_ns": m.ended_ns})

    async def _trace(self, request: Request) -> Response:
        path = self._trace_path()
        if not path:
            return PlainTextResponse("no trace recorded yet: press Record on the Timeline page first", status_code=404)
        return FileResponse(path, media_type="application/json", filename="monarch-trace.json")

    async def _start_recording(self, request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        try:
            seconds = float((form.get("seconds") or ["5"])[0])
            if not 0 < seconds <= 600:
                raise ValueError
        except ValueError:
            return PlainTextResponse("seconds must be a number in (0, 600]", status_code=400)
        if self._record is not None:
            self._record(seconds)
        return RedirectResponse("/timeline", status_code=303)

    # -------------------------------------------------------------- running
    def notify(self) -> None:
        """The model changed (any thread): wake the live streams."""
        token = self._trio_token
        if token is None:
            return
        try:
            token.run_sync_soon(self._wake)
        except trio.RunFinishedError:
            pass

    def _wake(self) -> None:
        old, self._changed = self._changed, trio.Event()
        if old is not None:
            old.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="monarch-dashboard", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise RuntimeError(f"the dashboard's server did not start within {START_TIMEOUT:g} s")
        if self.failed is not None:
            raise RuntimeError(f"the dashboard's server failed to start: {self.failed}") from self.failed

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 - reported to start() or logged
            self.failed = e
            logger.exception("the dashboard's server stopped")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._trio_token = trio.lowlevel.current_trio_token()
        self._changed = trio.Event()
        self._stop = trio.Event()
        config = Config()
        config.bind = [f"fd://{self._sock.fileno()}"]
        config.accesslog = None
        config.errorlog = logger
        config.graceful_timeout = 1.0
        config.keep_alive_timeout = 30.0
        self._ready.set()
        await serve(self.app(), config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

    def drain(self, timeout: float = ENDED_DRAIN) -> bool:
        """Wait (at most ``timeout`` s) until every live stream has told its page that
        the job ended and closed (call after :meth:`JobModel.end`); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._open_streams > 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def stop(self, timeout: float = 5.0) -> None:
        token = self._trio_token
        if token is not None:
            try:
                token.run_sync_soon(lambda: self._stop.set() if self._stop is not None else None)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self._sock.close()
        except OSError:
            pass
