"""``JobTrait``: the reference's job model (``monarch.job``), its saved state
and its batch mode.

A job is a declarative specification (which host meshes, how many hosts, on
what scheduler) plus, once applied, the scheduler's state of it.  ``apply()``
brings the specification into existence (a no-op when it already is);
``state()`` returns the host meshes by name (applying first, or reattaching
to the job saved at ``cached_path``); ``kill()`` ends it.  The job pickles:
``state()`` saves it to ``.monarch/job_state.pkl`` (:data:`DEFAULT_JOB_PATH`)
so that the next program run -- a second ``python train.py`` -- finds it
there and reattaches instead of allocating again, when the saved job
``can_run`` the new specification (else the saved one is killed and the
file removed).

A subclass (a scheduler plugin's job class) implements four methods, as in
the reference: ``_create(client_script)`` (start the job; never sets the
status itself), ``_state()`` (the :class:`JobState` of the running job),
``can_run(spec)`` (can this running job serve ``spec``?) and ``_kill()``.
It must pickle without live objects (host meshes, sockets): drop them in
``__getstate__``.
"""

from __future__ import annotations

import logging
import os
import pickle
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Optional, Union

from monarch_core import settings
from monarch_core.job._observe import MeshAdminConfig, TelemetryConfig, start_services

if TYPE_CHECKING:
    from typing_extensions import Self

    from monarch_core._actor._host_mesh import HostMesh

logger = logging.getLogger("monarch.job")

#: Where ``state()`` saves the job, and where a later run looks for it.
DEFAULT_JOB_PATH: str = ".monarch/job_state.pkl"
#: Set (to ``1``) in the environment of a batch-mode client (``apply(client_script=...)``):
#: its ``state()`` then connects to the job it runs in.
BATCH_JOB_ENV: str = "MONARCH_BATCH_JOB"

_STATE_DIR = ".monarch"
_SPEC_FILE = "spec"


def in_batch_job() -> bool:
    """True in the client a batch-mode job started (``MONARCH_BATCH_JOB=1``)."""
    return bool(settings.get(BATCH_JOB_ENV))


class JobState:
    """The host meshes of a running job, by name (``state.trainers``), and
    the URLs of its services: ``admin_url`` and ``dashboard_url`` (the
    monarch-dashboard's, when :meth:`JobTrait.enable_admin` or
    :meth:`JobTrait.enable_telemetry` asked for it, else ``None``),
    ``telemetry_url`` (the same dashboard), ``query_engine`` and
    ``query_engine_client`` (always ``None`` here: there is no SQL engine;
    ``monarch_core.telemetry.endpoint_metrics()`` reads the metrics)."""

    def __init__(
        self,
        hosts: dict[str, HostMesh],
        query_engine: Any = None,
        query_engine_client: Any = None,
        telemetry_url: Optional[str] = None,
        dashboard_url: Optional[str] = None,
        admin_url: Optional[str] = None,
    ) -> None:
        self._hosts = dict(hosts)
        self.query_engine = query_engine
        self.query_engine_client = query_engine_client
        self.telemetry_url = telemetry_url
        self.dashboard_url = dashboard_url
        self.admin_url = admin_url

    def __getattr__(self, attr: str) -> HostMesh:
        if attr.startswith("__") or attr == "_hosts":
            raise AttributeError(attr)
        try:
            return self._hosts[attr]
        except KeyError:
            available = ", ".join(sorted(self._hosts)) or "(none)"
            raise AttributeError(
                f"'{attr}' is not a valid host mesh name. Available names: {available}"
            ) from None

    def __repr__(self) -> str:
        return f"JobState(hosts={self._hosts})"


class CachedRunning(NamedTuple):
    """The status of a job whose running instance is another one: the job
    loaded from ``cached_path`` that this job reattached to."""

    job: JobTrait


