"""Helpers of the Slurm suite (``plugins/scheduler_slurm/tests``): real ``sbatch``,
``salloc`` and ``srun`` against the testbed's cluster (slurmctld in the root
namespace, slurmd in ``h5..h7``, :data:`NODES`; see ``_helpers.testbed``).

Every client runs in a child interpreter (a process enables one transport),
and every Slurm command a test runs is wrapped in ``timeout`` (a Slurm client
that cannot reach a node can hang for minutes).  Jobs are named
:data:`JOB_NAME` so that :func:`cancel_our_jobs` ends exactly what this
suite submitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

from _helpers.clients import PY, child_env
from _helpers.testbed import SLURM_FIRST, SLURM_HOSTS, Testbed, host_addr

#: the cluster's nodes (h5, h6, h7) and their host numbers
NODES = SLURM_HOSTS
N1, N2, N3 = NODES
NODE_NUMBERS = tuple(range(SLURM_FIRST, SLURM_FIRST + len(NODES)))

#: the name of every job this suite submits (its own and the plugin's)
JOB_NAME = f"mtest{os.getpid()}"
#: generous limit of one client program (a loaded 2-core machine)
CLIENT_TIMEOUT = 240


def env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """A child's environment: this checkout's code, the cluster's
    ``SLURM_CONF``, no TLS material and no Slurm job of the test's own."""
    base: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("SLURM_", "MONARCH_TLS_"))}
    base["SLURM_CONF"] = os.environ.get("SLURM_CONF", "/tmp/rt/slurm/slurm.conf")
    base.update(extra or {})
    return child_env(base, drop=("MONARCH_",))


def write_project(d: Path, program: str, toml: str | None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "prog.py").write_text(textwrap.dedent(program))
    if toml is not None:
        (d / "monarch.toml").write_text(textwrap.dedent(toml))
    return d / "prog.py"


def results(d: Path) -> dict[str, Any]:
    """What the program wrote to ``results.json`` (an AssertionError with its output otherwise)."""
    f = d / "results.json"
    if not f.exists():
        out = (d / "out.txt").read_text() if (d / "out.txt").exists() else "(no out.txt)"
        raise AssertionError(f"the program wrote no results.json; its output:\n{out[-6000:]}")
    return json.loads(f.read_text())


def run(argv: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    """``timeout T argv`` (the process is killed at T), text output captured."""
    return subprocess.run(["timeout", "-k", "5", str(int(timeout)), *argv], capture_output=True, text=True,
                          timeout=timeout + 30, **kw)


def sbatch_wait(d: Path, nodes: int, *, timeout: float = CLIENT_TIMEOUT, extra: list[str] | None = None,
                env_extra: dict[str, str | None] | None = None) -> tuple[str, subprocess.CompletedProcess]:
    """Submit ``python prog.py`` (in ``d``) as a real batch job on ``nodes``
    nodes and wait for its end (``sbatch --wait``); its output is
    ``d/out.txt``.  Returns (job id, sbatch's result)."""
    script = f"#!/bin/sh\ncd {d} && exec timeout -k 5 {int(timeout) - 20} {PY} prog.py\n"
    res = run(["sbatch", "--wait", "--parsable", f"--nodes={nodes}", f"--job-name={JOB_NAME}",
               f"--output={d}/out.txt", *(extra or [])], timeout, input=script, env=env(env_extra))
    return res.stdout.strip().split(";")[0], res


def salloc(d: Path, nodes: int, *, timeout: float = CLIENT_TIMEOUT) -> subprocess.CompletedProcess:
    """``salloc -N nodes python prog.py`` in ``d`` (the client runs here, in
    the root namespace, inside the allocation)."""
    with open(d / "out.txt", "w") as out:
        return subprocess.run(["timeout", "-k", "5", str(int(timeout)), "salloc", f"--nodes={nodes}",
                               f"--job-name={JOB_NAME}", PY, "prog.py"], cwd=d, stdout=out,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout + 30, env=env())


def client(d: Path, *args: str, timeout: float = CLIENT_TIMEOUT,
           env_extra: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """``python prog.py args`` in ``d``, here (outside any allocation); its
    output also goes to ``d/out.txt``."""
    res = subprocess.run([PY, "prog.py", *args], cwd=d, capture_output=True, text=True, timeout=timeout,
                         env=env(env_extra))
    (d / "out.txt").write_text(res.stdout + "\n--- stderr ---\n" + res.stderr)
    return res


def job_state(job_id: str) -> str:
    """``squeue -t all -j N``'s state of the job ('' once forgotten)."""
    res = run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"], 30, env=env())
    return res.stdout.strip()


def wait_state(job_id: str, states: set[str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        s = job_state(job_id)
        if s in states or time.monotonic() >= deadline:
            return s
        time.sleep(0.2)  # squeue has nothing to wait on


def our_jobs() -> dict[str, str]:
    res = run(["squeue", "-h", "-t", "all", "-n", JOB_NAME, "-o", "%i|%T"], 30, env=env())
    return dict(line.split("|", 1) for line in res.stdout.split() if "|" in line)


def cancel_our_jobs() -> None:
    run(["scancel", "-n", JOB_NAME], 30, env=env())


def leftovers(tb: Testbed, timeout: float = 15) -> dict[str, list[str]]:
    """Processes other than the testbed's services still in the nodes after
    ``timeout`` s (a job's end takes Slurm a moment): ``{host: [pid cmdline]}``."""
    deadline = time.monotonic() + timeout
    while True:
        left = {}
        for i in NODE_NUMBERS:
            pids = tb.test_pids(i)
            if pids:
                left[f"h{i}"] = [f"{p} {_cmd(p)}" for p in pids]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)  # /proc has nothing to wait on


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def is_worker_loop(pid: int) -> bool:
    """A monarch worker loop: exec'd (``python -m monarch_core.worker``), or
    forked by the step's node launcher (process name ``monarch-worker``)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    return comm == "monarch-worker" or "monarch_core.worker" in _cmd(pid)


def worker_pids(i: int, tb: Testbed) -> list[int]:
    """PIDs of monarch worker loops in host ``i``."""
    return [p for p in tb.ns_pids(i) if is_worker_loop(p)]


__all__ = ["JOB_NAME", "cancel_our_jobs", "client", "env", "host_addr", "job_state", "leftovers", "our_jobs",
           "is_worker_loop", "results", "salloc", "sbatch_wait", "wait_state", "worker_pids", "write_project"]
