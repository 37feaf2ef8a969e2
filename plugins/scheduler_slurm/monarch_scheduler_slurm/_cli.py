"""The adapter boundary: every call the plugin makes to Slurm goes through a
:class:`SlurmAPI`, and :class:`SlurmCLI` is its one implementation.

Why the command-line tools, and which forms (Slurm 22.05, what Debian ships):

* ``sbatch --parsable`` (the job id, the script on standard input),
  ``scancel``, ``srun`` (the worker step: a process whose output we read).
* ``squeue -h -t all -j N -o FORMAT`` and ``sinfo -h -N -n NODES -o FORMAT``:
  the ``-o`` form with a ``|`` between fields is their parsable output.
  ``squeue --json`` exists in 22.05 but ignores ``-j``/``-t`` (it returns
  every job slurmctld still holds, which on a big cluster is megabytes per
  poll); ``scontrol`` has no ``--json`` in 22.05 and is missing on the
  compute nodes of some clusters; ``sacct`` needs slurmdbd.  Node lists are
  expanded with ``python-hostlist``, never by ``scontrol show hostnames``.
* Every call has a timeout (:attr:`SlurmCLI.timeout`, or a tighter one from
  the caller), and every failure becomes a :class:`SlurmCommandError` (an
  ``AllocationError``) that carries Slurm's own message.

Where pyslurm would go: a ``PySlurmAPI(SlurmAPI)`` beside this class,
chosen in ``SlurmScheduler.__init__``.  It is not here because no pyslurm
release on PyPI builds against Slurm 22.05 (22.5.x exists only as a GitHub
release; 25.11 refuses 22.05: "Slurm version mismatch"), and pyslurm has no
``srun`` either: the worker step would still be an ``srun`` process.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from monarch_core.errors import AllocationError

logger = logging.getLogger("monarch.slurm")

#: Seconds one Slurm command may take unless the caller says less.
COMMAND_TIMEOUT = 30.0

#: Job states after which a job holds no nodes (``squeue -t all`` shows them
#: for ``MinJobAge`` seconds after the end).
FINISHED = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "TIMEOUT", "SPECIAL_EXIT", "REVOKED",
})
#: States of a job waiting to run (again).
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "CONFIGURING", "SUSPENDED"})


#: Reasons a pending job gives that no wait will cure (the request exceeds a
#: limit, or names something that does not exist), with what to change.
NEVER_RUNS = {
    "PartitionNodeLimit": "it asks for more nodes than the partition has or allows a job: ask for fewer "
                          "(nodes = ...), or another partition (partition = ...)",
    "PartitionTimeLimit": "its time limit is above the partition's: ask for less (time = ...), or another partition",
    "BadConstraints": "no node of the partition satisfies its constraints (sbatch_args, --constraint)",
    "InvalidAccount": "its account is not valid (account = ...)",
    "InvalidQOS": "its QOS is not valid (qos = ...)",
    "QOSMaxNodePerJobLimit": "it asks for more nodes than its QOS allows a job: ask for fewer (nodes = ...)",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above its QOS's: ask for less (time = ...)",
    "AssocMaxNodesPerJobLimit": "it asks for more nodes than its account allows a job: ask for fewer (nodes = ...)",
    "AssocMaxWallDurationPerJobLimit": "its time limit is above its account's: ask for less (time = ...)",
}


class SlurmCommandError(AllocationError):
    """A Slurm command failed, was not found, or timed out; the message
    holds the command line and Slurm's own words."""


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """One job as ``squeue -t all -j N`` shows it."""

    job_id: str
    #: ``RUNNING``, ``PENDING``, ``CANCELLED``, ``TIMEOUT`` ...
    state: str
    #: why it waits or ended (``Resources``, ``BeginTime``, ``TimeLimit``, ``None``)
    reason: str
    #: its nodes, expanded, in Slurm's order (empty while pending)
    nodes: tuple[str, ...]
    #: ``%L``: time left before its limit (``UNLIMITED``, ``1:05``, ``INVALID``)
    time_left: str

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def waiting(self) -> bool:
        return self.state in WAITING

    @property
    def never_runs(self) -> str | None:
        """Why this pending job will never run as it is (and what to change),
        from its reason (:data:`NEVER_RUNS`); ``None`` if it may yet run."""
        return NEVER_RUNS.get(self.reason) if self.state == "PENDING" else None

    def describe(self) -> str:
        reason = f", reason {self.reason}" if self.reason and self.reason != "None" else ""
        return f"state {self.state}{reason}"


