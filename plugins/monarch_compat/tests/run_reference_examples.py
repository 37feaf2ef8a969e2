"""Run the reference's (torchmonarch 0.7.0) own example programs on monarch-core,
unchanged, and print a table of which run.

    python plugins/monarch_compat/tests/run_reference_examples.py /path/to/monarch-checkout [NAME ...]

The argument is a checkout of the reference's repository (meta-pytorch/monarch);
nothing of it is copied here.  The programs are the 23 that can run on one
machine with CPUs only (issue 39); those written for CUDA run under
``python -m monarch_compat.cpu`` (CUDA devices are the CPU, nccl is gloo:
docs/compat.md).  Each runs in its own directory with its stdin a pipe (as
from a terminal), in a process group of its own, SIGINT at its default
action (as from a terminal, even when the runner itself runs in the
background with SIGINT ignored), with a time limit:

* ``exit`` programs pass when they exit 0 within the limit and printed what
  they should;
* ``interrupt`` programs run until Ctrl+C: they pass when, ``run_s`` seconds
  after printing what they should, they are still running with no traceback
  printed (unless one is the point), and, on SIGINT to their process group
  (what Ctrl+C in a terminal sends), exit within ``grace_s`` (or when they
  finished their work before, exit 0), having printed what they should
  print on the way out (``after``).

Extra NAMEs run only the programs whose name contains one of them.  The exit
status is the number of failures.  Programs' output goes to ``--logs`` (a
folder; default a temporary one), named in the table.

``--python PATH`` runs the programs under another interpreter (default: the
one running this), with the same selection and the same judging: e.g. a
virtual environment holding the reference itself, to compare.  Either way the
interpreter's folder is first on the programs' ``PATH``, as in its activated
virtual environment (``torchrun``).  When that
interpreter cannot import ``monarch_compat``, the CUDA programs still run
under ``python -m monarch_compat.cpu``: the runner writes a small package
``monarch_compat`` into ``LOGS/_cpu_shim`` and puts it first on their
``PYTHONPATH``; it copies nothing, its ``__path__`` reaches this repository's
``monarch_compat`` folder (``cpu.py``, ``_cpu.py`` and ``_cpu_site`` as they
are, none of which imports ``monarch``) and only its ``_settings`` (the two
``MONARCH_COMPAT_CPU*`` variables, read from the environment with the same
defaults instead of through monarch-core's settings) is its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time


@dataclasses.dataclass(frozen=True)
class Example:
    """One reference program and how to judge it."""

    path: str  # relative to the checkout
    mode: str = "exit"  # "exit" or "interrupt"
    timeout_s: float = 240.0  # exit: the limit; interrupt: the limit for reaching run_s and the markers
    run_s: float = 25.0  # interrupt: how long it runs before Ctrl+C
    grace_s: float = 60.0  # interrupt: how long it may take to stop after Ctrl+C
    cpu: bool = False  # written for CUDA: run under python -m monarch_compat.cpu
    expect: tuple[str, ...] = ()  # printed by a run that went right
    traceback_ok: bool = False  # a traceback in the output is the program's point (an injected failure)
    after: tuple[str, ...] = ()  # interrupt: printed once it was stopped by Ctrl+C
    #: its stdin, step by step: (a line to write, what it prints once that line is handled); then closed
    stdin: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1] if "presentation" not in self.path else "presentation/demo.py"


DOCS = "docs/source/examples"
PY = "python/examples"

EXAMPLES: tuple[Example, ...] = (
    Example(f"{DOCS}/getting_started.py", timeout_s=420),
    Example(f"{DOCS}/ping_pong.py"),
    Example(f"{DOCS}/crawler.py"),
    Example(f"{DOCS}/grpo_yield.py", timeout_s=420),
    Example(f"{DOCS}/grpo_sim.py"),
    Example(f"{DOCS}/grpo_forge_sim.py"),
    Example(f"{DOCS}/grpo_actor.py", cpu=True, timeout_s=420),
    Example(f"{DOCS}/grpo_actor_te.py", cpu=True, timeout_s=420),
    # it makes a too-big tensor on purpose and prints the failure's traceback (traceback.print_exc()), then goes on
    Example(f"{DOCS}/distributed_tensors.py", cpu=True, timeout_s=420, traceback_ok=True,
            expect=("RECOVERED!", "max is 2**")),
    Example(f"{DOCS}/ddp/spmd_ddp.py", cpu=True, expect=("DDP example completed successfully!",)),
    Example(f"{DOCS}/ddp/spmd_job.py", cpu=True, expect=("SPMD job completed successfully!",)),
    Example("python/monarch/timer/example_spmd.py"),
    Example("python/monarch/timer/example_monarch.py", cpu=True, expect=("average time w/ ExecutionTimer",)),
    Example("examples/presentation/demo.py", cpu=True, timeout_s=420),
    Example(f"{PY}/dining_philosophers.py", "interrupt", expect=("Press Ctrl+C to stop.",)),
    Example(f"{PY}/stop_mesh.py", "interrupt", expect=("Actor mesh stopped.",)),
    Example(f"{PY}/poisoned_mesh.py", "interrupt", expect=("Failure injected.",), traceback_ok=True),
    Example(f"{PY}/execution_demo.py", "interrupt", expect=("Press Ctrl+C to stop.",)),
    Example(f"{PY}/airport_turnaround_demo.py", "interrupt", expect=("Press Ctrl+C to stop.",)),
    Example(f"{PY}/sleep_actors.py", "interrupt", expect=("done, stopping",)),
    Example(f"{PY}/rapid_spawn_exit_stress.py", "interrupt", expect=("iter 3",)),
    # it sleeps until Ctrl+C (``asyncio.sleep(inf)``), then prints "Shutting down..." and kills its job
    Example(f"{PY}/inbound_ordering_workload.py", "interrupt", expect=("Verifier:",), after=("Shutting down",)),
    Example(f"{PY}/execution_workload.py",
            stdin=(("HOLD busy a", "EXEC_ENTERED a"), ("RELEASE busy a", "EXEC_ACK release a"),
                   ("HOLD concurrent b", "EXEC_ENTERED b"), ("HOLD concurrent c", "EXEC_ENTERED c"),
                   ("RAISE concurrent b", "EXEC_ACK raise b"), ("RELEASE concurrent c", "EXEC_ACK release c")),
            expect=("EXEC_ENTERED a", "EXEC_ACK release a", "EXEC_ENTERED b", "EXEC_ENTERED c",
                    "EXEC_ACK raise b", "EXEC_ACK release c")),
)


def _pump(stream, sink, seen: list[str]) -> None:  # type: ignore[no-untyped-def]
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        seen.append(line)


def _as_from_a_terminal() -> None:
    """In the child before its program starts: SIGINT at its default action,
    as a program started from a terminal has it.  A runner started in the
    background of a non-interactive shell (``cmd &``, ``nohup``) has SIGINT
    ignored, which its children would inherit: Python then installs no
    KeyboardInterrupt handler, nor asyncio.run its own, and the Ctrl+C the
    runner sends would be ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: this repository's ``monarch_compat`` package (the CPU substitution the shim reaches)
