"""The worker step: one ``srun`` (one task per node, ``--overlap``) whose
tasks are :mod:`._node` launchers, each starting one worker loop.

:class:`WorkerStep` starts it, reads its labelled output, and turns it into

* each node's worker address (the readiness line of its worker loop);
* the output of the workers and their procs, forwarded to the client's
  stdout/stderr as ``[node] line`` (nothing a node prints is lost);
* lost hosts: a worker loop that exits, a task Slurm reports ended
  (``srun: error: h3: task 2: Killed``), a node failure (``srun: error:
  Node failure on h3``), the whole step ending (the job cancelled, its time
  limit, preemption: said which, from ``squeue``);
* one notice per step when the nodes get the warning signal.

The ``srun`` process is started by the thread that reads its standard output
and lives as long as it, so ``PR_SET_PDEATHSIG`` (SIGTERM) ends it -- and with
it the step -- if the client dies without releasing anything.  util-linux's
``setpriv --pdeathsig TERM`` sets it and execs ``srun`` (no process of its
own), so the client starts it with ``vfork``: a ``preexec_fn`` would make
``subprocess`` ``fork`` the whole client (its page tables: ~10 ms for 150 MiB,
more for a client holding gigabytes) on the bring-up's critical path.  Where
``setpriv`` has no ``--pdeathsig`` (util-linux before 2.33), a ``preexec_fn``
sets it.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import WORKER_READY_PREFIX

from monarch_scheduler_slurm._cli import JobInfo, SlurmAPI, time_left_seconds
from monarch_scheduler_slurm._node import MARK

logger = logging.getLogger("monarch.slurm")

_LABEL = re.compile(rb"^\s*(\d+): ?(.*)$", re.S)
_TASK_END = re.compile(r"^srun: error: (\S+): tasks? ([\d,-]+): (.*)$")
_NODE_FAIL = re.compile(r"^srun: error: Node failure on (\S+)")
_DUE = re.compile(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT \S+( DUE TO ([A-Z ]+?))? \*\*\*")
_DUE_WHAT = {"TIME LIMIT": "reached its time limit", "PREEMPTION": "was preempted", "NODE FAILURE": "lost a node",
             "JOB REQUEUE": "was requeued"}
#: lines of srun's stderr kept for error messages
TAIL = 20

_PR_SET_PDEATHSIG = 1


def _pdeathsig() -> Callable[[], None] | None:
    """A preexec function asking for SIGTERM when the starting thread ends
    (resolved here, so the child runs no lookup between fork and exec)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    sig = int(signal.SIGTERM)

    def set_it() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return set_it


_SETPRIV: list[list[str]] = []  # [argv prefix or []], found once


def _setpriv_prefix() -> list[str]:
    """``[setpriv, --pdeathsig, TERM]`` when this host's setpriv can set the
    parent-death signal, else ``[]`` (looked up once)."""
    if not _SETPRIV:
        prefix: list[str] = []
        path = shutil.which("setpriv")
        if path is not None:
            try:
                res = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5,
                                     stdin=subprocess.DEVNULL)
                if "--pdeathsig" in res.stdout:
                    prefix = [path, "--pdeathsig", "TERM"]
            except (OSError, subprocess.SubprocessError):
                pass
        _SETPRIV.append(prefix)
    return _SETPRIV[0]


def _say_seconds(s: int) -> str:
    return f"{s // 60} min {s % 60} s" if s >= 120 else f"{s} s"