class JobTrait(ABC):
    """A job: a specification of named host meshes and, once applied, the
    scheduler's state of it (see the module docstring).

    ``JobTrait.__init__`` takes no arguments (configuration goes to the
    subclass's constructor, services to :meth:`enable_telemetry` /
    :meth:`enable_admin`).  Subclasses must not set ``_status``: ``apply()``
    sets it after ``_create`` returns, ``state()`` saves the job."""

    def __init__(self) -> None:
        super().__init__()
        self._status: Union[Literal["running", "not_running"], CachedRunning] = "not_running"
        self._apply_id: Optional[str] = None
        self._telemetry: Optional[TelemetryConfig] = None
        self._admin: Optional[MeshAdminConfig] = None

    # -- services ---------------------------------------------------------
    def enable_telemetry(self, config: Optional[TelemetryConfig] = None, *,
                         mesh_admin_config: Optional[MeshAdminConfig] = None, **kwargs: Any) -> Self:
        """Start telemetry services on the next :meth:`state` call: the
        monarch-dashboard (``state.dashboard_url``, ``state.telemetry_url``)
        and the admin view (``state.admin_url``); endpoint metrics and spans
        are recorded in any case (``monarch_core.telemetry``).  ``config``: a
        :class:`TelemetryConfig` (else one made from ``kwargs``).  Returns
        ``self``."""
        cfg = config if config is not None else TelemetryConfig(**kwargs)
        if not isinstance(cfg, TelemetryConfig):
            raise TypeError(f"enable_telemetry(config=...) takes a TelemetryConfig, got {type(cfg).__name__}")
        self._telemetry = cfg
        if mesh_admin_config is not None or self._admin is None:
            self._admin = mesh_admin_config or MeshAdminConfig()
        return self

    def enable_admin(self, config: Optional[MeshAdminConfig] = None, **kwargs: Any) -> Self:
        """Start the admin view (the monarch-dashboard, served on loopback)
        on the next :meth:`state` call; ``state.admin_url`` is its URL.
        ``config``: a :class:`MeshAdminConfig` (else one made from
        ``kwargs``).  Returns ``self``."""
        cfg = config if config is not None else MeshAdminConfig(**kwargs)
        if not isinstance(cfg, MeshAdminConfig):
            raise TypeError(f"enable_admin(config=...) takes a MeshAdminConfig, got {type(cfg).__name__}")
        self._admin = cfg
        return self

    # -- status -------------------------------------------------------------
    @property
    def _running(self) -> Optional[JobTrait]:
        status = self._status
        if status == "running":
            return self
        if isinstance(status, CachedRunning):
            return status.job
        return None

    @property
    def apply_id(self) -> Optional[str]:
        """A UUID naming the current allocation of this job (``None`` before
        :meth:`apply`); kept by a job reattached from its saved state."""
        running = self._running
        return running._apply_id if running is not None else None

    @property
    def active(self) -> bool:
        """Whether this job (or the saved job it reattached to) is applied."""
        return self._running is not None

    def apply(self, client_script: Optional[str] = None) -> None:
        """Bring the job as specified into existence (a no-op when it is).

        ``client_script``: batch mode -- the job runs ``python client_script``
        as its client (where depends on the job: this host for
        :class:`LocalJob`, the allocation for ``SlurmJob``), with
        ``MONARCH_BATCH_JOB=1``; a :class:`BatchJob` saved at
        :data:`DEFAULT_JOB_PATH` makes that client's ``state()`` connect to
        the job it runs in."""
        if self._running is None:
            self._create(client_script)
            self._apply_id = str(uuid.uuid4())
            self._status = "running"

    def state(self, cached_path: Optional[str] = DEFAULT_JOB_PATH) -> JobState:
        """The running job's host meshes by name (``state.trainers``), and
        its services' URLs.

        When this job is not running yet and ``cached_path`` names a saved
        job that is running and ``can_run`` this specification, reattach to
        it; otherwise apply this job and save it at ``cached_path`` (unless
        ``None``).  A saved job that cannot run this specification is killed
        and its file removed."""
        running = self._running
        if running is None:
            cached = self._load_cached(cached_path)
            if cached is not None:
                logger.info("reattaching to the job saved at %s", cached_path)
                self._status = CachedRunning(cached)
                running = cached
            else:
                logger.info("applying the job")
                self.apply()
                running = self
                if cached_path is not None:
                    logger.info("saving the job to %s", cached_path)
                    self.dump(cached_path)
        return self._with_services(running._state())

    def _with_services(self, state: JobState) -> JobState:
        return start_services(state, self._telemetry, self._admin)

    def _load_cached(self, cached_path: Optional[str]) -> Optional[JobTrait]:
        if cached_path is None:
            return None
        try:
            job = job_load(cached_path)
        except FileNotFoundError:
            return None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as e:
            logger.warning("the saved job at %s cannot be read (%s: %s); applying a new job", cached_path,
                           type(e).__name__, e)
            return None
        running = job._running
        if running is None:
            return None
        if not running.can_run(self):
            logger.info("the job saved at %s cannot run this specification: killing it and removing the file",
                        cached_path)
            try:
                running._kill()
            except Exception as e:  # noqa: BLE001 - a job that is already gone must not stop a new one
                logger.info("killing the saved job failed: %s: %s", type(e).__name__, e)
            target = os.path.realpath(cached_path) if os.path.islink(cached_path) else cached_path
            Path(target).unlink(missing_ok=True)
            return None
        return job

    # -- saving -------------------------------------------------------------
    def dump(self, filename: str) -> None:
        """Save this job (pickle) at ``filename`` (through a symlink to its
        target), making its folder."""
        path = os.path.realpath(filename) if os.path.islink(filename) else filename
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(self, f)

    def dumps(self) -> bytes:
        """This job, pickled (:func:`job_loads` reads it)."""
        return pickle.dumps(self)

    def kill(self) -> None:
        """End the job (or the saved job it reattached to): its hosts, its
        worker loops, its procs.  The job is not running afterwards."""
        running = self._running
        if running is not None:
            running._kill()
        self._status = "not_running"

    # -- what a scheduler's job class implements ----------------------------
    @abstractmethod
    def _state(self) -> JobState:
        """The :class:`JobState` of the running job: one ``HostMesh`` per name."""

    @abstractmethod
    def _create(self, client_script: Optional[str]) -> None:
        """Start the job with the scheduler (``client_script``: batch mode,
        or raise saying this job has none).  Must not set ``_status``:
        :meth:`apply` does once this returns."""

    @abstractmethod
    def can_run(self, spec: JobTrait) -> bool:
        """Whether this (running) job can serve ``spec``, so that a program
        reattaches to it instead of allocating again; also how a batch job
        says it serves the client it started."""

    @abstractmethod
    def _kill(self) -> None:
        """Stop the job / give the reservation back."""