_COMPAT_PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "monarch_compat")

_SHIM_INIT = '''"""Written by run_reference_examples.py for an interpreter without monarch-core:
monarch-compat's CPU substitution from {package!r}, unchanged (nothing copied),
with this folder's ``_settings`` (read from the environment) first."""
__path__.append({package!r})
'''

_SHIM_SETTINGS = '''"""monarch-compat's two CPU-substitution settings, read from the environment with
monarch-compat's defaults (written by run_reference_examples.py; monarch-core's
settings registry is not installed beside this interpreter)."""
import os


def get(name):
    value = os.environ.get(name, "").strip()
    if name == "MONARCH_COMPAT_CPU":
        return value.lower() in ("1", "true", "yes", "on")
    if name == "MONARCH_COMPAT_CPU_TENSOR_MB":
        return float(value) if value else 1024.0
    raise KeyError(f"{{name}} is not one of monarch-compat's CPU settings")
'''


def cpu_shim(python: str, folder: str) -> str | None:
    """The folder to put first on ``PYTHONPATH`` so that ``python -m monarch_compat.cpu``
    runs under ``python``: None when ``python`` imports ``monarch_compat`` itself,
    else ``folder/_cpu_shim``, written there (see the module docstring)."""
    probe = subprocess.run([python, "-c", "import importlib.util, sys; "
                            "sys.exit(importlib.util.find_spec('monarch_compat') is None)"],
                           capture_output=True, timeout=120)
    if probe.returncode == 0:
        return None
    shim = os.path.join(folder, "_cpu_shim")
    os.makedirs(os.path.join(shim, "monarch_compat"), exist_ok=True)
    with open(os.path.join(shim, "monarch_compat", "__init__.py"), "w") as f:
        f.write(_SHIM_INIT.format(package=_COMPAT_PACKAGE))
    with open(os.path.join(shim, "monarch_compat", "_settings.py"), "w") as f:
        f.write(_SHIM_SETTINGS)
    return shim


