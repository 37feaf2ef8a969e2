"""``LocalJob``: every host mesh is this host (``this_host()``).

A stand-in so that a program can switch between a cluster job and this
machine by changing the job object.  Batch mode (``apply(client_script=...)``)
runs the client script here, detached, with its output in
``.monarch/logs/job_*/``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Optional, Sequence

from monarch_core.job._trait import DEFAULT_JOB_PATH, BATCH_JOB_ENV, BatchJob, JobState, JobTrait

logger = logging.getLogger("monarch.job")


class LocalJob(JobTrait):
    """A job whose host meshes (``hosts``: their names) are all this host."""

    def __init__(self, hosts: Sequence[str] = ("hosts",)) -> None:
        if isinstance(hosts, str) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise TypeError(f"LocalJob(hosts=...) takes a sequence of host mesh names such as ('trainers',), "
                            f"got {hosts!r}")
        self._host_names = tuple(hosts)
        self._proc: Optional[subprocess.Popen] = None
        self._pid: Optional[int] = None
        self._log_dir: Optional[str] = None
        self._live: list[Any] = []
        super().__init__()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_proc"] = None
        state["_live"] = []
        return state

    def can_run(self, spec: JobTrait) -> bool:
        """Never: this host is the same whatever was saved, so the new spec's
        names are used (as in the reference)."""
        return False

    def _state(self) -> JobState:
        from monarch_core.actor import this_host

        meshes = {name: this_host() for name in self._host_names}
        self._live.extend(meshes.values())
        return JobState(meshes)

    def _create(self, client_script: Optional[str]) -> None:
        if client_script is None:
            return  # this host always exists
        if not os.path.isfile(client_script):
            raise FileNotFoundError(f"LocalJob.apply(client_script={client_script!r}): no such file")
        BatchJob(self).dump(DEFAULT_JOB_PATH)
        os.makedirs(".monarch/logs", exist_ok=True)
        self._log_dir = tempfile.mkdtemp(prefix="job_", dir=".monarch/logs")
        env = dict(os.environ)
        env[BATCH_JOB_ENV] = "1"
        with open(os.path.join(self._log_dir, "stdout.log"), "w") as out, \
                open(os.path.join(self._log_dir, "stderr.log"), "w") as err:
            self._proc = subprocess.Popen([sys.executable, client_script], env=env, stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self._pid = self._proc.pid
        logger.info("started client script %s (pid %d); its output is in %s", client_script, self._pid,
                    self._log_dir)

    @property
    def process(self) -> subprocess.Popen:
        """The batch-mode client (``ValueError`` when there is none in this process)."""
        if self._proc is None:
            raise ValueError("no local batch job: LocalJob.apply(client_script=...) starts one")
        return self._proc

    def _kill(self) -> None:
        """Stop the procs spawned on this job's meshes in this process, and a
        batch-mode client that still runs."""
        for hm in self._live:
            try:
                hm.shutdown().get(timeout=60)
            except Exception as e:  # noqa: BLE001 - stopping what is left must go on
                logger.info("stopping the procs of %r failed: %s", hm, e)
        self._live = []
        if self._pid is not None and (self._proc is None or self._proc.poll() is None):
            try:
                os.killpg(self._pid, signal.SIGTERM)
            except OSError:
                pass
            if self._proc is not None:
                try:
                    self._proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self._pid, signal.SIGKILL)
        self._pid = None
