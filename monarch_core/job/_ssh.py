"""``SSHJob``: hosts named explicitly, reached over SSH through the
monarch-scheduler-ssh plugin (``scheduler = "ssh"``, docs/ssh.md).

The job is the list of hosts per mesh.  ``state()`` connects to every host
at once and starts a worker loop on each, as a child of its SSH session,
with TLS credentials of this client alone -- so the worker loops are this
client's and end with it (the reference's workers, plain ``tcp`` daemons
anyone on the network could use, outlive their client).  A later program
with the same ``SSHJob`` reattaches to the job saved in
``.monarch/job_state.pkl``: the same hosts, with new worker loops.
``kill()`` shuts them down.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from monarch_core.job import _sched
from monarch_core.job._trait import JobState, JobTrait

logger = logging.getLogger("monarch.job")

INSTALL = "pip install ./plugins/scheduler_ssh"
KILL_TIMEOUT = 60.0


class SSHJob(JobTrait):
    """A job of host meshes made of named SSH hosts (:meth:`add_mesh`).

    ``python_exe``: the hosts' interpreter (the default ``"python"`` means
    the client's own path, the scheduler's default).  ``params``: more keys
    of the ``ssh`` scheduler's entry (``user``, ``port``, ``identity_file``,
    ``known_hosts``, ``ssh_config``, ``proxy_jump``, ``env``, ``cwd``,
    ``worker_host``, ``client_address`` ...: docs/ssh.md).  The reference's
    ``ssh_args`` (options of the ``ssh`` command) have no equivalent: give
    them as ``params`` or in ``~/.ssh/config`` (``ValueError`` otherwise).
    ``transport``: ``"tcp"`` (the reference's default) is accepted and means
    the scheduler's mutually authenticated ``tls``; ``monarch_port`` is
    accepted and unused (the worker loops listen on free ports)."""

    def __init__(
        self,
        python_exe: str = "python",
        ssh_args: Sequence[str] = (),
        monarch_port: int = 22222,
        transport: str = "tcp",
        *,
        params: Optional[dict[str, Any]] = None,
    ) -> None:
        if transport not in ("tcp", "tls"):
            raise ValueError(f"SSHJob(transport={transport!r}): the ssh scheduler's worker loops speak tls "
                             "(mutually authenticated); give 'tcp' or 'tls'")
        if ssh_args:
            raise ValueError(f"SSHJob(ssh_args={list(ssh_args)!r}): hosts are reached with paramiko, not the ssh "
                             "command; give user, port, identity_file, proxy_jump ... as params={...} or in "
                             "~/.ssh/config (docs/ssh.md)")
        self._python_exe = python_exe
        self._port = monarch_port
        self._transport = transport
        self._params = dict(params or {})
        if "hosts" in self._params:
            raise ValueError("SSHJob(params={'hosts': ...}): name the hosts with add_mesh(name, hosts)")
        self._meshes: dict[str, list[str]] = {}
        self._flag = _sched.KeepFlag()
        self._root: Any = None
        super().__init__()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_root"] = None
        state["_flag"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._flag = _sched.KeepFlag()

    def add_mesh(self, name: str, hosts: list[str]) -> None:
        """The mesh ``name``: one rank per entry of ``hosts`` (SSH aliases,
        addresses, ``user@host:port``)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"SSHJob.add_mesh: mesh name {name!r} must be an identifier")
        if isinstance(hosts, str) or not hosts or not all(isinstance(h, str) and h for h in hosts):
            raise TypeError(f"SSHJob.add_mesh({name!r}, hosts=...) takes a non-empty list of host names, got {hosts!r}")
        taken = {h for m, hs in self._meshes.items() if m != name for h in hs}
        twice = sorted(taken.intersection(hosts))
        if twice:
            raise ValueError(f"SSHJob.add_mesh({name!r}): host(s) {twice} are in another mesh already; a host "
                             "belongs to one mesh")
        self._meshes[name] = list(hosts)

    def _entry(self) -> dict[str, Any]:
        p: dict[str, Any] = {"hosts": [h for hs in self._meshes.values() for h in hs]}
        if self._python_exe != "python":
            p["python"] = self._python_exe
        p.update(self._params)
        return p

    def _create(self, client_script: Optional[str]) -> None:
        if client_script is not None:
            raise RuntimeError("SSHJob cannot run batch-mode scripts (apply(client_script=...)); run the client "
                               "where you are, or use SlurmJob")
        if not self._meshes:
            raise ValueError("SSHJob: no hosts; add them with add_mesh(name, hosts) before apply()/state()")
        _sched.require_scheduler("ssh", "SSHJob", INSTALL)
        self._root = _sched.allocate("SSHJob", "ssh", self._entry(), self._flag)

    def _state(self) -> JobState:
        if self._root is None:  # a saved job: this client's own worker loops on the same hosts
            _sched.require_scheduler("ssh", "SSHJob", INSTALL)
            self._root = _sched.allocate("SSHJob", "ssh", self._entry(), self._flag)
        sizes = {name: len(hosts) for name, hosts in self._meshes.items()}
        return JobState(_sched.split(self._root, sizes))

    def can_run(self, spec: JobTrait) -> bool:
        """The same hosts and settings (the hosts are reached again)."""
        return (isinstance(spec, SSHJob) and spec._meshes == self._meshes and spec._params == self._params
                and spec._python_exe == self._python_exe)

    def _kill(self) -> None:
        """Shut this client's worker loops down (and their procs)."""
        if self._root is not None:
            try:
                _sched.shutdown(self._root, self._flag, KILL_TIMEOUT)
            finally:
                self._root = None
