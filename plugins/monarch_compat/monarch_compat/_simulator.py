"""The reference's ``monarch.Simulator(hosts, gpus, ...)`` on monarch-core.

The reference's simulator is a mesh that *models* GPUs: commands are not
computed, their times and memory are simulated, and ``display()`` opens the
simulated trace in a notebook.  monarch-core has no model of GPUs, so here
the same program runs **for real** on local CPU procs of the asked shape
(``{"host": hosts, "gpu": gpus}``, the reference's dimension names) -- the
substitution ``patch_tensor_engine`` already makes for the simulator -- and
what ran is recorded as a Chrome trace of the run (monarch-core's
telemetry: a span per call, client and procs):

* ``Simulator(...)`` spawns the procs and starts recording (every call of
  the process is traced from then on, until ``display()``);
* ``display()`` ends the recording, writes the trace file (``trace_path``,
  default a new temporary file: nothing is written beside the program) and
  prints where it is, how to open it, and the table of the endpoints' time;
  a later ``display()`` prints it again;
* what needs the model is refused with ``ValueError`` at construction,
  naming why (``upload_trace``, ``build_ir``, the ``command_history`` and
  ``simulate_with_report_only`` modes), and ``upload()``/``export_ir()``
  raise ``RuntimeError``.  ``trace_mode`` is checked against the reference's
  names; the trace holds what monarch-core's telemetry records whatever it is.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Optional

logger = logging.getLogger("monarch.compat")

__all__ = ["Simulator", "SimulatorInterface"]

#: the reference's ``SimulatorBackendMode`` and ``SimulatorTraceMode`` names
SIMULATE_MODES = ("simulate", "simulate_with_report_only", "command_history", "everything")
TRACE_MODES = ("controller_trace_only", "stream_only", "everything")
#: modes whose output is the model's, which monarch-core does not have
_MODEL_ONLY = {
    "simulate_with_report_only": "it reports simulated times and memory",
    "command_history": "it records the simulator's command history",
    "everything": "it records the simulator's command history",
}


def _mode(value: Any, names: tuple[str, ...], what: str) -> str:
    name = str(getattr(value, "name", value)).lower()
    if name not in names:
        raise ValueError(f"Simulator({what}={value!r}): the reference's {what}s are {', '.join(names)}")
    return name


class SimulatorInterface:
    """What :func:`Simulator` returns: ``mesh`` (local CPU procs of the asked
    shape, dimensions ``host`` and ``gpu``) and ``display()``."""

    def __init__(self, mesh: Any, sink: Any, path: str) -> None:
        self.mesh = mesh
        self._sink: Any = sink
        self._path = path

    def display(self) -> None:
        """End the recording (once), write the trace file and print where it
        is, how to open it and the table of the endpoints' time."""
        from monarch_core import telemetry

        if self._sink is not None:
            sink, self._sink = self._sink, None
            try:
                telemetry.flush(10.0)
            finally:
                telemetry.remove_sink(sink)
        print(f"monarch-compat Simulator: the program ran for real on the local CPU procs {dict(self.mesh.extent.items())} "
              f"(monarch-core does not model GPUs); the trace of the run is {self._path}: open it in "
              f"https://ui.perfetto.dev or chrome://tracing, or run `monarch summary {self._path}`", flush=True)
        print(telemetry.metrics_table(refresh=False), flush=True)

    def upload(self) -> None:
        """Refused: the reference uploads its simulated trace to a Meta-internal service."""
        raise RuntimeError("Simulator.upload(): the reference uploads its simulated trace to a Meta-internal service; "
                           "monarch-compat has none: display() writes the trace of the run to a file")

    def export_ir(self, ir_path: str) -> None:
        """Refused: there is no simulator IR (the program runs for real)."""
        raise RuntimeError(f"Simulator.export_ir({ir_path!r}): monarch-compat's Simulator runs the program for real on "
                           f"local CPU procs and builds no simulator IR")


def Simulator(
    hosts: int,
    gpus: int,
    *,
    simulate_mode: Any = "simulate",
    trace_mode: Any = "stream_only",
    upload_trace: bool = False,
    trace_path: Optional[str] = None,
    command_history_path: Optional[str] = None,
    group_workers: bool = False,
    build_ir: bool = False,
) -> SimulatorInterface:
    """Local CPU procs of shape ``{"host": hosts, "gpu": gpus}``, the run
    recorded as a Chrome trace from now until ``display()`` (see the module
    docstring).  ``trace_path``: where ``display()`` writes it (default: a new
    temporary file); ``group_workers`` changes nothing (one proc per rank)."""
    from monarch_core import telemetry
    from monarch_core.actor import this_host
    from monarch_core.telemetry import ChromeTraceSink

    mode = _mode(simulate_mode, SIMULATE_MODES, "simulate_mode")
    _mode(trace_mode, TRACE_MODES, "trace_mode")
    if mode in _MODEL_ONLY:
        raise ValueError(f"Simulator(simulate_mode={mode!r}): {_MODEL_ONLY[mode]}, which needs the reference's model "
                         f"of GPUs; monarch-compat runs the program for real on local CPU procs and records its trace: "
                         f"use simulate_mode='simulate'")
    if upload_trace:
        raise ValueError("Simulator(upload_trace=True): the reference uploads to a Meta-internal service; "
                         "monarch-compat has none (display() writes the trace to a file)")
    if build_ir:
        raise ValueError("Simulator(build_ir=True): monarch-compat runs the program for real and builds no simulator IR")
    if command_history_path is not None:
        raise ValueError("Simulator(command_history_path=...): monarch-compat records no command history "
                         "(the trace of the run is what display() gives)")
    for name, n in (("hosts", hosts), ("gpus", gpus)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Simulator({name}={n!r}): a number of {name} >= 1")
    if trace_path is None:
        fd, trace_path = tempfile.mkstemp(prefix="monarch-simulator-", suffix=".json")
        os.close(fd)
    mesh = this_host().spawn_procs(per_host={"host": hosts, "gpu": gpus})
    sink = ChromeTraceSink(trace_path)
    telemetry.add_sink(sink)
    logger.info("Simulator: %d x %d local CPU procs; recording the run's trace to %s", hosts, gpus, trace_path)
    return SimulatorInterface(mesh, sink, trace_path)
