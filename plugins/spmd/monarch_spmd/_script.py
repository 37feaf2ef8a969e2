"""Run a training script or module inside a proc as ``python argv...`` would.

Contract of :func:`run_main`:

* ``argv = ["train.py", "--lr", "0.1"]`` runs the file as ``__main__`` with
  ``sys.argv == argv`` and the script's directory first on ``sys.path``;
  ``argv = ["-m", "pkg.train", ...]`` runs the module as ``python -m`` does
  (``sys.argv[0]`` is the module's file, the working directory first on
  ``sys.path``).
* It returns when the script returns, or calls ``sys.exit(0)``/``sys.exit()``.
  A script that raises, or exits with another status, gives a
  :class:`ScriptError` (its ``exit_code`` is what ``python`` would have
  exited with: 1 for an exception or ``sys.exit("message")``), chained to
  the original exception.
* ``sys.argv``, ``sys.path`` and ``sys.modules['__main__']`` are restored
  afterwards, and the ``torch.distributed`` process groups the script left
  initialized are ended (:func:`release`), as the end of the process would
  under torchrun: a failing rank so releases its peers' collectives (they
  fail instead of waiting for it) and the next ``main`` can initialize again.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from typing import Any, Sequence


class ScriptError(RuntimeError):
    """A rank's script failed: ``rank``, ``exit_code`` (as ``python`` would
    exit), ``argv``, ``host``, ``failed_at`` (the rank's ``time.time()``)
    and ``collective`` (True when the failure came out of a
    ``torch.distributed`` operation, usually because another rank failed
    first)."""

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


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code
    return 1  # sys.exit("message"): python prints it and exits 1


def _from_collective(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) is a torch.distributed
    error: what the other ranks see after a peer failed or died."""
    dist = _torch_distributed()
    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if isinstance(k, type))
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if kinds and isinstance(e, kinds):
            return True
        text = str(e)
        if any(s in text for s in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                   "remote process exited")):
            return True
        e = e.__cause__ or e.__context__
    return False


def _torch_distributed() -> Any:
    """``torch.distributed`` if the script imported torch (never imports it)."""
    return getattr(sys.modules.get("torch"), "distributed", None)


def _release_process_group(failed: bool) -> None:
    """End what the script left of ``torch.distributed``, as the end of its
    process would: after a failure abort every process group first (that
    closes its connections, so the peers' pending collectives fail now
    instead of at their timeout), then destroy them."""
    dist = _torch_distributed()
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if failed:
        try:
            dist.distributed_c10d._abort_process_group()  # every group, the default one too
        except Exception:
            try:
                dist.group.WORLD.abort()
            except Exception:  # nothing left to abort: a peer's failure broke it already
                pass
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def _end_script_state(error: BaseException, main_module: Any) -> None:
    """Drop what the failed script still holds, as its process's exit would:
    its module namespace (reachable from the traceback) is cleared and the
    traceback's frames let go of their locals, so that the objects holding
    connections (a ``DistributedDataParallel`` keeps its process group, and a
    process group keeps its sockets) are freed now.  Closing those sockets is
    what makes the other ranks' pending collectives fail at once.  The
    traceback stays printable."""
    import gc
    import traceback

    keep = getattr(main_module, "__dict__", None)
    namespaces = []
    tb = error.__traceback__
    while tb is not None:
        g = tb.tb_frame.f_globals
        if tb.tb_frame.f_code.co_name == "<module>" and g.get("__name__") == "__main__" and g is not keep:
            if all(g is not n for n in namespaces):
                namespaces.append(g)
        tb = tb.tb_next
    e: BaseException | None = error
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
    for g in namespaces:
        g.clear()
    del namespaces, g
    gc.collect()


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


def run_main(argv: Sequence[str], *, rank: int, host: str) -> ScriptError | None:
    """Run ``argv`` here (see the module docstring): ``None`` when it
    succeeded (its state already released), else the :class:`ScriptError`
    to report, whose state :func:`release` ends.  Raises before running
    when ``argv`` is malformed or the script does not exist."""
    argv = check_argv(argv)
    if argv[0] == "-m":
        what = f"module {argv[1]}"
        target = argv[1]
    else:
        what = f"script {argv[0]}"
        target = os.path.abspath(argv[0])
        if not os.path.isfile(target):
            raise FileNotFoundError(
                f"rank {rank} on host {host}: the script {argv[0]!r} does not exist there ({target}, working "
                f"directory {os.getcwd()}); copy it to every host (HostMesh.sync_workspace) or give a path "
                f"that exists on each")
    saved = (list(sys.argv), list(sys.path), sys.modules.get("__main__"))
    code = 0
    error: BaseException | None = None
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
        if code != 0:
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr, flush=True)  # as python does for sys.exit("message")
            error = e
    except Exception as e:
        code, error = 1, e
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        if saved[2] is not None:
            sys.modules["__main__"] = saved[2]
    if error is None:
        release(None)
        return None
    why = f"raised {type(error).__name__}: {error}" if not isinstance(error, SystemExit) else "called sys.exit"
    failure = ScriptError(f"rank {rank} on host {host}: {what} exited with status {code} ({why})", rank=rank,
                          exit_code=code, argv=argv, host=host, failed_at=time.time(),
                          collective=_from_collective(error))
    failure.__cause__ = error
    return failure


def release(failure: ScriptError | None) -> None:
    """End the script's ``torch.distributed`` state (and, after a failure,
    what it still holds: see :func:`_end_script_state`), as the end of its
    process would.  After a failure, call it once the failure was reported:
    it is what makes the other ranks' collectives fail, and the caller
    should hear of this rank first."""
    _release_process_group(failure is not None)
    if failure is not None and failure.__cause__ is not None:
        _end_script_state(failure.__cause__, sys.modules.get("__main__"))
