"""One dashboard per client process: its model, server, sink and output tee.

:func:`start` makes it (once; later calls return the same one) and prints its
URL once on stderr; :meth:`Dashboard.stop` undoes everything.  The sink is a
:class:`~monarch_core.hookspecs.TelemetrySink` that wants ``metric`` and
``lifecycle`` events only -- so calls stay untraced -- and folds each batch
into the model on the telemetry thread.  Spans are recorded only while the
Timeline page asks for them (:meth:`Dashboard.record`).
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

from monarch_core import runtime, telemetry
from monarch_core.hookspecs import TelemetryEvent, TelemetrySink

from monarch_dashboard import _files, _tee
from monarch_dashboard._model import JobModel
from monarch_dashboard._server import Server

logger = logging.getLogger("monarch.dashboard")

_lock = threading.Lock()
_current: Optional[Dashboard] = None


class DashboardSink(TelemetrySink):
    """Feeds a dashboard's model (``metric`` and ``lifecycle`` events; ``close()``
    -- the client's shutdown -- stops the dashboard)."""

    kinds = frozenset({"metric", "lifecycle"})

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        self.dashboard.model.ingest(events)

    def close(self) -> None:
        self.dashboard.stop(remove_sink=False)


class _SpanSink(TelemetrySink):
    """The spans of a recording, into the model (the Timeline page)."""

    kinds = frozenset({"span"})

    def __init__(self, model: JobModel) -> None:
        self.model = model

    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        self.model.ingest(events)


class Dashboard:
    """A running dashboard: :attr:`url` (with its token), :meth:`stop`."""

    def __init__(self, port: int) -> None:
        self.model = JobModel()
        self.token = secrets.token_urlsafe(24)
        self._trace_dir: Optional[str] = None  # made by the first recording (a dashboard never recorded leaves nothing)
        self._trace: Optional[str] = None
        self.server = Server(self.model, token=self.token, port=port, record=self.record, trace_path=lambda: self._trace)
        self.port = self.server.port
        self.url = f"http://127.0.0.1:{self.port}/?token={self.token}"
        self.sink = DashboardSink(self)
        self._tees: Optional[tuple[_tee.Tee, _tee.Tee]] = None
        self._file: Optional[Any] = None
        self._sink_added = False
        self._recording = threading.Lock()
        self.stopped = False

    def _start(self, add_sink: bool) -> None:
        self.server.start()
        banner = (f"monarch dashboard: {self.url}\n"
                  f"  (served on this machine's loopback only; from another machine: "
                  f"ssh -L {self.port}:127.0.0.1:{self.port} <this host>, then open the URL there)\n")
        sys.stderr.write(banner)
        sys.stderr.flush()
        self._tees = _tee.install(self.model.add_output)
        self._file = _files.write({"url": self.url, "pid": os.getpid(), "port": self.port, "started": time.time(),
                                   "argv": sys.argv})
        runtime.publish_url("dashboard", self.url)  # `monarch status` lists it
        if add_sink:
            telemetry.add_sink(self.sink)
            self._sink_added = True

    def record(self, seconds: float) -> None:
        """Trace every call for ``seconds`` s: spans to the Timeline page and a
        Chrome trace file (``/trace.json``).  One recording at a time."""
        if not self._recording.acquire(blocking=False):
            return
        if self._trace_dir is None:
            self._trace_dir = tempfile.mkdtemp(prefix="monarch-dashboard-")
        path = os.path.join(self._trace_dir, f"trace-{int(time.time())}.json")
        spans = _SpanSink(self.model)
        with self.model.lock:
            self.model.spans.clear()
            self.model.recording = {"active": True, "seconds": seconds, "path": None}
        trace = telemetry.ChromeTraceSink(path)
        telemetry.add_sink(trace)
        telemetry.add_sink(spans)
        self.model.ingest([TelemetryEvent("dashboard", "recording", time.time_ns())])

        def finish() -> None:
            try:
                time.sleep(seconds)
                try:
                    telemetry.flush(2.0)
                except Exception:  # noqa: BLE001 - what the procs hold now is lost, the rest is kept
                    logger.debug("flush at the end of a recording failed", exc_info=True)
                telemetry.remove_sink(spans)
                telemetry.remove_sink(trace)
                self._trace = path
            finally:
                with self.model.lock:
                    self.model.recording = {"active": False, "seconds": seconds, "path": self._trace}
                self._recording.release()
                self.model.ingest([TelemetryEvent("dashboard", "recorded", time.time_ns())])

        threading.Thread(target=finish, name="monarch-dashboard-recording", daemon=True).start()

    def stop(self, *, remove_sink: bool = True) -> None:
        """Stop serving, put the client's stdout/stderr back, uninstall the sink."""
        global _current
        with _lock:
            if self.stopped:
                return
            self.stopped = True
            if _current is self:
                _current = None
        runtime.withdraw_url("dashboard")
        self.model.end()  # the open pages show "job ended at ..." and keep the last state
        if not self.server.drain():
            logger.debug("a live page did not take the 'job ended' message in time")
        if self._tees is not None:
            _tee.uninstall(self._tees)
        if remove_sink and self._sink_added:
            telemetry.remove_sink(self.sink, close=False)
        self.server.stop()
        if self._file is not None:
            self._file.unlink(missing_ok=True)


def start(*, port: Optional[int] = None, add_sink: bool = True) -> Dashboard:
    """The dashboard of this process, started on first call (``port``: default
    ``MONARCH_DASHBOARD_PORT``, 0 for a free one)."""
    global _current
    from monarch_dashboard import _settings

    with _lock:
        if _current is not None:
            return _current
        if port is None:
            port = int(_settings.get("MONARCH_DASHBOARD_PORT"))
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"dashboard(port=...) takes a TCP port 0-65535 (0: a free one), got {port!r}")
        d = Dashboard(port)
        d._start(add_sink)
        _current = d
        return d


def current() -> Optional[Dashboard]:
    return _current