def expand_nodes(nodelist: str) -> list[str]:
    """``h[1-3],gpu07`` -> ``['h1', 'h2', 'h3', 'gpu07']`` (python-hostlist)."""
    import hostlist

    text = nodelist.strip()
    if not text or text in ("(null)", "None"):
        return []
    try:
        return list(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist as e:
        raise AllocationError(f"Slurm gave a node list python-hostlist cannot read: {nodelist!r} ({e})") from None


def compress_nodes(nodes: Sequence[str]) -> str:
    """The inverse of :func:`expand_nodes` (for ``--nodelist``)."""
    import hostlist

    return str(hostlist.collect_hostlist(list(nodes)))


def time_left_seconds(text: str) -> int | None:
    """``%L`` (``[days-]hours:minutes:seconds``, ``minutes:seconds``) in
    seconds; ``None`` for ``UNLIMITED``/``NOT_SET``/``INVALID``."""
    text = text.strip()
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    parts = text.split(":")
    if not parts or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return None
    seconds = 0
    for p in parts:
        seconds = seconds * 60 + int(p)
    return days * 86400 + seconds


class SlurmAPI(abc.ABC):
    """What the scheduler needs from Slurm.  Methods block (the scheduler
    calls them from its allocation thread or its watcher threads, never a
    trio loop) and raise :class:`SlurmCommandError`."""

    @abc.abstractmethod
    def submit(self, script: str, args: Sequence[str], *, timeout: float | None = None) -> str:
        """Submit ``script`` (its text) with sbatch options ``args``; return the job id."""

    @abc.abstractmethod
    def job(self, job_id: str, *, timeout: float | None = None) -> JobInfo | None:
        """The job, or ``None`` once slurmctld has forgotten it (or never knew it)."""

    @abc.abstractmethod
    def cancel(self, job_id: str, *, timeout: float | None = None) -> None:
        """``scancel`` the job (a job that already ended is not an error)."""

    @abc.abstractmethod
    def node_addresses(self, nodes: Sequence[str], *, timeout: float | None = None) -> dict[str, str]:
        """NodeAddr of each of ``nodes`` (those Slurm knows)."""

    @abc.abstractmethod
    def partition_nodes(self, partition: str | None, *, timeout: float | None = None) -> list[str]:
        """The nodes of ``partition`` (``None``: of the default partition, or all)."""

    @abc.abstractmethod
    def step_argv(self, job_id: str, nodes: Sequence[str], command: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
        """The ``srun`` command line of the worker step: one task per node
        of ``nodes`` in job ``job_id``, output labelled by task."""

    def run_step(self, job_id: str, nodes: Sequence[str], command: Sequence[str], *, input: str | None = None,
                 timeout: float | None = None, extra: Sequence[str] = ()) -> subprocess.CompletedProcess:
        """Run ``command`` once on each of ``nodes`` as a step of job
        ``job_id`` (``input`` on every task's stdin) and wait for its end
        (``sync_workspace``'s steps).  Not every API has steps of its own:
        this default says so."""
        raise SlurmCommandError(f"{type(self).__name__} cannot run job steps (sync_workspace needs them)")

    def broadcast(self, job_id: str, source: str, dest: str, *, timeout: float | None = None) -> None:
        """Put the local file ``source`` at ``dest`` on every node of job ``job_id`` (``sbcast``)."""
        raise SlurmCommandError(f"{type(self).__name__} cannot broadcast files (sync_workspace needs it)")


class SlurmCLI(SlurmAPI):
    """:class:`SlurmAPI` over the Slurm client commands (see the module docstring)."""

    def __init__(self, timeout: float = COMMAND_TIMEOUT, env: Mapping[str, str] | None = None) -> None:
        self.timeout = float(timeout)
        self._env = dict(env) if env is not None else None

    # -- running one command ------------------------------------------
    def run(self, argv: Sequence[str], *, input: str | None = None, timeout: float | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
        """Run one Slurm command with a timeout; :class:`SlurmCommandError`
        when it is missing, times out, or (``check``) exits non-zero."""
        limit = self.timeout if timeout is None else max(0.5, min(self.timeout, timeout))
        argv = list(argv)
        if shutil.which(argv[0]) is None:
            raise SlurmCommandError(
                f"`{argv[0]}` was not found on PATH: the slurm scheduler needs the Slurm client commands "
                "(sbatch, srun, squeue, scancel, sinfo) where the client runs; install them (Debian: "
                "apt-get install slurm-client) or run the client on a login node of the cluster"
            )
        try:
            res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=limit,
                                 env=self._env, stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(f"`{' '.join(argv)}` did not finish within {limit:g}s (is slurmctld reachable?)") from None
        except OSError as e:
            raise SlurmCommandError(f"cannot run `{' '.join(argv)}`: {e}") from None
        logger.debug("slurm.command.complete %s rc=%d", " ".join(argv), res.returncode)
        if check and res.returncode != 0:
            said = (res.stderr.strip() or res.stdout.strip() or "(no output)")[-2000:]
            raise SlurmCommandError(f"`{' '.join(argv)}` failed (exit code {res.returncode}): {said}")
        return res

    # -- SlurmAPI -------------------------------------------------------
    def submit(self, script: str, args: Sequence[str], *, timeout: float | None = None) -> str:
        res = self.run(["sbatch", "--parsable", *args], input=script, timeout=timeout)
        job_id = res.stdout.strip().split(";", 1)[0]  # "id" or "id;cluster"
        if not job_id.isdigit():
            raise SlurmCommandError(f"sbatch --parsable printed {res.stdout.strip()!r}, not a job id")
        return job_id

    def job(self, job_id: str, *, timeout: float | None = None) -> JobInfo | None:
        # -t all: a finished job is still listed (MinJobAge); without it, polling never sees the end.
        res = self.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%i|%T|%r|%L|%N"], timeout=timeout,
                       check=False)
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return None
            said = (res.stderr.strip() or "(no output)")[-2000:]
            raise SlurmCommandError(f"`squeue -j {job_id}` failed (exit code {res.returncode}): {said}")
        for line in res.stdout.splitlines():
            fields = line.strip().split("|", 4)
            if len(fields) == 5 and fields[0] == str(job_id):
                return JobInfo(fields[0], fields[1], fields[2], tuple(expand_nodes(fields[4])), fields[3])
        return None

    def cancel(self, job_id: str, *, timeout: float | None = None) -> None:
        res = self.run(["scancel", str(job_id)], timeout=timeout, check=False)
        if res.returncode != 0 and "already completing or completed" not in res.stderr \
                and "Invalid job id" not in res.stderr:
            raise SlurmCommandError(f"`scancel {job_id}` failed (exit code {res.returncode}): {res.stderr.strip()}")

    def node_addresses(self, nodes: Sequence[str], *, timeout: float | None = None) -> dict[str, str]:
        if not nodes:
            return {}
        res = self.run(["sinfo", "-h", "-N", "-n", compress_nodes(nodes), "-o", "%N|%o"], timeout=timeout)
        out: dict[str, str] = {}
        for line in res.stdout.splitlines():
            name, _, addr = line.strip().partition("|")
            if name and addr and name not in out:  # -N lists a node once per partition
                out[name] = addr
        return out

    def partition_nodes(self, partition: str | None, *, timeout: float | None = None) -> list[str]:
        argv = ["sinfo", "-h", "-N", "-o", "%N|%P"]
        if partition:
            argv[3:3] = ["-p", partition]
        res = self.run(argv, timeout=timeout)
        nodes, default = [], []
        for line in res.stdout.splitlines():
            name, _, part = line.strip().partition("|")
            if name and name not in nodes:
                nodes.append(name)
                if part.endswith("*") and name not in default:  # "debug*": the default partition
                    default.append(name)
        return default if not partition and default else nodes

    def step_argv(self, job_id: str, nodes: Sequence[str], command: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
        k = len(nodes)
        return [
            "srun", f"--jobid={job_id}",
            "--overlap",               # shares the job's CPUs with every other step (the user's, the batch script)
            f"--nodes={k}", f"--ntasks={k}", "--ntasks-per-node=1", f"--nodelist={compress_nodes(nodes)}",
            "--label",                 # "<task>: " before every line: the client tells the nodes apart
            "--kill-on-bad-exit=0", "--no-kill",  # one worker (or node) lost is that host's procs only
            "--mpi=none", "--job-name=monarch-workers",
            *extra, *command,
        ]

    def run_step(self, job_id: str, nodes: Sequence[str], command: Sequence[str], *, input: str | None = None,
                 timeout: float | None = None, extra: Sequence[str] = ()) -> subprocess.CompletedProcess:
        k = len(nodes)
        argv = ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={k}", f"--ntasks={k}", "--ntasks-per-node=1",
                f"--nodelist={compress_nodes(nodes)}", "--mpi=none", "--job-name=monarch-sync", "--input=all",
                "--kill-on-bad-exit=1", *extra, *command]
        return self.run(argv, input=input if input is not None else "", timeout=timeout)

    def broadcast(self, job_id: str, source: str, dest: str, *, timeout: float | None = None) -> None:
        # -f: replace what is there; -p: keep mode and times
        self.run(["sbcast", f"--jobid={job_id}", "-f", "-p", source, dest], timeout=timeout)


def slurm_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this environment) without TLS material: what reaches
    a Slurm command, and through it a job's stored environment or a step."""
    env = dict(os.environ if base is None else base)
    for k in list(env):
        if k.startswith("MONARCH_TLS_"):
            del env[k]
    return env