def run_one(ex: Example, checkout: str, log_path: str, python: str | None = None,
            cpu_path: str | None = None) -> tuple[bool, str, float]:
    """Run ``ex`` from ``checkout`` under ``python`` (default: this interpreter), ``cpu_path``
    first on ``PYTHONPATH`` for the CUDA programs (:func:`cpu_shim`); (passed, why, seconds),
    its output in ``log_path``."""
    script = os.path.join(checkout, ex.path)
    if not os.path.exists(script):
        return False, f"not in the checkout: {ex.path}", 0.0
    cmd = [python or sys.executable, *(["-m", "monarch_compat.cpu"] if ex.cpu else []), script]
    # the interpreter's folder first on PATH, as in its activated virtual environment (``torchrun``)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join(filter(None, [os.path.dirname(cmd[0]), os.environ.get("PATH")])))
    if ex.cpu and cpu_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [cpu_path, os.environ.get("PYTHONPATH")]))
    start = time.monotonic()
    seen: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=os.path.dirname(script), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                                preexec_fn=_as_from_a_terminal)
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, seen), daemon=True)
        pump.start()
        assert proc.stdin is not None
        try:
            if ex.mode == "exit":
                for line, answer in ex.stdin:  # each command once the one before was answered (a handshake)
                    proc.stdin.write(line + "\n")
                    proc.stdin.flush()
                    deadline = start + ex.timeout_s
                    while answer not in "".join(seen) and proc.poll() is None and time.monotonic() < deadline:
                        time.sleep(0.2)
                if ex.stdin:
                    proc.stdin.close()  # EOF ends it
                try:
                    rc = proc.wait(timeout=max(1.0, ex.timeout_s - (time.monotonic() - start)))
                except subprocess.TimeoutExpired:
                    return False, f"still running after {ex.timeout_s:.0f}s", time.monotonic() - start
                pump.join(10)
                out = "".join(seen)
                if rc != 0:
                    last = next((ln.strip() for ln in reversed(seen) if ln.strip()), "")
                    return False, f"exit {rc}: {last[:160]}", time.monotonic() - start
            else:
                deadline = start + ex.timeout_s
                ran_from = None
                while time.monotonic() < deadline and proc.poll() is None:
                    if ran_from is None and all(m in "".join(seen) for m in ex.expect):
                        ran_from = time.monotonic()
                    if ran_from is not None and time.monotonic() - ran_from >= ex.run_s:
                        break
                    time.sleep(0.5)
                if proc.poll() is not None:
                    if proc.returncode != 0:
                        last = next((ln.strip() for ln in reversed(seen) if ln.strip()), "")
                        return False, f"ended by itself (exit {proc.returncode}) before Ctrl+C: {last[:160]}", \
                            time.monotonic() - start
                    # it finished its work (exit 0) before Ctrl+C was due: judged by what it printed
                elif ran_from is None:
                    return False, f"did not print {ex.expect} within {ex.timeout_s:.0f}s", time.monotonic() - start
                else:
                    os.killpg(proc.pid, signal.SIGINT)
                    try:
                        proc.wait(timeout=ex.grace_s)
                    except subprocess.TimeoutExpired:
                        return False, f"did not stop within {ex.grace_s:.0f}s of Ctrl+C", time.monotonic() - start
                pump.join(10)
                out = "".join(seen)
            missing = [m for m in (*ex.expect, *ex.after) if m not in out]
            if missing:
                return False, f"did not print {missing}", time.monotonic() - start
            if not ex.traceback_ok and "Traceback (most recent call last)" in out:
                return False, "printed a traceback", time.monotonic() - start
            return True, "", time.monotonic() - start
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
            try:
                proc.stdin.close()
            except OSError:
                pass


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="a checkout of the reference's repository (meta-pytorch/monarch)")
    parser.add_argument("names", nargs="*", help="run only the programs whose name contains one of these")
    parser.add_argument("--logs", help="folder for the programs' output (default: a temporary folder)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs the programs (default: this one)")
    args = parser.parse_args(argv)
    logs = args.logs or tempfile.mkdtemp(prefix="reference-examples-")
    os.makedirs(logs, exist_ok=True)
    cpu_path = cpu_shim(args.python, logs)
    print(f"interpreter: {args.python}" + (f" (CUDA programs: monarch_compat.cpu through {cpu_path})"
                                           if cpu_path else ""), flush=True)
    chosen = [ex for ex in EXAMPLES if not args.names or any(n in ex.path for n in args.names)]
    rows = []
    for ex in chosen:
        log_path = os.path.join(logs, ex.name.replace("/", "_") + ".log")
        ok, why, secs = run_one(ex, args.checkout, log_path, args.python, cpu_path)
        rows.append((ex.name, ok, why, secs, log_path))
        print(f"{'PASS' if ok else 'FAIL'} {ex.name} ({secs:.0f}s) {why}", flush=True)
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'program':<{width}}  result  seconds  why / log")
    for name, ok, why, secs, log_path in rows:
        print(f"{name:<{width}}  {'pass' if ok else 'FAIL':<6}  {secs:7.0f}  {why or log_path}")
    failed = sum(1 for r in rows if not r[1])
    print(f"\n{len(rows) - failed} of {len(rows)} ran (logs: {logs})")
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
