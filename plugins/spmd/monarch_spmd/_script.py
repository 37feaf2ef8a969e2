"""Run a training script or module for one rank as ``python argv...`` would:
in a fresh child process of the proc (:mod:`._child`), as torchrun runs its
workers.

Contract of :func:`run_main`:

* ``argv = ["train.py", "--lr", "0.1"]`` runs ``python -u train.py --lr
  0.1``; ``argv = ["-m", "pkg.train", ...]`` runs ``python -u -m pkg.train
  ...`` (torchrun's command lines; ``PYTHON_EXEC`` overrides the
  interpreter, as under torchrun).  :class:`ScriptOptions` ``run_path``
  runs the script through ``runpy.run_path`` in a fresh interpreter
  (torchrun's ``--run-path``), ``no_python`` runs ``argv`` itself as the
  command (``--no-python``).  The process runs in the proc's working
  directory with the proc's environment plus torchrun's variables (the
  proc's own ``MONARCH_PROC_*`` left out; the host's ``CUDA_VISIBLE_DEVICES``,
  as ``_env.apply`` gives it), on its main thread, for its own
  lifetime: ``signal.signal`` works, ``atexit`` handlers run at its end,
  nothing it imported outlives it.
* Its output goes where :class:`ScriptOptions` says (the console: the
  proc's output, prefixed with the rank when the mesh streams; log files).
* It returns ``None`` when the process exits 0, else a :class:`ScriptError`
  whose ``exit_code`` is the process's status (``128 + N`` for a signal N),
  whose message names the rank, the host, the status and the exception its
  traceback ends with, followed by the last lines of its stderr.
* It raises before starting when ``argv`` is malformed or the script does
  not exist.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

from monarch_core.errors import MonarchError
from monarch_spmd._child import RankProcess, register, unregister
from monarch_spmd._env import apply

#: a stream selection (torchrun's ``Std``): 0 none, 1 stdout, 2 stderr, 3 both; or one per local rank
StdSpec = Union[int, Mapping[int, int]]

#: the variables of the proc itself that its rank processes do not inherit
PROC_ONLY = ("MONARCH_PROC_BOOTSTRAP", "MONARCH_PROC_ID")

#: ``python -c``: what torchrun's ``--run-path`` runs in a worker (``run_script_path``)
RUN_PATH = "import runpy, sys\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"


class ScriptError(MonarchError, RuntimeError):
    """A rank's script failed: ``rank``, ``exit_code`` (its process's exit
    status; ``128 + N`` for a signal N), ``argv``, ``host``, ``failed_at``
    (the rank's ``time.time()``) and ``collective`` (True when the failure
    came out of a ``torch.distributed`` operation, usually because another
    rank failed first)."""

    def __init__(self, message: str, *, rank: int, exit_code: int, argv: Sequence[str] = (), host: str = "",
                 failed_at: float = 0.0, collective: bool = False) -> None:
        super().__init__(message)
        self.rank, self.exit_code, self.argv, self.host = rank, exit_code, list(argv), host
        self.failed_at, self.collective = failed_at, collective

    def __reduce__(self) -> Any:
        return (_rebuild, (str(self), self.rank, self.exit_code, self.argv, self.host, self.failed_at,
                           self.collective))


def _rebuild(message: str, rank: int, exit_code: int, argv: list[str], host: str, failed_at: float,
             collective: bool) -> ScriptError:
    return ScriptError(message, rank=rank, exit_code=exit_code, argv=argv, host=host, failed_at=failed_at,
                       collective=collective)


@dataclass(frozen=True)
class ScriptOptions:
    """How a rank's script runs and where its output goes (torchrun's
    options of the same names):

    * ``run_path``: run the script with ``runpy.run_path`` (``--run-path``);
      ``no_python``: run ``argv`` as a command, not a Python script
      (``--no-python``; ``run_path`` takes precedence, as in torchrun).
    * ``log_dir``: the job's log folder; the rank of global rank ``r``
      writes ``<log_dir>/attempt_<restart>/<r>/stdout.log`` and
      ``stderr.log`` for the streams ``redirects`` or ``tee`` select.
    * ``redirects``: streams that go to their file only; ``tee``: streams
      that go to their file and to the console (:data:`StdSpec`).
    * ``local_ranks_filter``: the local ranks whose output reaches the
      console (``None``: all); files are written regardless.
    """

    run_path: bool = False
    no_python: bool = False
    log_dir: str | None = None
    redirects: StdSpec = 0
    tee: StdSpec = 0
    local_ranks_filter: frozenset[int] | None = None

    def __post_init__(self) -> None:
        for name in ("redirects", "tee"):
            std = getattr(self, name)
            values = list(std.values()) if isinstance(std, Mapping) else [std]
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 3 for v in values):
                raise ValueError(f"{name} must be 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or a mapping of local "
                                 f"rank to 0-3, got {std!r}")
            if any(values) and self.log_dir is None:
                raise ValueError(f"{name} needs log_dir: the folder its files go to")


def std_for(spec: StdSpec, local_rank: int) -> int:
    """The streams ``spec`` selects for ``local_rank`` (0-3)."""
    return int(spec.get(local_rank, 0)) if isinstance(spec, Mapping) else int(spec)


_STD_VALUE = re.compile(r"^[0-3]$")
_STD_MAP = re.compile(r"^(\d+:[0-3],)*\d+:[0-3]$")


def parse_std(value: str, option: str) -> StdSpec:
    """torchrun's ``--redirects``/``--tee`` value: ``3`` (every local rank)
    or ``0:1,1:2`` (per local rank; missing ranks 0); ``ValueError`` saying
    the format otherwise."""
    value = value.strip()
    if _STD_VALUE.match(value):
        return int(value)
    if _STD_MAP.match(value):
        return {int(k): int(v) for k, v in (m.split(":") for m in value.split(","))}
    raise ValueError(f"{option} {value!r}: give 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every local rank, "
                     f"or LOCAL_RANK:VALUE pairs such as 0:3,1:2")


def exit_status(returncode: int) -> int:
    """A process's ``returncode`` as a shell reports it: ``128 + N`` for a signal N."""
    return 128 - returncode if returncode < 0 else returncode


