"""``launch``: torchrun's whole job on a host mesh, from Python or from
``monarch torchrun``.

Contract: spawn ``nproc_per_node`` procs on every host, give them torchrun's
environment, run ``argv`` on every rank (``SPMDActor.main``: a fresh
``python`` process per rank) and wait.  When every rank returns, stop the
procs and return.  When a rank fails (its script raises or exits non-zero,
its proc dies, its host is lost), wait a moment for the others to report
(:data:`SETTLE_S`), then stop every proc of the attempt (each rank's
process still running gets SIGTERM, then SIGKILL; bounded by the stop grace
and its SIGKILL escalation) and either
start again (``max_restarts``, with ``TORCHELASTIC_RESTART_COUNT`` counting
up) or raise :class:`JobFailed` naming the first failure.  The first failure
is the first rank that failed on its own: a rank whose collective broke
because a peer failed comes after every rank that did not.  Ctrl-C
(``KeyboardInterrupt``, or any exception) stops every proc, so every rank's
process gets SIGTERM, before it propagates.
"""

from __future__ import annotations

import itertools
import logging
import re
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import monarch_core.actor as _api
from monarch_core.errors import ActorError, MonarchError, SupervisionError, UndeliverableMessageError
from monarch_core.runtime import AddrType
from monarch_spmd._actor import ACTOR_NAME, SPMDActor, check_master
from monarch_spmd._env import DEFAULT_ROLE
from monarch_spmd._script import ScriptError, ScriptOptions, check_argv

logger = logging.getLogger("monarch.spmd")

#: after the first failure, how long the other ranks get to report theirs
SETTLE_S = 2.0
#: how long one setup step (spawn, rendezvous address, stop) may take
STEP_TIMEOUT_S = 300.0

_EXIT = re.compile(r"exited with code (-?\d+)")
_SIGNAL = re.compile(r"killed by (SIG[A-Z0-9]+)|killed by signal (\d+)")


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure: ``rank``, its ``coords``, ``exit_code`` (the
    status ``python`` would have exited with; ``128 + N`` for a signal N, as
    a shell reports it), ``error`` (the exception the caller got) and
    ``secondary`` (its collective broke because another rank failed)."""

    rank: int
    coords: dict[str, int]
    exit_code: int
    error: BaseException
    secondary: bool

    def describe(self) -> str:
        first = str(self.error).splitlines()[0] if str(self.error) else type(self.error).__name__
        if isinstance(self.error, ActorError) and isinstance(self.error.exception, ScriptError):
            first = str(self.error.exception).splitlines()[0]
        return f"rank {self.rank} {self.coords}: exit status {self.exit_code}: {first}"


class JobFailed(MonarchError, RuntimeError):
    """A ``launch`` whose ranks did not all succeed: ``first`` (the
    :class:`RankFailure` that started it), ``failures`` (every rank that
    failed, first first), ``exit_code`` (``first.exit_code``) and
    ``attempts`` (how many times the job ran)."""

    def __init__(self, first: RankFailure, failures: list[RankFailure], attempts: int) -> None:
        self.first, self.failures, self.attempts = first, failures, attempts
        self.exit_code = first.exit_code
        more = f" ({len(failures) - 1} other rank(s) failed after it)" if len(failures) > 1 else ""
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"the job failed{tries}: first failure {first.describe()}{more}")


def _exit_code_of(error: BaseException) -> tuple[int, bool]:
    """(exit status, secondary) of one rank's error."""
    if isinstance(error, ActorError):
        exc = error.exception
        if isinstance(exc, ScriptError):
            return exc.exit_code or 1, exc.collective
        return 1, False
    text = str(error)
    m = _SIGNAL.search(text)
    if m:
        if m.group(1):
            try:
                return 128 + int(signal.Signals[m.group(1)]), False
            except KeyError:
                return 1, False
        return 128 + int(m.group(2)), False
    m = _EXIT.search(text)
    if m:
        code = int(m.group(1))
        return (code if code > 0 else 128 - code if code < 0 else 1), False
    return 1, False


def _coords(extent: Any) -> list[dict[str, int]]:
    labels, sizes = list(extent.labels), list(extent.sizes)
    return [dict(zip(labels, c)) for c in itertools.product(*(range(s) for s in sizes))]


