"""``scheduler = "slurm"``: host meshes from Slurm jobs.

Three ways to get the job (:meth:`SlurmScheduler.allocate`):

* **attach** -- ``job_id = N`` in the entry, or ``MONARCH_SLURM_JOB_ID=N``:
  the running (or pending: it waits) job ``N``; ``shutdown()`` cancels it.
* **inside** -- the client runs inside an allocation (``SLURM_JOB_ID`` is set:
  an ``sbatch`` script, an ``salloc`` shell, an ``srun`` task): that job, or
  the first ``nodes`` of its nodes.  The job is the user's: releasing ends
  only the worker step.
* **submit** -- otherwise: ``sbatch`` a job for the entry (``partition``,
  ``nodes``, ``time`` ...) whose batch script only holds the allocation, and
  wait (``queue_timeout``) until it runs.  ``shutdown()`` cancels it;
  ``stop()`` and then the client's end keep it (attach again with
  ``job_id``).

Then, in every mode, one worker loop per node as a step of the job
(:mod:`._step`, :mod:`._node`), each with TLS credentials issued by this
client for that node alone, passed in a 0600 file of a 0700 session
directory under ``state_dir`` (removed as soon as read, and the directory at
release).

Why the batch script does not start the workers itself: a worker trusts the
session CA of the client that started it (in that client's memory only), so
worker loops belong to one client session, while the job may outlive it
(``stop()``, ``requeue``).  Each client therefore starts its own worker step
in the job (``srun --jobid=N --overlap``), whose lifetime is the client's
``srun`` process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import (
    Allocation,
    AllocationRequest,
    HostHandle,
    Scheduler,
    SyncedHost,
    WorkerLaunch,
    Workspace,
)
from monarch_scheduler_slurm import _settings
from monarch_scheduler_slurm._cli import SlurmAPI, SlurmCLI, SlurmCommandError, expand_nodes, slurm_env
from monarch_scheduler_slurm._params import ALL_KEYS, DEFAULT_SYNC_DIR, SlurmParams, parse_params
from monarch_scheduler_slurm._step import WorkerStep

logger = logging.getLogger("monarch.slurm")

#: The batch script of a submitted job: it only holds the allocation.
HOLD_SCRIPT = """#!/bin/sh
# monarch-scheduler-slurm: this job holds its nodes for a monarch client,
# which starts the worker loops as steps of the job (srun --jobid --overlap).
# It ends when that client shuts its host mesh down (scancel), at its time
# limit, or with `scancel <job id>`.  One process, no child: nothing of it
# can outlive the job, however the job ends (a killed slurmd included).
PATH=/usr/local/bin:/usr/bin:/bin:$PATH
exec sleep infinity
"""

#: Seconds between two ``squeue`` polls while a job waits to run.
POLL = 0.25
#: Seconds a node's address (``NodeAddr``, from ``sinfo``) is reused: the
#: route found by ``client_address`` serves the ``allocate`` that follows it
#: (one ``sinfo`` per bring-up instead of two).
ADDRESS_TTL = 30.0


def _elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.0f}s"


class SlurmAllocation(Allocation):
    """A Slurm job's nodes with one worker loop each."""

    def __init__(self, api: SlurmAPI, job_id: str, *, owned: bool, requeue: bool, session_dir: str | None) -> None:
        self.api = api
        self.job_id = job_id
        #: this client submitted or attached to the job: releasing cancels it
        self.owned = owned
        self.requeue = requeue
        #: this client submitted the job (with the entry's --signal)
        self.submitted = False
        self.session_dir = session_dir
        self.step: WorkerStep | None = None
        self.hosts: list[HostHandle] = []
        self.extent: dict[str, int] | None = None
        self.released = threading.Event()
        #: the hosts were handed to the core: losses are reported from now on
        self.live = threading.Event()
        #: the nodes' Python and the entry (for sync_workspace's steps)
        self.python: str | None = None
        self.params: SlurmParams | None = None

    def sync_workspace(self, workspace: Workspace, hosts: Sequence[str], *, conda: bool = False,
                       auto_reload: bool = False) -> dict[str, SyncedHost]:
        """Give the nodes ``hosts`` the workspace (and, ``conda=True``, the
        client's environment): where they already share it (a marker file
        looked for from a step on each node) nothing is copied and the procs
        get the client's own paths; otherwise it is copied into each node's
        ``sync_dir`` through job steps and ``sbcast`` (:mod:`._sync`).
        ``MONARCH_SLURM_SYNC_COPY=1`` always copies.  ``auto_reload`` is the
        core's (a watcher that calls this again)."""
        from monarch_core.hookspecs import active_environment
        from monarch_scheduler_slurm._sync import SlurmSync

        if self.released.is_set():
            raise AllocationError(f"Slurm job {self.job_id}: the hosts were released")
        known = {h.name for h in self.hosts}
        unknown = [h for h in hosts if h not in known]
        if unknown:
            raise AllocationError(f"Slurm job {self.job_id}: no such node(s) {unknown}; known: {sorted(known)}")
        p = self.params
        env = active_environment() if conda else None
        sync = SlurmSync(self.api, self.job_id, self.python or sys.executable,
                         p.sync_dir if p is not None else DEFAULT_SYNC_DIR,
                         force_copy=bool(_settings.get("MONARCH_SLURM_SYNC_COPY")),
                         srun_args=p.srun_args if p is not None else (), progress=_Progress)
        return sync.sync(workspace, list(hosts), env)

    def _end_step(self) -> None:
        self.released.set()
        if self.step is not None:
            self.step.stop()
        if self.session_dir is not None:
            shutil.rmtree(self.session_dir, ignore_errors=True)

    def release(self) -> None:
        """End the worker step, remove the session directory, and cancel the
        job when this client owns it -- unless it was requeued and the entry
        asked for ``requeue`` (it keeps its place for a restarted client)."""
        self._end_step()
        if not self.owned:
            return
        try:
            info = self.api.job(self.job_id, timeout=10)
        except SlurmCommandError as e:
            logger.warning("cannot see Slurm job %s before cancelling it: %s", self.job_id, e)
            info = None
        if info is not None and info.finished:
            return
        requeued = info is not None and (info.waiting or (self.step is not None and self.step.requeued))
        if self.requeue and requeued and info is not None:  # (requeued implies info)
            logger.warning("Slurm job %s was requeued (%s) and is kept (requeue = true): a restarted client attaches "
                           "to it with job_id = %s or MONARCH_SLURM_JOB_ID=%s; `scancel %s` ends it",
                           self.job_id, info.describe(), self.job_id, self.job_id, self.job_id)
            return
        self.api.cancel(self.job_id, timeout=10)
        logger.info("cancelled Slurm job %s", self.job_id)

    def detach(self) -> None:
        """The client ends with the host mesh stopped: end this client's
        worker step and keep the job for a later client."""
        self._end_step()
        if self.owned:
            logger.warning("Slurm job %s keeps running (the host mesh was stopped, not shut down): attach to it "
                           "again with job_id = %s (or MONARCH_SLURM_JOB_ID=%s); `scancel %s` ends it",
                           self.job_id, self.job_id, self.job_id, self.job_id)