def check_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as a list of str, or ``ValueError``/``TypeError`` saying what is wrong."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
        raise TypeError(f"argv must be a list of str (['train.py', '--lr', '0.1'] or ['-m', 'pkg.train', ...]), "
                        f"got {argv!r}")
    argv = list(argv)
    if not all(isinstance(a, str) for a in argv):
        raise TypeError(f"argv must be a list of str, got {argv!r}")
    if not argv:
        raise ValueError("No script or module specified: argv is empty (give ['train.py', ...] or ['-m', 'module', ...])")
    if argv[0] == "-m" and len(argv) < 2:
        raise ValueError("No module specified after '-m' in argv")
    return argv


def command(argv: Sequence[str], options: ScriptOptions, python: str) -> list[str]:
    """The command line that runs ``argv`` (see the module docstring)."""
    if argv[0] == "-m":
        if options.run_path or options.no_python:
            raise ValueError("a module (-m) runs with python -m: run_path and no_python take a script")
        return [python, "-u", "-m", *argv[1:]]
    if options.run_path:
        return [python, "-u", "-c", RUN_PATH, *argv]
    if options.no_python:
        return list(argv)
    return [python, "-u", *argv]


_COLLECTIVE = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError", "Connection closed by peer",
               "Connection reset by peer", "Broken pipe", "remote process exited")


def _why(returncode: int, tail: list[str]) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].startswith("Traceback (most recent call last)"):
            last = [line for line in tail[i + 1:] if line.strip() and not line[:1].isspace()]
            if last:
                return f"raised {last[-1]}"
    return ""


def run_main(argv: Sequence[str], *, rank: int, local_rank: int, host: str, env: Mapping[str, str],
             options: ScriptOptions | None = None, restart_count: int = 0, key: str = "") -> ScriptError | None:
    """Run ``argv`` for ``rank`` in a child process (see the module
    docstring), ``env`` (torchrun's variables) added to the proc's
    environment; ``key`` is the actor's, whose stop terminates it.  Blocks
    until the process ended."""
    argv = check_argv(argv)
    options = options or ScriptOptions()
    from monarch_core.runtime import proc_devices

    environ = {k: v for k, v in os.environ.items() if k not in PROC_ONLY}
    # torchrun's variables and what goes with them: OMP_NUM_THREADS, the host's CUDA_VISIBLE_DEVICES
    apply(dict(env), environ, devices=proc_devices())
    python = environ.get("PYTHON_EXEC") or sys.executable
    if argv[0] == "-m":
        what = f"module {argv[1]}"
    elif options.no_python and not options.run_path:
        what = f"command {argv[0]}"
        if shutil.which(argv[0], path=environ.get("PATH")) is None:
            raise FileNotFoundError(f"rank {rank} on host {host}: the command {argv[0]!r} is not found there (PATH, "
                                    f"working directory {os.getcwd()}); install it on every host or give its path")
    else:
        what = f"script {argv[0]}"
        target = os.path.abspath(argv[0])
        if not os.path.isfile(target):
            raise FileNotFoundError(
                f"rank {rank} on host {host}: the script {argv[0]!r} does not exist there ({target}, working "
                f"directory {os.getcwd()}); copy it to every host (HostMesh.sync_workspace) or give a path "
                f"that exists on each")
    files: dict[str, str | None] = {"stdout": None, "stderr": None}
    console = options.local_ranks_filter is None or local_rank in options.local_ranks_filter
    to_console = {"stdout": console, "stderr": console}
    if options.log_dir is not None:
        folder = os.path.join(options.log_dir, f"attempt_{restart_count}", str(rank))
        redirected, teed = std_for(options.redirects, local_rank), std_for(options.tee, local_rank)
        for bit, name in ((1, "stdout"), (2, "stderr")):
            if (redirected | teed) & bit:
                files[name] = os.path.join(folder, f"{name}.log")
            if redirected & bit and not teed & bit:
                to_console[name] = False
    rp = RankProcess(command(argv, options, python), environ, stdout_console=to_console["stdout"],
                     stderr_console=to_console["stderr"], stdout_file=files["stdout"], stderr_file=files["stderr"],
                     python=sys.executable)
    rp.start()
    key = key or f"pid{rp.pid}"
    register(key, rp)
    try:
        returncode = rp.pump()
    finally:
        unregister(key, rp)
    if returncode == 0:
        return None
    tail = rp.stderr_tail
    why = _why(returncode, tail)
    code = exit_status(returncode)
    message = f"rank {rank} on host {host}: {what} exited with status {code}" + (f" ({why})" if why else "")
    if rp.terminated_by is not None:
        message += f" after it was stopped ({rp.terminated_by})"
    if tail:
        message += "\nthe last lines of its stderr:\n" + "\n".join(tail)
    return ScriptError(message, rank=rank, exit_code=code, argv=argv, host=host, failed_at=time.time(),
                       collective=rp.terminated_by is None and any(m in line for line in tail for m in _COLLECTIVE))
