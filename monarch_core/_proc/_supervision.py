"""Supervision: failure reports, ``MeshFailure`` and ``unhandled_fault_hook``.

Every actor mesh has one owner: the actor that spawned it, or the process
(the client, for meshes created outside any actor).  When an actor dies --
``__init__`` raised, an endpoint raised a ``BaseException``, an exception had
nobody to go to (``broadcast``, explicit response ports), a message it sent
could not be delivered, its process died, or it was cut off (its host lost,
no acknowledgement) -- a *report* travels to the
owner's proc, where

* the owning mesh marks the rank failed (calls to any slice containing it
  then fail fast), and
* the owner's ``__supervise__(failure)`` is called: truthy means handled,
  falsy (or missing) means the owner fails too and the failure continues up,
  an exception in ``__supervise__`` fails the owner with that exception chained.

At the root (the client) an unhandled failure goes to
``monarch_core.actor.unhandled_fault_hook``; its default logs the report and
ends the client with exit code 1 (``KeyboardInterrupt`` in the main thread),
except for an ``__init__`` that raised: the client's calls to that mesh (and
its ``initialized``) raise it, and the default hook leaves it to them.
Each failed rank is reported at most once.

*Notices* take the same way without anything having failed: a scheduler's
``WorkerLaunch.report_notice`` ("Slurm job 12 will reach its time limit in
about 60 s") becomes a ``MeshFailure`` with ``notice = True`` for the owner
of the host mesh (its ``__supervise__``, or the client's hook).  One nobody
handles is logged at WARNING and dropped: a notice never ends anything.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import threading
from typing import Any, Callable

logger = logging.getLogger("monarch.supervision")

#: categories of a failure's cause
USER = "user"  # the user's code raised
SYSTEM = "system"  # monarch itself (undeliverable messages, protocol)
INFRASTRUCTURE = "infrastructure"  # a process was killed, a host was lost


def make_report(
    *,
    mesh_key: str,
    mesh_name: str,
    class_name: str,
    rank: int,
    coords: str,
    actor: str,
    proc: str,
    cause: str,
    category: str,
    chain: list[dict] | None = None,
    host: str | None = None,
    class_path: str | None = None,
) -> dict:
    """One failure event.  ``chain`` holds the events that caused it, the
    first failure of the cascade first; ``host`` is the machine the proc ran
    on; ``class_path`` the class as ``module.Qualname``, when known."""
    extra = {"class_path": class_path} if class_path else {}
    return {
        **extra,
        "mesh_key": mesh_key,
        "mesh_name": mesh_name,
        "class_name": class_name,
        "rank": rank,
        "coords": coords,
        "actor": actor,
        "proc": proc,
        "host": host,
        "cause": cause,
        "category": category,
        "chain": list(chain or []),
    }


def proc_failure_cause(reason: str, *, cause: str | None = None, seen_dead: bool = False,
                       could_not_start: str | None = None) -> str:
    """The ``cause`` of the report of a rank whose proc failed, saying what
    was observed -- never that the process died unless it was seen to:

    * ``cause``: what whoever declared the failure observed (``host lost:
      h4: ...``), used as it is;
    * ``seen_dead``: its exit was seen (its parent read the status, or its
      worker loop reported it): ``its process died: <reason>``;
    * ``could_not_start``: its process was never started (that message);
    * otherwise the proc was cut off (no acknowledgement for N s, nothing
      listening any more): ``lost contact with its process (not seen to
      exit): <reason>``.
    """
    if cause:
        return cause
    if seen_dead:
        return f"its process died: {reason}"
    if could_not_start:
        return could_not_start
    return f"lost contact with its process (not seen to exit): {reason}"


def _describe(ev: dict) -> str:
    where = f"actor {ev['mesh_name']}{ev['coords'] if ev['coords'] != '{}' else ''} ({ev['class_name']})"
    proc = ev["proc"]
    host = ev.get("host")  # reports from older peers have none
    if host and "on host " not in proc:
        proc = f"{proc} on host {host}"
    return f"{where} on {proc} [{ev['category']} error]: {ev['cause'].strip()}"


_KILLED = re.compile(r"was killed by (SIG[A-Z0-9]+|signal (\d+))")


def reference_summary(first: dict) -> str:
    """The first failure in the reference's (torchmonarch 0.7.0) words, which
    programs written for it match: ``The actor <module.Class> <actor> and all
    its descendants have failed: <why>``, ``<why>`` being ``the process this
    actor was running on failed: Killed(sig=9)`` for a proc killed by a
    signal, else the last line of the cause."""
    cause = first["cause"].strip()
    m = _KILLED.search(cause)
    if m:
        num = m.group(2) or getattr(signal.Signals, m.group(1), None)
        why = f"the process this actor was running on failed: Killed(sig={int(num) if num is not None else m.group(1)})"
    else:
        why = cause.splitlines()[-1] if cause else "unknown"
    what = first.get("class_path") or first["class_name"]
    return f"The actor {what} {first['actor']} and all its descendants have failed: {why}"


def cascade(events: list[dict]) -> str:
    """``First failure: ...`` then one ``Which then failed ...`` line per later
    event: how a failure travelled up the ownership tree."""
    lines = [f"First failure: {_describe(events[0])}"]
    lines += [f"Which then failed {_describe(ev)}" for ev in events[1:]]
    return "\n".join(lines)


class MeshFailure:
    """A failure of (part of) an actor mesh, delivered to its owner.

    ``mesh`` is the failed mesh (a reference: slicing it works, stopping it
    does not), ``mesh_name`` its name, ``ranks`` the failed ranks' coordinates,
    ``category`` ``"user"``, ``"system"`` or ``"infrastructure"``.  ``report()``
    (and ``str()``, after ``repr()``) gives the first failure of the cascade first, then how it
    propagated, then the first failure again in the reference's words
    (:func:`reference_summary`).
    """

    def __init__(self, mesh: Any, report: dict) -> None:
        self.mesh = mesh
        self.mesh_name: str = report["mesh_name"]
        self._report = report
        self.ranks: list[str] = [report["coords"]]
        self.category: str = report["category"]
        #: True for a *notice* (``WorkerLaunch.report_notice``): nothing has
        #: failed yet, but the owner should act (a Slurm job ends in 60 s:
        #: checkpoint).  Unhandled, it is logged, never fatal.
        self.notice: bool = bool(report.get("notice", False))

    @property
    def events(self) -> list[dict]:
        """The cascade, first failure first (each a dict: mesh_name, coords,
        class_name, actor, proc, host, category, cause)."""
        return [*self._report["chain"], {k: v for k, v in self._report.items() if k != "chain"}]

    def report(self) -> str:
        if self.notice:
            where = f" (host {self._report['proc']})" if self._report["proc"] else ""
            return f"notice for host mesh {self.mesh_name!r}{where}: {self._report['cause']}"
        evs = self.events
        ranks = ", ".join("its only rank" if r == "{}" else r for r in self.ranks)
        return (f"actor mesh {self.mesh_name!r} failed on rank(s) {ranks} ({self.category} error).\n" + cascade(evs)
                + "\n" + reference_summary(evs[0]))

    def __str__(self) -> str:
        """``repr()`` (``MeshFailure(mesh_name=...)``, as the reference's ``str()`` starts), then the report."""
        return f"{self!r}:\n{self.report()}"

    def __repr__(self) -> str:
        extra = ", notice=True" if self.notice else ""
        return f"MeshFailure(mesh_name={self.mesh_name!r}, ranks={self.ranks!r}, category={self.category!r}{extra})"


def make_notice(mesh: Any, mesh_name: str, host: str | None, coords: str, message: str) -> MeshFailure:
    """A notice about host mesh ``mesh`` (``host``: the host it concerns,
    ``None``: all of them) as the ``MeshFailure`` its owner receives."""
    report = make_report(
        mesh_key="", mesh_name=mesh_name, class_name="HostMesh", rank=-1, coords=coords,
        actor=f"host mesh {mesh_name}", proc=host or "", cause=message, category=INFRASTRUCTURE,
    )
    report["notice"] = True
    return MeshFailure(mesh, report)


# ------------------------------------------------------------------ the root



def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called (on a helper thread of the client) with a failure nobody handled.

    Replace it by assigning ``monarch_core.actor.unhandled_fault_hook``.  A
    normal return drops the fault; raising anything (including ``SystemExit``)
    leaves it unhandled.  The default logs the report and leaves it unhandled,
    which ends the client with exit code 1 by delivering ``KeyboardInterrupt``
    to the main thread -- except for an actor whose ``__init__`` raised, a
    failure the calls to its mesh (and its ``initialized``) raise as
    ``ActorError``: the default hook is not called for it."""
    raise SystemExit(1)


#: The hook in force: the default, or what the user assigned to
#: ``monarch_core.actor.unhandled_fault_hook`` (that module attribute reads
#: and writes this through :func:`fault_hook` / :func:`set_fault_hook`).
_fault_hook: list[Callable[[MeshFailure], Any]] = [unhandled_fault_hook]


def fault_hook() -> Callable[[MeshFailure], Any]:
    """The ``unhandled_fault_hook`` in force."""
    return _fault_hook[0]


def set_fault_hook(fn: Callable[[MeshFailure], Any]) -> None:
    """Make ``fn`` the ``unhandled_fault_hook`` (``TypeError`` unless callable)."""
    if not callable(fn):
        raise TypeError(f"unhandled_fault_hook must be a callable taking a MeshFailure, got {fn!r}")
    _fault_hook[0] = fn


def deliver_to_root(failure: MeshFailure) -> None:
    """Run the (possibly user-assigned) hook on a helper thread."""
    threading.Thread(target=_run_hook, args=(failure,), name="monarch-fault-hook", daemon=True).start()


def _run_hook(failure: MeshFailure) -> None:
    hook = _fault_hook[0]
    if getattr(failure, "notice", False):
        _run_notice_hook(hook, failure)
        return
    from monarch_core._proc import _state

    first = failure.events[0]
    if hook is unhandled_fault_hook and first.get("init") and len(failure.events) == 1:
        # An ``__init__`` that raised: the ``initialized`` future and every call of its mesh raise
        # the ``ActorError`` (actor, rank, remote traceback), which is where the user hears of it --
        # once, and without the client being interrupted (it may catch it and go on).  A hook the
        # user assigned sees it as any other failure.
        _state.emit("supervision_handled", mesh=failure.mesh_name, handled_by="unhandled_fault_hook", handled=True)
        logger.info("__init__ of %s raised; the calls to its mesh %r raise it (not ending the client)",
                    first.get("actor"), failure.mesh_name)
        return
    try:
        hook(failure)
    except BaseException as e:  # noqa: BLE001 - any exception means "unhandled"
        _state.emit("supervision_handled", mesh=failure.mesh_name, handled_by="unhandled_fault_hook", handled=False)
        with _ending_lock:
            already, _ending[0] = _ending[0], True
        if already:  # the client is ending for an earlier one: summed up, not reported again in full
            _also_failed(failure)
            return
        logger.error(
            "unhandled supervision failure (%s); ending the client with exit code 1:\n%s",
            type(e).__name__,
            failure.report(),
            extra=_state.instrumentation().log_extra(failure.category, actor=first.get("actor"),
                                                     mesh=failure.mesh_name, rank=first.get("rank"),
                                                     proc=first.get("proc")),
        )
        _end_client()
        return
    _state.emit("supervision_handled", mesh=failure.mesh_name, handled_by="unhandled_fault_hook", handled=True)
    logger.warning("supervision failure dropped by unhandled_fault_hook:\n%s", failure.report())


#: set once an unhandled failure ends the client: the failures after it (a lost
#: proc fails every actor mesh it held -- thousands, at scale) are summed up
#: in one ERROR line a moment later instead of a full report each.
_ending = [False]
_ending_lock = threading.Lock()
_more: list[MeshFailure] = []
#: seconds the summary waits for more failures to arrive before it is logged
SUMMARY_DELAY = 0.5


def _also_failed(failure: MeshFailure) -> None:
    with _ending_lock:
        _more.append(failure)
        if len(_more) > 1:  # a summary is already due: it will name this one too
            return
    t = threading.Timer(SUMMARY_DELAY, _log_more)
    t.daemon = True
    t.start()


def _log_more() -> None:
    """Log the failures gathered since the last summary (a timer's, and at exit: the client may end first)."""
    with _ending_lock:
        batch = list(_more)
        _more.clear()
    if not batch:
        return
    names = [f.mesh_name for f in batch]
    shown = ", ".join(repr(n) for n in names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    first = batch[0].events[0] if batch[0].events else {}
    cause = str(first.get("cause", "")).strip().splitlines()
    logger.error(
        "%d more actor mesh(es) failed while the client was ending for the failure above: %s (the first: %s: %s)",
        len(batch), shown, first.get("actor", "?"), cause[-1] if cause else "?")


atexit.register(_log_more)


def _run_notice_hook(hook: Any, failure: MeshFailure) -> None:
    """A notice at the root: the user's hook sees it; nobody's (the default
    hook, or one that raises) leaves a WARNING, never an exit."""
    if hook is unhandled_fault_hook:
        logger.warning("%s (nobody handles it: assign monarch_core.actor.unhandled_fault_hook, or handle it in the "
                       "owner's __supervise__, to act on it)", failure.report())
        return
    try:
        hook(failure)
    except BaseException as e:  # noqa: BLE001 - a notice is never fatal
        logger.warning("unhandled_fault_hook raised %s on a notice (a notice is never fatal): %s",
                       type(e).__name__, failure.report())


def _end_client() -> None:
    from monarch_core._proc import _state

    if _state._requested_exit_code:
        return  # already ending: a second interrupt would cut short the shutdown at exit
    _state.request_exit_code(1)
    main = threading.main_thread()
    try:
        if main.ident is not None:  # (set: the main thread runs)
            signal.pthread_kill(main.ident, signal.SIGINT)  # wakes sleeps and lock waits
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        import _thread

        _thread.interrupt_main()


def proc_level_unhandled(failure: MeshFailure) -> None:
    """In a worker, a failure of a mesh owned by the proc itself (not by an
    actor) has nobody above it on this proc: the proc fails, and its own
    owner learns it from the process exit."""
    logger.error("unhandled failure of a mesh owned by this proc; the proc exits:\n%s", failure.report())
    os._exit(1)