class SlurmScheduler(Scheduler):
    """The ``slurm`` scheduler (see the module docstring and ``docs/slurm.md``)."""

    name = "slurm"
    transport = "tls"
    params = ALL_KEYS

    def __init__(self, api: SlurmAPI | None = None) -> None:
        # The adapter boundary: a pyslurm-based SlurmAPI would be chosen here.
        self.api = api if api is not None else SlurmCLI(env=slurm_env())
        self._addresses: dict[str, tuple[float, str]] = {}  # node -> (when sinfo said, NodeAddr)
        self._addresses_lock = threading.Lock()

    def _node_addresses(self, nodes: Sequence[str], *, timeout: float) -> dict[str, str]:
        """``api.node_addresses(nodes)``, from what an ``sinfo`` of the last
        :data:`ADDRESS_TTL` seconds said when it covered every one of ``nodes``."""
        now = time.monotonic()
        with self._addresses_lock:
            known = {n: self._addresses[n] for n in nodes if n in self._addresses}
        if len(known) == len(nodes) and all(now - t < ADDRESS_TTL for t, _ in known.values()):
            return {n: a for n, (_, a) in known.items()}
        found = self.api.node_addresses(list(nodes), timeout=timeout)
        with self._addresses_lock:
            for n, a in found.items():
                self._addresses[n] = (now, a)
        return found

    # -- the contract ---------------------------------------------------
    def validate(self, request: AllocationRequest) -> None:
        parse_params(request.params, request.source)

    def client_address(self, request: AllocationRequest) -> str | None:
        """``tls://<this host's address on the route to the job's first node>:0``
        (a UDP socket's ``connect`` picks the route; nothing is sent)."""
        p = parse_params(request.params, request.source)
        try:
            nodes = self._known_nodes(p)
            if not nodes:
                return None
            node = nodes[0]
            # all the job's nodes when they are known: allocate needs them next
            addr = self._node_addresses(nodes, timeout=10).get(node, node)
            with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((addr, 9))
                local = s.getsockname()[0]
        except (OSError, AllocationError) as e:
            logger.info("%s: no route to the job's nodes found (%s); the client listens on the tls default",
                        request.source, e)
            return None
        return f"tls://[{local}]:0" if ":" in local else f"tls://{local}:0"

    def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> SlurmAllocation:
        p = parse_params(request.params, request.source)
        if launch.transport != "tls":
            raise AllocationError(
                f"slurm scheduler ({p.source}): this client runs the {launch.transport!r} transport, but the job's "
                "nodes talk to it over tls (mutually authenticated). Leave the transport to hosts_from_config (it "
                "enables tls), or call enable_transport('tls://<an address the nodes reach>:0') first"
            )
        deadline = time.monotonic() + launch.timeout
        job_id, mode = self._job_of(p)
        owned = mode != "inside"
        alloc = SlurmAllocation(self.api, job_id or "", owned=owned, requeue=p.requeue, session_dir=None)
        try:
            if mode == "submit":
                job_id = self._submit(p, launch, deadline)
                alloc.job_id, alloc.submitted = job_id, True
            elif p.submit_keys:
                logger.info("%s: %s Slurm job %s; %s apply only when submitting a job, not used", request.source,
                            "inside" if mode == "inside" else "attaching to", job_id, p.submit_keys)
            assert job_id is not None
            nodes = self._wait_running(p, job_id, launch, deadline, queued=mode == "submit")
            if p.nodes is not None and mode != "submit":
                if p.nodes > len(nodes):
                    raise AllocationError(
                        f"{p.source}: nodes = {p.nodes}, but Slurm job {job_id} has {len(nodes)} node(s) "
                        f"({', '.join(nodes)}); ask for at most {len(nodes)}, or for a bigger allocation"
                    )
                nodes = nodes[: p.nodes]
            self._start_workers(p, alloc, job_id, nodes, launch, deadline)
        except BaseException:
            self._abandon(alloc)
            raise
        logger.info("%s: Slurm job %s, %d worker loop(s) on %s", request.source, job_id, len(nodes), ", ".join(nodes))
        return alloc

    # -- modes --------------------------------------------------------------
    def _job_of(self, p: SlurmParams) -> tuple[str | None, str]:
        inside = os.environ.get("SLURM_JOB_ID", "").strip()
        job = p.job_id
        if job is None:
            env_job = _settings.get("MONARCH_SLURM_JOB_ID")
            if env_job:
                if not str(env_job).strip().isdigit():
                    raise AllocationError(f"MONARCH_SLURM_JOB_ID must be a Slurm job id (digits), got {env_job!r}")
                job = str(env_job).strip()
        if job is not None and job != inside:
            return job, "attach"
        if inside:  # (attaching to the job this client runs in is using it: it is not ours to cancel)
            return inside, "inside"
        return None, "submit"

    def _known_nodes(self, p: SlurmParams) -> list[str]:
        """The job's nodes when there is a job (inside, attaching), else one
        node of the partition the job will be submitted to; the first one
        gives the route."""
        job_id, mode = self._job_of(p)
        if mode == "inside" and os.environ.get("SLURM_JOB_NODELIST"):
            nodes = expand_nodes(os.environ["SLURM_JOB_NODELIST"])
            return nodes[: p.nodes] if p.nodes is not None else nodes
        if job_id is not None:
            info = self.api.job(job_id, timeout=10)
            if info is not None and info.nodes:
                return list(info.nodes[: p.nodes] if p.nodes is not None else info.nodes)
        try:
            nodes = self.api.partition_nodes(p.partition, timeout=10)
        except SlurmCommandError:  # a partition sinfo does not know: sbatch will say so; any node gives the route
            nodes = []
        if not nodes and p.partition:
            nodes = self.api.partition_nodes(None, timeout=10)
        return nodes[:1]

    def _submit(self, p: SlurmParams, launch: WorkerLaunch, deadline: float) -> str:
        late = p.late_warning()
        if late is not None:
            logger.warning("%s: %s", p.source, late)
        state = _state_dir(p)
        args = [*p.sbatch_options(), "--output=/dev/null", f"--chdir={state}"]
        try:
            job_id = self.api.submit(HOLD_SCRIPT, args, timeout=max(1.0, deadline - time.monotonic()))
        except SlurmCommandError as e:
            raise AllocationError(f"{p.source}: Slurm refused the job: {e}") from None
        logger.info("%s: submitted Slurm job %s (%s)", p.source, job_id, " ".join(args))
        return job_id

    def _wait_running(self, p: SlurmParams, job_id: str, launch: WorkerLaunch, deadline: float,
                      *, queued: bool) -> list[str]:
        """The job's nodes once it runs; ``AllocationError`` (job cancelled
        when this client submitted it) if it ends or waits too long."""
        inside_nodes = os.environ.get("SLURM_JOB_NODELIST") if os.environ.get("SLURM_JOB_ID") == job_id else None
        if inside_nodes:  # our own allocation: it runs, and its node list is in the environment
            return expand_nodes(inside_nodes)
        t0 = time.monotonic()
        limit = deadline - min(60.0, 0.25 * (deadline - t0))  # leave time for the workers
        if p.queue_timeout is not None:
            limit = min(deadline - 1.0, t0 + p.queue_timeout)
        bar = _Progress(f"Slurm job {job_id}")
        try:
            while True:
                info = self.api.job(job_id, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
                if info is None:
                    raise AllocationError(f"{p.source}: Slurm job {job_id} does not exist (any more): `squeue -j "
                                          f"{job_id}` does not know it; submit a new one (remove job_id)")
                if info.state == "RUNNING" and info.nodes:
                    logger.info("Slurm job %s runs on %s after %.2fs in the queue", job_id, ",".join(info.nodes),
                                time.monotonic() - t0)
                    return list(info.nodes)
                if info.finished:
                    raise AllocationError(f"{p.source}: Slurm job {job_id} ended before it ran ({info.describe()})")
                never = info.never_runs
                if never is not None:  # waiting would only run into the timeout
                    if queued:
                        self.api.cancel(job_id, timeout=10)
                    action = "it was cancelled" if queued else "it was left as it is (this client did not submit it)"
                    raise AllocationError(f"{p.source}: Slurm will never run job {job_id} as asked ({info.describe()}): "
                                          f"{never}; {action}")
                bar.show(f"{info.describe()}, waited {_elapsed(t0)}")
                if time.monotonic() >= limit or launch.cancelled.is_set():
                    waited = time.monotonic() - t0
                    action = "it was cancelled" if queued else "it was left as it is (this client did not submit it)"
                    if queued:
                        self.api.cancel(job_id, timeout=10)
                    knob = ("queue_timeout in the entry" if p.queue_timeout is not None else
                            "queue_timeout in the entry, or hosts_from_config(..., timeout=) / "
                            "MONARCH_ALLOCATE_TIMEOUT")
                    raise AllocationError(f"{p.source}: Slurm job {job_id} did not start within {waited:.0f}s "
                                          f"({info.describe()}); {action}. Raise {knob} to wait longer")
                time.sleep(POLL)
        finally:
            bar.close()

    def _start_workers(self, p: SlurmParams, alloc: SlurmAllocation, job_id: str, nodes: list[str],
                       launch: WorkerLaunch, deadline: float) -> None:
        try:
            addresses = self._node_addresses(nodes, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
        except SlurmCommandError as e:  # sinfo missing or failing here: node names are addresses too
            logger.info("node addresses of job %s unknown (%s); the workers listen on the node names", job_id, e)
            addresses = {}
        try:
            session = _session_dir(p, job_id)
            alloc.session_dir = session
            for node in nodes:
                addr = addresses.get(node, node)
                _write_private(os.path.join(session, f"{node}.json"), {
                    "argv": launch.command(addr, python=p.python),
                    "env": {**launch.credentials_for(addr), "PYTHONUNBUFFERED": "1"},
                })
        except OSError as e:
            raise AllocationError(f"{p.source}: cannot write the workers' launch files under state_dir "
                                  f"{p.state_path()}: {e}; set state_dir to a writable directory every node "
                                  "shares") from None
        python = p.python or launch.python
        alloc.python, alloc.params = python, p
        command = [python, "-m", "monarch_scheduler_slurm._node", session]
        if p.signal is not None:
            command += ["--signal", p.signal[0]]
        env = slurm_env()
        env["PYTHONUNBUFFERED"] = "1"

        def lost(node: str, reason: str) -> None:  # while allocating, a loss is the allocation's error
            if alloc.live.is_set() and not alloc.released.is_set():
                launch.report_lost(node, reason)

        def notice(message: str) -> None:
            if not alloc.released.is_set():
                launch.report_notice(None, message)

        step = WorkerStep(self.api, job_id, nodes, self.api.step_argv(job_id, nodes, command, p.srun_args), env,
                          on_lost=lost, on_notice=notice,
                          # the seconds are ours to tell only for a job we submitted (--signal=SIG@S)
                          warning=p.signal if alloc.submitted else None)
        alloc.step = step
        step.start()
        bar = _Progress(f"Slurm job {job_id} workers", total=len(nodes))
        try:
            urls = _wait_with_bar(step, deadline, launch.cancelled, bar)
        except AllocationError as e:
            raise AllocationError(str(e) + _python_hint(step, nodes, python, p.python is None)) from None
        finally:
            bar.close()
        alloc.hosts = [HostHandle(name=n, address=urls[n], labels={"job": job_id, "node": n}) for n in nodes]
        alloc.extent = {"hosts": len(nodes)}
        alloc.live.set()
        for node, reason in list(step.lost.items()):  # lost between its address and now
            launch.report_lost(node, reason)

    def _abandon(self, alloc: SlurmAllocation) -> None:
        """An allocation that failed: give back what it holds (its job, if ours)."""
        try:
            if alloc.job_id:
                alloc.requeue = False
                alloc.release()
            else:
                alloc._end_step()
        except Exception as e:  # noqa: BLE001 - the first error is the one to raise
            logger.warning("cleaning up after a failed Slurm allocation: %s", e)


def _python_hint(step: WorkerStep, nodes: list[str], python: str, default: bool) -> str:
    """What to fix when some nodes' worker loops never listened and srun's
    output says the Python could not run the node launcher or the worker
    (not found, not executable, a module missing): the entry's ``python`` key."""
    silent = [n for n in nodes if n not in step.addresses]
    tail = step.tail_text()
    if not silent or not any(w in tail for w in (python, "No module named", "execve", "Permission denied")):
        return ""
    which = "this client's interpreter, as python is not set" if default else "the entry's python"
    what = "the worker loop" if all(n in step.greeted() for n in silent) else "the node launcher"
    return (f". The Python {python!r} ({which}) could not run {what} on {', '.join(silent)}: set "
            f"python = \"/path/to/python\" in the entry to an interpreter every node has, with monarch-core, "
            "monarch-transport-tcp and monarch-scheduler-slurm installed")


def _wait_with_bar(step: WorkerStep, deadline: float, cancelled: threading.Event, bar: _Progress) -> dict[str, str]:
    if not bar.enabled:
        return step.wait_addresses(deadline, cancelled)
    while True:  # the same wait, in slices, so the bar moves
        try:
            return step.wait_addresses(min(deadline, time.monotonic() + 0.5), cancelled)
        except AllocationError:
            bar.update(len(step.addresses))
            if time.monotonic() >= deadline or cancelled.is_set() or step.returncode is not None \
                    or step.errors or step.lost:
                return step.wait_addresses(deadline, cancelled)


def _state_dir(p: SlurmParams) -> str:
    path = p.state_path()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as e:
        raise AllocationError(f"{p.source}: cannot make state_dir {path}: {e}; set state_dir to a directory on a "
                              "filesystem every node shares") from None
    return path


def _session_dir(p: SlurmParams, job_id: str) -> str:
    """A fresh 0700 directory for this client's launch files (shared filesystem)."""
    return tempfile.mkdtemp(prefix=f"job{job_id}-", dir=_state_dir(p))  # mkdtemp: mode 0700


def _write_private(path: str, data: dict[str, Any]) -> None:
    """``data`` as JSON in a new file only this user can read (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)


class _Progress:
    """A tqdm bar while Slurm makes us wait -- only when stderr is a terminal."""

    def __init__(self, desc: str, total: int | None = None) -> None:
        self.enabled = sys.stderr.isatty()
        self._bar: Any = None
        self._desc, self._total = desc, total

    def _get(self) -> Any:
        if self._bar is None and self.enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=self._total, desc=self._desc, leave=False, file=sys.stderr,
                             bar_format="{desc}{postfix}" if self._total is None else None)
        return self._bar

    def show(self, status: str) -> None:
        bar = self._get()
        if bar is not None:
            bar.set_postfix_str(status)

    def update(self, n: int) -> None:
        bar = self._get()
        if bar is not None and n > bar.n:
            bar.update(n - bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