class WorkerStep:
    """One worker step of job ``job_id`` on ``nodes`` (see the module docstring).

    ``on_lost(node, reason)`` and ``on_notice(message)`` are called from its
    reader threads; after :meth:`stop` begins, nothing is reported.
    """

    def __init__(self, api: SlurmAPI, job_id: str, nodes: Sequence[str], argv: Sequence[str],
                 env: Mapping[str, str], *, on_lost: Callable[[str, str], None],
                 on_notice: Callable[[str], None], warning: tuple[str, int] | None,
                 stdout_fd: int = 1, stderr_fd: int = 2) -> None:
        self.api = api
        self.job_id = job_id
        self.nodes = list(nodes)
        self.argv = list(argv)
        self.env = dict(env)
        self.on_lost = on_lost
        self.on_notice = on_notice
        self.warning = warning
        self.stdout_fd, self.stderr_fd = stdout_fd, stderr_fd
        self.proc: subprocess.Popen | None = None
        self.step_id: str | None = None
        self.addresses: dict[str, str] = {}
        self.errors: dict[str, str] = {}  # node -> what its launcher said
        self.lost: dict[str, str] = {}  # node -> why
        self.returncode: int | None = None
        #: the step ended because Slurm requeued the job
        self.requeued = False
        self.stopping = threading.Event()
        self._task_node: dict[int, str] = {}
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        self._due: str | None = None  # "TIME LIMIT", "PREEMPTION" ... from slurmstepd's cancel line
        self._noticed = False
        self._verdict: tuple[float, JobInfo | None] | None = None
        self._verdict_lock = threading.Lock()
        self._cond = threading.Condition()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stderr_done = threading.Event()

    # -- start --------------------------------------------------------
    def start(self) -> None:
        """Start ``srun`` (from its own reader thread); raises if it cannot start."""
        threading.Thread(target=self._run, name=f"monarch-slurm-step-{self.job_id}", daemon=True).start()
        self._started.wait()
        if self._start_error is not None:
            raise AllocationError(f"cannot start the worker step of Slurm job {self.job_id}: "
                                  f"`{' '.join(self.argv[:3])} ...`: {self._start_error}")

    def _run(self) -> None:
        try:
            prefix = _setpriv_prefix()
            argv = list(self.argv)
            if prefix:  # setpriv execs srun: resolve it here, so that a missing srun is an OSError as without it
                found = shutil.which(argv[0], path=self.env.get("PATH"))
                if found is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
                argv = [*prefix, found, *argv[1:]]
            self.proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # the terminal's Ctrl-C goes to the client, which releases in order
                preexec_fn=None if prefix else _pdeathsig(),
            )
        except OSError as e:
            self._start_error = e
            self._started.set()
            return
        self._started.set()
        threading.Thread(target=self._read_stderr, name=f"monarch-slurm-stderr-{self.job_id}", daemon=True).start()
        try:
            assert self.proc.stdout is not None
            for raw in iter(self.proc.stdout.readline, b""):
                self._stdout_line(raw)
        except (OSError, ValueError):
            pass
        rc = self.proc.wait()
        self._stderr_done.wait(10)
        with self._cond:
            self.returncode = rc
            self._cond.notify_all()
        if not self.stopping.is_set():
            self._step_ended(rc)

    def greeted(self) -> set[str]:
        """The nodes whose launcher said hello (it started: its Python runs it)."""
        with self._cond:
            return set(self._task_node.values())

    # -- output ---------------------------------------------------------
    def _node_of(self, task: int) -> str:
        # before its hello (slurmstepd's own errors): block distribution puts task i on the i-th node
        if task in self._task_node:
            return self._task_node[task]
        return self.nodes[task] if 0 <= task < len(self.nodes) else f"task{task}"

    def _stdout_line(self, raw: bytes) -> None:
        m = _LABEL.match(raw)
        if m is None:  # srun's own (unlabelled) output
            self._forward(self.stdout_fd, None, raw)
            return
        task, body = int(m.group(1)), m.group(2)
        text = body.decode(errors="replace").rstrip("\r\n")
        if text.startswith(MARK):
            self._mark(task, text[len(MARK):].split(" ", 3))
            return
        node = self._node_of(task)
        if text.startswith(WORKER_READY_PREFIX) and node not in self.addresses:
            with self._cond:
                self.addresses[node] = text[len(WORKER_READY_PREFIX):].strip()
                self._cond.notify_all()
            return
        m2 = _DUE.search(text)
        if m2:
            self._due = (m2.group(2) or "").strip() or self._due
        self._forward(self.stdout_fd, node, body)

    def _mark(self, task: int, words: list[str]) -> None:
        kind = words[0]
        node = words[1] if len(words) > 1 else self._node_of(task)
        if kind == "hello":
            with self._cond:
                self._task_node[task] = node
                if len(words) > 2 and words[2].isdigit():
                    self.step_id = words[2]
                self._cond.notify_all()
        elif kind == "notice":
            self._notice(words[2] if len(words) > 2 else "a signal")
        elif kind == "exit":
            rc = words[2] if len(words) > 2 else "?"
            self._judge_loss(node, f"its worker loop exited with code {rc}")
        elif kind == "error":
            message = " ".join(words[2:])
            with self._cond:
                self.errors[node] = message
                self._cond.notify_all()
            self._lose(node, message)

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for raw in iter(self.proc.stderr.readline, b""):
                m = _LABEL.match(raw)
                if m is not None:  # a worker's (or its procs') stderr
                    text = m.group(2).decode(errors="replace")
                    m2 = _DUE.search(text)
                    if m2:
                        self._due = (m2.group(2) or "").strip() or self._due
                    self._tail.append(f"[{self._node_of(int(m.group(1)))}] {text.rstrip()}")
                    self._forward(self.stderr_fd, self._node_of(int(m.group(1))), m.group(2))
                    continue
                line = raw.decode(errors="replace").rstrip()
                self._tail.append(line)
                logger.info("job %s worker step: %s", self.job_id, line)
                self._srun_said(line)
        except (OSError, ValueError):
            pass
        finally:
            self._stderr_done.set()

    def _srun_said(self, line: str) -> None:
        m = _NODE_FAIL.match(line)
        if m:
            self._lose(m.group(1), f"Slurm reports a node failure on {m.group(1)} (job {self.job_id})")
            return
        m = _TASK_END.match(line)
        if m:
            self._judge_loss(m.group(1), f"its worker step task ended ({m.group(3).strip()})")

    def _forward(self, fd: int, node: str | None, body: bytes) -> None:
        data = body if body.endswith(b"\n") else body + b"\n"
        if node is not None:
            data = f"[{node}] ".encode() + data
        try:
            os.write(fd, data)
        except OSError:
            pass

    # -- events ---------------------------------------------------------
    def _lose(self, node: str, reason: str) -> None:
        if self.stopping.is_set():
            return
        with self._cond:
            if node in self.lost:
                return
            self.lost[node] = reason
            self._cond.notify_all()
        self.on_lost(node, reason)

    def _notice(self, signame: str) -> None:
        if self._noticed or self.stopping.is_set():
            return
        self._noticed = True
        threading.Thread(target=self._send_notice, args=(signame,), name=f"monarch-slurm-notice-{self.job_id}",
                         daemon=True).start()

    def _send_notice(self, signame: str) -> None:
        left = None
        try:
            info = self.api.job(self.job_id, timeout=10)
            left = time_left_seconds(info.time_left) if info is not None else None
        except AllocationError as e:
            logger.debug("squeue for the notice of job %s failed: %s", self.job_id, e)
        warn = f"--signal={self.warning[0]}@{self.warning[1]}" if self.warning else "the job's --signal"
        when = (f"its time limit is in {_say_seconds(left)}" if left is not None
                else "its time limit is not known")
        message = (f"Slurm job {self.job_id} will be preempted or end soon: its nodes got {signame} ({warn}: Slurm "
                   f"sends it that long before the time limit, or at preemption); {when}. Checkpoint now")
        if not self.stopping.is_set():
            self.on_notice(message)

    def _step_ended(self, rc: int) -> None:
        """srun is gone while we did not stop it: every host not yet lost is."""
        why = self.why_ended(rc)
        for node in self.nodes:
            self._lose(node, why)

    def _settled_job(self) -> JobInfo | None:
        """The job as ``squeue`` shows it once it is not COMPLETING (polled
        up to 5 s); one query serves every loss of a burst (2 s)."""
        with self._verdict_lock:
            cached = self._verdict
            if cached is not None and time.monotonic() - cached[0] < 2.0:
                return cached[1]
            info = None
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    info = self.api.job(self.job_id, timeout=10)
                except AllocationError as e:
                    logger.debug("squeue for job %s: %s", self.job_id, e)
                    break
                if info is None or info.state != "COMPLETING" or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)  # squeue has nothing to wait on
            self._verdict = (time.monotonic(), info)
            return info

    def job_reason(self) -> str | None:
        """Why the job no longer runs this step (cancelled, time limit,
        preempted, requeued ...), or ``None`` while it runs."""
        info = self._settled_job()
        job = f"Slurm job {self.job_id}"
        due = _DUE_WHAT.get(self._due or "")
        if info is not None:
            what = {
                "CANCELLED": due or "was cancelled (scancel)",
                "TIMEOUT": "reached its time limit",
                "PREEMPTED": "was preempted",
                "NODE_FAIL": "lost a node (NODE_FAIL)",
                "DEADLINE": "reached its deadline",
                "BOOT_FAIL": "failed to boot its nodes",
                "OUT_OF_MEMORY": "ran out of memory",
            }.get(info.state)
            if what is None and (info.waiting or self._due == "JOB REQUEUE"):
                self.requeued = True
                what = (f"was requeued ({info.describe()}): a client can attach to it again with job_id = "
                        f"{self.job_id} once it runs")
            if what is None and info.finished:
                what = "ended"
            if what is not None:
                return f"{job} {what} ({info.describe()})"
        if due:
            if self._due == "JOB REQUEUE":
                self.requeued = True
            return f"{job} {due}"
        return None

    def why_ended(self, rc: int | None) -> str:
        """Why the step ended: the job's reason, or srun's exit code and last output."""
        why = self.job_reason()
        if why is not None:
            return why
        step = f"{self.job_id}.{self.step_id}" if self.step_id else f"of job {self.job_id}"
        return f"the worker step {step} ended (srun exit code {rc})" + self.tail_text()

    def _judge_loss(self, node: str, fallback: str) -> None:
        """A worker (or its task) ended: because the job ended (cancel, time
        limit, requeue: Slurm signals every process) -- say that -- or on its own."""
        def judge() -> None:
            self._lose(node, self.job_reason() or fallback)

        threading.Thread(target=judge, name=f"monarch-slurm-loss-{node}", daemon=True).start()

    def tail_text(self) -> str:
        lines = list(self._tail)
        return ("; srun's last output:\n  " + "\n  ".join(lines[-12:])) if lines else ""

    # -- waiting --------------------------------------------------------
    def wait_addresses(self, deadline: float, cancelled: threading.Event) -> dict[str, str]:
        """Every node's worker address, in node order; ``AllocationError``
        (naming the nodes, with srun's output) if the step ends, a launcher
        fails, or ``deadline`` (monotonic) passes."""
        with self._cond:
            while True:
                if all(n in self.addresses for n in self.nodes):
                    return {n: self.addresses[n] for n in self.nodes}
                bad = {n: e for n, e in self.errors.items()}
                gone = [n for n in self.nodes if n in self.lost and n not in self.addresses]
                if bad or gone or self.returncode is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0 or cancelled.is_set():
                    break
                self._cond.wait(min(left, 0.2))
            if bad or gone:  # srun says why last (slurmstepd's lines come after the task's end): let it finish
                end = time.monotonic() + 3.0
                while self.returncode is None and time.monotonic() < end:
                    self._cond.wait(0.1)
        missing = [n for n in self.nodes if n not in self.addresses]
        if self.errors:
            first = next(iter(self.errors.items()))
            raise AllocationError(f"the worker step of Slurm job {self.job_id} failed on {first[0]}: {first[1]}")
        if self.returncode is not None or gone:
            rc = self.returncode
            raise AllocationError(
                f"the worker step of Slurm job {self.job_id} ended before the worker loops of {missing} listened: "
                + self.why_ended(rc if rc is not None else None)
            )
        if cancelled.is_set():
            raise AllocationError(f"allocation of Slurm job {self.job_id} was cancelled")
        started = sorted(set(self._task_node.values()))
        raise AllocationError(
            f"the worker loops of {missing} in Slurm job {self.job_id} did not print their address in time "
            f"(tasks started on: {started or 'none'})" + self.tail_text()
        )

    # -- stop -----------------------------------------------------------
    def stop(self, timeout: float = 10.0) -> None:
        """End the step: nothing more is reported; srun gets a few seconds
        to finish (the worker loops were told to exit), then SIGTERM (srun
        cancels the step), then SIGKILL."""
        self.stopping.set()
        p = self.proc
        if p is None:
            return
        deadline = time.monotonic() + timeout
        for sig, wait in ((None, min(3.0, timeout / 3)), (signal.SIGTERM, timeout / 2), (signal.SIGKILL, 2.0)):
            if sig is not None and p.poll() is None:
                try:
                    p.send_signal(sig)
                except OSError:
                    pass
            try:
                p.wait(max(0.1, min(wait, deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                continue
        logger.warning("srun of the worker step of job %s (pid %d) did not exit", self.job_id, p.pid)