class BatchJob(JobTrait):
    """The job a batch-mode client connects to: the job that started it,
    saved at :data:`DEFAULT_JOB_PATH` by ``apply(client_script=...)``.  In
    that client (``MONARCH_BATCH_JOB=1``) it can run any specification, so
    the client's ``state()`` uses it; its ``_kill`` runs when the client
    exits."""

    def __init__(self, job: JobTrait) -> None:
        super().__init__()
        self._job = job
        self._telemetry, self._admin = job._telemetry, job._admin
        self._apply_id = job.apply_id or str(uuid.uuid4())

    @property
    def _running(self) -> Optional[JobTrait]:
        return self

    def can_run(self, spec: JobTrait) -> bool:
        if in_batch_job():
            import atexit

            atexit.register(self._kill)
            return True
        return False

    def _state(self) -> JobState:
        return self._job._state()

    def _create(self, client_script: Optional[str]) -> None:
        self._job._create(client_script)

    def _kill(self) -> None:
        logger.info("stopping the batch job")
        self._job._kill()


def job_loads(data: bytes) -> JobTrait:
    """The job pickled in ``data`` (:meth:`JobTrait.dumps`)."""
    job = pickle.loads(data)
    if not isinstance(job, JobTrait):
        raise TypeError(f"job_loads: the data holds a {type(job).__name__}, not a JobTrait")
    return job


def job_load(filename: str = DEFAULT_JOB_PATH) -> JobTrait:
    """The job saved at ``filename`` (:meth:`JobTrait.dump`; default
    :data:`DEFAULT_JOB_PATH`).  ``FileNotFoundError`` when there is none."""
    with open(filename, "rb") as f:
        job = pickle.load(f)
    if not isinstance(job, JobTrait):
        raise TypeError(f"job_load: {filename} holds a {type(job).__name__}, not a JobTrait")
    return job


def set_current_job(module_path: str) -> None:
    """Remember ``module_path`` (``"myjob.job"``) as the job of this folder
    (``.monarch/spec``), for ``monarch apply`` without an argument."""
    _import_job_from_spec(module_path)  # fail now, not at the next apply
    Path(_STATE_DIR).mkdir(parents=True, exist_ok=True)
    (Path(_STATE_DIR) / _SPEC_FILE).write_text(module_path)


def load_current_job() -> JobTrait:
    """A fresh job object for the spec remembered by :func:`set_current_job`
    (not yet applied: call ``state()`` on it)."""
    spec = Path(_STATE_DIR) / _SPEC_FILE
    try:
        module_path = spec.read_text().strip()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no job spec at {spec}: run `monarch apply <module.attr>` (e.g. `monarch apply myjob.job`) first"
        ) from None
    return _import_job_from_spec(module_path)


def _import_job_from_spec(module_path: str) -> JobTrait:
    """The ``JobTrait`` at ``module.attr`` (imported from the current folder too)."""
    import importlib
    import sys

    if not isinstance(module_path, str) or "." not in module_path:
        raise ValueError(f"a job spec is 'module.attr' (e.g. 'myjob.job'), got {module_path!r}")
    mod_name, attr = module_path.rsplit(".", 1)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    mod = importlib.import_module(mod_name)
    job = getattr(mod, attr, None)
    if job is None:
        raise AttributeError(f"module {mod_name!r} has no attribute {attr!r} (the job spec {module_path!r})")
    if not isinstance(job, JobTrait):
        raise TypeError(f"{module_path!r} must be a JobTrait (LocalJob, ProcessJob, SlurmJob ...), "
                        f"got {type(job).__name__}")
    return job
