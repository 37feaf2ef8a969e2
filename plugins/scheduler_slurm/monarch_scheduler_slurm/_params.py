"""The ``[hosts.<name>]`` parameters of ``scheduler = "slurm"``: checked once,
turned into a :class:`SlurmParams`, and into ``sbatch`` options.

Every mistake is a ``ConfigError`` that names the entry (``request.source``),
the key, what it must be and an example; an unknown key lists the known ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from typing import Any

from monarch_core.errors import ConfigError

#: Keys that describe a job to submit (from outside an allocation).
SUBMIT_KEYS = frozenset({
    "partition", "time", "gpus_per_node", "gres", "cpus_per_task", "mem", "account", "qos",
    "constraint", "exclusive", "sbatch_args", "job_name", "requeue",
})
#: Keys that apply in every mode.
COMMON_KEYS = frozenset({"nodes", "job_id", "signal", "queue_timeout", "python", "state_dir", "srun_args", "sync_dir"})
#: Every key the scheduler accepts.
ALL_KEYS = SUBMIT_KEYS | COMMON_KEYS

#: The warning signal when the entry does not say: USR2, 60 s before the end.
#: (Not USR1: NCCL's watchdog uses it.)
DEFAULT_SIGNAL = "USR2@60"

#: slurmctld's period of time-limit checks (``PERIODIC_TIMEOUT``, compiled in)
_LIMIT_CHECK_S = 30
#: what a job needs, from its start, before its worker step can take a signal
_STEP_START_S = 10


def slurm_time_seconds(text: str) -> int | None:
    """A Slurm ``--time`` (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``) in seconds; None for ``UNLIMITED``/``INFINITE`` or anything else."""
    t = str(text).strip()
    m = re.match(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$", t)
    if m is None:
        return None
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        return ((int(days) * 24 + int(a)) * 60 + int(b or 0)) * 60 + int(c or 0)
    if c is not None:  # H:M:S
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # M:S
        return int(a) * 60 + int(b)
    return int(a) * 60  # M
_DEFAULT_STATE_DIR = os.path.join("~", ".monarch", "slurm")
#: Where ``sync_workspace`` copies on a node whose filesystem is not the client's ({job}, {node}, {user} filled in).
DEFAULT_SYNC_DIR = "/tmp/monarch-{user}/job{job}/{node}"


@dataclasses.dataclass(frozen=True)
class SlurmParams:
    """A checked ``slurm`` entry (see ``docs/slurm.md`` for each key)."""

    source: str
    nodes: int | None = None
    job_id: str | None = None
    partition: str | None = None
    time: str | None = None
    gpus_per_node: str | None = None
    gres: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    requeue: bool = False
    sbatch_args: tuple[str, ...] = ()
    srun_args: tuple[str, ...] = ()
    job_name: str = "monarch"
    #: (signal name without SIG, seconds before the end), or None: no warning
    signal: tuple[str, int] | None = ("USR2", 60)
    queue_timeout: float | None = None
    python: str | None = None
    state_dir: str = _DEFAULT_STATE_DIR
    sync_dir: str = DEFAULT_SYNC_DIR

    @property
    def submit_keys(self) -> list[str]:
        """The submission keys this entry sets (ignored inside an allocation)."""
        return sorted(k for k in SUBMIT_KEYS if k != "job_name" and getattr(self, k) not in (None, False, ()))

    def state_path(self) -> str:
        return os.path.abspath(os.path.expanduser(self.state_dir))

    def late_warning(self) -> str | None:
        """Why this entry's warning signal may never reach the workers, or None.

        slurmctld checks limits every 30 s and sends the signal at the first
        check where the job has at most ``SECONDS + 30`` seconds left.  A time
        limit not well above that makes the signal due at the first check after
        the job starts, which can come before the worker step runs: the signal
        then reaches no step, and no notice comes."""
        if self.signal is None or self.time is None:
            return None
        sig, secs = self.signal
        limit = slurm_time_seconds(self.time)
        if limit is None or limit >= secs + _LIMIT_CHECK_S + _STEP_START_S:
            return None
        good = max(1, limit - _LIMIT_CHECK_S - _STEP_START_S)
        return (f"the warning signal {sig}@{secs} is due at the job's first time-limit check: Slurm sends it once at "
                f"most {secs} + {_LIMIT_CHECK_S} s are left, and the limit (time = {self.time!r}, {limit} s) leaves "
                f"that from the start, maybe before the worker step runs (the signal then reaches nothing and no "
                f"notice comes); use signal = \"{sig}@{good}\" or less, or a longer time")

    def sbatch_options(self) -> list[str]:
        """The sbatch options of a job for this entry (submission from outside)."""
        out = [f"--nodes={self.nodes or 1}", "--ntasks-per-node=1", f"--job-name={self.job_name}", "--no-kill"]
        for key, flag in (("partition", "--partition"), ("time", "--time"), ("gpus_per_node", "--gpus-per-node"),
                          ("gres", "--gres"), ("cpus_per_task", "--cpus-per-task"), ("mem", "--mem"),
                          ("account", "--account"), ("qos", "--qos"), ("constraint", "--constraint")):
            value = getattr(self, key)
            if value is not None:
                out.append(f"{flag}={value}")
        if self.exclusive:
            out.append("--exclusive")
        out.append("--requeue" if self.requeue else "--no-requeue")
        if self.signal is not None:
            out.append(f"--signal={self.signal[0]}@{self.signal[1]}")
        out.extend(self.sbatch_args)
        return out


def _bad(source: str, key: str, what: str, got: Any, example: str) -> ConfigError:
    return ConfigError(f"{source}: '{key}' must be {what}, got {got!r} (for example: {example})")


def _int(p: Mapping[str, Any], source: str, key: str, minimum: int, example: str) -> int | None:
    v = p.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _bad(source, key, f"an integer >= {minimum}", v, example)
    return v


def _str(p: Mapping[str, Any], source: str, key: str, example: str) -> str | None:
    v = p.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip() or "\n" in v:
        raise _bad(source, key, "a non-empty string on one line", v, example)
    return v.strip()


def _bool(p: Mapping[str, Any], source: str, key: str) -> bool:
    v = p.get(key, False)
    if not isinstance(v, bool):
        raise _bad(source, key, "true or false", v, f"{key} = true")
    return v


def _args(p: Mapping[str, Any], source: str, key: str, example: str) -> tuple[str, ...]:
    v = p.get(key, [])
    if not isinstance(v, list) or not all(isinstance(a, str) and a for a in v):
        raise _bad(source, key, "a list of strings, one option each", v, example)
    return tuple(v)


def parse_signal(value: Any, source: str) -> tuple[str, int] | None:
    """``"USR2@60"`` -> ``("USR2", 60)``; ``false``/``""`` -> ``None``."""
    if value is False or value == "":
        return None
    example = 'signal = "USR2@60" (or false for no warning)'
    if not isinstance(value, str):
        raise _bad(source, "signal", "SIGNAME@SECONDS or false", value, example)
    name, _, secs = value.strip().partition("@")
    name = name.upper().removeprefix("SIG")
    known = sorted(s.name[3:] for s in signal.Signals if s.name.startswith("SIG") and not s.name.startswith("SIG_"))
    if name not in known:
        raise ConfigError(f"{source}: 'signal' names {name!r}, which is not a signal; use one of {known} with "
                          f"@SECONDS ({example})")
    if name in ("KILL", "STOP", "TERM", "INT"):
        raise ConfigError(f"{source}: 'signal' cannot be {name}: it ends the worker loops instead of warning them; "
                          f"use USR2 ({example})")
    if name == "USR1":
        raise ConfigError(f"{source}: 'signal' cannot be USR1: NCCL's watchdog uses it; use USR2 ({example})")
    if not secs.isdigit() or not 1 <= int(secs) <= 65535:
        raise ConfigError(f"{source}: 'signal' needs the seconds before the end after '@' (1-65535), got {value!r} "
                          f"({example})")
    return name, int(secs)


def parse_params(params: Mapping[str, Any], source: str) -> SlurmParams:
    """Check an entry's parameters; ``ConfigError`` naming ``source`` otherwise."""
    unknown = sorted(set(params) - ALL_KEYS)
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, sorted(ALL_KEYS), n=1)
            if close:
                hints.append(f"{k!r} -> {close[0]!r}?")
        raise ConfigError(
            f"{source}: unknown parameter(s) {unknown} for scheduler 'slurm'"
            + (f" (did you mean: {', '.join(hints)})" if hints else "")
            + f"; it accepts {sorted(ALL_KEYS)} (see docs/slurm.md)"
        )
    p = params
    time = p.get("time")
    if time is not None:
        if isinstance(time, bool) or not isinstance(time, (str, int)) or (isinstance(time, int) and time < 1) \
                or (isinstance(time, str) and slurm_time_seconds(time) is None):
            raise _bad(source, "time", "minutes (an integer) or a Slurm time such as \"HH:MM:SS\" or \"D-HH:MM\"",
                       time, 'time = "01:00:00"')
        time = str(time).strip()
    gpus = p.get("gpus_per_node")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, (int, str)) or (isinstance(gpus, int) and gpus < 0) \
                or (isinstance(gpus, str) and not re.match(r"^([A-Za-z0-9_.-]+:)?\d+$", gpus.strip())):
            raise _bad(source, "gpus_per_node", "a count, or TYPE:COUNT", gpus, 'gpus_per_node = 8 or "a100:8"')
        gpus = str(gpus).strip()
    mem = p.get("mem")
    if mem is not None:
        if isinstance(mem, bool) or not isinstance(mem, (int, str)) or \
                (isinstance(mem, str) and not re.match(r"^\d+[KMGT]?$", mem.strip().upper())):
            raise _bad(source, "mem", "MiB per node (an integer) or a size such as \"64G\"", mem, 'mem = "64G"')
        mem = str(mem).strip()
    job_id = p.get("job_id")
    if job_id is not None:
        if isinstance(job_id, bool) or not isinstance(job_id, (int, str)) or not str(job_id).strip().isdigit():
            raise _bad(source, "job_id", "the id of a running (or pending) Slurm job", job_id, "job_id = 12345")
        job_id = str(job_id).strip()
    qt = p.get("queue_timeout")
    if qt is not None and (isinstance(qt, bool) or not isinstance(qt, (int, float)) or qt <= 0):
        raise _bad(source, "queue_timeout", "seconds > 0", qt, "queue_timeout = 600")
    python = _str(p, source, "python", 'python = "/shared/venv/bin/python"')
    state_dir = _str(p, source, "state_dir", 'state_dir = "/shared/home/me/.monarch/slurm"')
    job_name = _str(p, source, "job_name", 'job_name = "trainers"')
    sync_dir = _str(p, source, "sync_dir", 'sync_dir = "/local/scratch/{user}/monarch/{job}"')
    if sync_dir is not None and not sync_dir.startswith("/"):
        raise _bad(source, "sync_dir", "an absolute path on the nodes ({job}, {node}, {user} are filled in)", sync_dir,
                   'sync_dir = "/local/scratch/{user}/monarch/{job}"')
    sbatch_args = _args(p, source, "sbatch_args", 'sbatch_args = ["--reservation=mine"]')
    srun_args = _args(p, source, "srun_args", 'srun_args = ["--cpu-bind=none"]')
    check_options(sbatch_args, source, "sbatch_args")
    check_options(srun_args, source, "srun_args")
    return SlurmParams(
        source=source,
        nodes=_int(p, source, "nodes", 1, "nodes = 4"),
        job_id=job_id,
        partition=_str(p, source, "partition", 'partition = "gpu"'),
        time=time,
        gpus_per_node=gpus,
        gres=_str(p, source, "gres", 'gres = "gpu:a100:8"'),
        cpus_per_task=_int(p, source, "cpus_per_task", 1, "cpus_per_task = 16"),
        mem=mem,
        account=_str(p, source, "account", 'account = "my-project"'),
        qos=_str(p, source, "qos", 'qos = "high"'),
        constraint=_str(p, source, "constraint", 'constraint = "ib&a100"'),
        exclusive=_bool(p, source, "exclusive"),
        requeue=_bool(p, source, "requeue"),
        sbatch_args=sbatch_args,
        srun_args=srun_args,
        job_name=job_name or "monarch",
        signal=parse_signal(p.get("signal", DEFAULT_SIGNAL), source),
        queue_timeout=None if qt is None else float(qt),
        python=python,
        state_dir=state_dir or _DEFAULT_STATE_DIR,
        sync_dir=sync_dir or DEFAULT_SYNC_DIR,
    )


def check_options(options: Sequence[str], source: str, key: str) -> None:
    """Options the plugin sets itself may not come again through ``key``."""
    ours = ("--parsable", "--output", "--error", "--wrap", "--jobid", "--label", "--nodelist", "--ntasks")
    for o in options:
        if o.split("=", 1)[0] in ours:
            raise ConfigError(f"{source}: '{key}' may not set {o.split('=', 1)[0]}: the slurm scheduler sets it "
                              "itself (see docs/slurm.md)")