class _Attempt:
    """One run of the job: its procs, its actors, one call per rank."""

    def __init__(self, procs: Any, actors: Any) -> None:
        self.procs, self.actors = procs, actors
        self.ranks = _coords(procs.extent)
        self.failures: list[RankFailure] = []

    def run(self, master: tuple[str, Any], argv: list[str], kwargs: dict[str, Any]) -> list[RankFailure]:
        futures = {r: self.actors.slice(**c).main.call_one(master[0], master[1], argv, **kwargs)
                   for r, c in enumerate(self.ranks)}
        first_at: float | None = None
        while futures:
            if first_at is not None and time.monotonic() - first_at > SETTLE_S:
                break
            for r, fut in list(futures.items()):
                try:
                    fut.get(timeout=0.02 if len(futures) > 1 else 0.2)
                except TimeoutError:
                    continue
                except (ActorError, SupervisionError, UndeliverableMessageError) as e:
                    code, secondary = _exit_code_of(e)
                    self.failures.append(RankFailure(r, self.ranks[r], code, e, secondary))
                    first_at = first_at or time.monotonic()
                del futures[r]
        return sorted(self.failures, key=lambda f: f.secondary)  # stable: arrival order within each kind


def launch(host_mesh: Any, argv: Sequence[str], *, nproc_per_node: int = 1, role: str = DEFAULT_ROLE,
           run_id: str | None = None, max_restarts: int = 0, master_addr: str | None = None,
           master_port: int | None = None, use_ipaddr: AddrType | None = None, name: str = "spmd",
           stream_output: bool = True, local_addr: str | None = None, options: ScriptOptions | None = None) -> int:
    """Run ``argv`` as a torchrun job on ``host_mesh`` (see the module
    docstring); returns how many attempts it took.  ``stream_output``: every
    rank's output reaches this process prefixed with its rank and host.
    ``local_addr`` (torchrun's ``--local-addr``): the address of rank 0's
    host the others reach the rendezvous at (``MASTER_ADDR``), the port
    still one free there; not with ``master_addr``.  ``options``: how each
    rank runs its script and where its output goes
    (:class:`~monarch_spmd._script.ScriptOptions`; its ``log_dir`` is the
    job's: attempt ``k`` of rank ``r`` writes ``log_dir/attempt_k/r/``)."""
    argv = check_argv(argv)
    check_master(master_addr, master_port)
    if local_addr is not None and master_addr is not None:
        raise ValueError(f"give local_addr ({local_addr!r}: the address of rank 0's host, which hosts the "
                         f"rendezvous) or master_addr ({master_addr!r}), not both")
    if options is not None and not isinstance(options, ScriptOptions):
        raise TypeError(f"options must be a ScriptOptions, got {type(options).__name__}")
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be a positive int, got {nproc_per_node!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    run_id = run_id or uuid.uuid4().hex
    ours: set[str] = set()
    previous = _api.unhandled_fault_hook

    def hook(failure: Any) -> Any:  # our procs' failures are the job's to report; others go on as before
        if getattr(failure, "mesh_name", None) in ours:
            return None
        return previous(failure)

    _api.unhandled_fault_hook = hook
    try:
        for attempt in range(max_restarts + 1):
            procs = host_mesh.spawn_procs(per_host={"gpus": nproc_per_node}, name=f"{name}{attempt}")
            ours.update({procs.name, ACTOR_NAME})
            try:
                if stream_output:
                    procs.logging_option(stream_to_client=True, aggregate_window_sec=None)
                actors = procs.spawn(ACTOR_NAME, SPMDActor)
                master: tuple[str, Any]  # (address, port: None lets rank 0 pick one)
                if master_addr is None:
                    first = dict.fromkeys(procs.extent.labels, 0)
                    master = actors.slice(**first).get_host_port.call_one(use_ipaddr).get(timeout=STEP_TIMEOUT_S)
                    if local_addr is not None:
                        master = (local_addr, master[1])
                else:
                    master = (master_addr, master_port)
                logger.info("%s: attempt %d of %d on %d rank(s), rendezvous at %s:%s", name, attempt + 1,
                            max_restarts + 1, len(_coords(procs.extent)), master[0], master[1])
                run = _Attempt(procs, actors)
                failures = run.run(master, argv, {"role": role, "run_id": run_id, "restart_count": attempt,
                                                  "max_restarts": max_restarts, "options": options})
            finally:
                procs.stop("the job's attempt ended").get(timeout=STEP_TIMEOUT_S)
            if not failures:
                return attempt + 1
            if attempt == max_restarts:
                raise JobFailed(failures[0], failures, attempt + 1)
            logger.warning("%s: %s; restarting every rank (restart %d of %d)", name, failures[0].describe(),
                           attempt + 1, max_restarts)
        raise AssertionError("unreachable")
    finally:
        _api.unhandled_fault_hook = previous
