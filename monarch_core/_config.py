"""Lookup and validation of named host mesh definitions from project configuration.

This module backs ``hosts_from_config(name)``: it finds the project's
configuration file, parses it, validates the shape of every host mesh entry
and returns a :class:`HostMeshConfig` for the requested name.  It does *not*
allocate anything and does *not* validate scheduler-specific parameters (each
scheduler validates its own ``params``).

File format (see ``docs/configuration.md`` for the full description)::

    # monarch.toml                    # or, in pyproject.toml:
    [defaults]                        # [tool.monarch.defaults]
    time = "01:00:00"

    [hosts.dev]                       # [tool.monarch.hosts.dev]
    scheduler = "local"
    hosts = 2

Discovery order (:func:`find_config_file`):

1. ``$MONARCH_CONFIG`` (path to a ``monarch.toml`` or ``pyproject.toml``) if set
   and non-empty; a missing file is an error.
2. Otherwise, starting at the current working directory (or ``start``) and
   walking up to the filesystem root, in each directory: ``monarch.toml`` if it
   exists, else ``pyproject.toml`` if it has a ``[tool.monarch]`` table.  A
   ``pyproject.toml`` without ``[tool.monarch]`` is skipped.

Every error raised here is a :class:`ConfigError` whose message names the file
involved (when there is one) and explains how to fix the problem.
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
import pathlib
import re
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from monarch_core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

__all__ = [
    "CONFIG_ENV_VAR",
    "ConfigError",
    "HostMeshConfig",
    "MONARCH_TOML",
    "PYPROJECT_TOML",
    "default_host_mesh",
    "find_config_file",
    "load_config",
    "lookup_host_mesh",
]

logger = logging.getLogger("monarch.config")

#: Environment variable that, when set (non-empty), names the configuration
#: file to use and disables the directory search.
CONFIG_ENV_VAR = "MONARCH_CONFIG"

#: Dedicated configuration file name; wins over pyproject.toml in the same dir.
MONARCH_TOML = "monarch.toml"

#: Project file name; used only when it contains a ``[tool.monarch]`` table.
PYPROJECT_TOML = "pyproject.toml"

@dataclass(frozen=True)
class HostMeshConfig:
    """One validated ``[hosts.<name>]`` entry.

    Attributes:
        name: The entry's name (the ``<name>`` in ``[hosts.<name>]``).
        scheduler: The scheduler that allocates this mesh (non-empty str).
        params: Every other key of the entry after merging ``[defaults]``
            underneath it (entry keys win; the merge is shallow, i.e. a table
            value in the entry replaces the whole table from defaults).  This
            dict is a fresh copy owned by this object; it never contains
            ``"scheduler"``.  Values are passed to the scheduler unvalidated.
        source: Where the entry came from: the file path followed by a space
            and the TOML table locator, e.g.
            ``"/proj/monarch.toml [hosts.dev]"`` or
            ``"/proj/pyproject.toml [tool.monarch.hosts.dev]"``.

    Instances are immutable in their fields but, because ``params`` is a dict,
    they are not hashable.
    """

    name: str
    scheduler: str
    params: dict[str, Any]
    source: str
    #: Keys of ``params`` that came from ``[defaults]`` only (not set in the entry).
    defaults_keys: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(key: str) -> str:
    """Render ``key`` as a TOML key: bare if possible, else a quoted string."""
    if _BARE_KEY.match(key):
        return key
    return json.dumps(key)  # JSON string escaping is valid TOML basic-string syntax


def _prefix(path: pathlib.Path) -> str:
    """The dotted table prefix under which Monarch config lives in ``path``."""
    return "tool.monarch." if path.name == PYPROJECT_TOML else ""


def _locator(path: pathlib.Path, table: str) -> str:
    """``[hosts.x]``-style locator for ``table`` (a dotted key path) in ``path``."""
    return f"[{_prefix(path)}{table}]"


def _hosts_table(name: str) -> str:
    return f"hosts.{_toml_key(name)}"


def _example_snippet(path: pathlib.Path | None, name: str) -> str:
    """A minimal, indented TOML example defining host mesh ``name``."""
    prefix = _prefix(path) if path is not None else ""
    return (
        f"    [{prefix}{_hosts_table(name)}]\n"
        f'    scheduler = "local"\n'
        f"    hosts = 2"
    )


def _fmt_names(names: Sequence[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "(none)"


def _read_toml(path: pathlib.Path) -> dict[str, Any]:
    """Parse ``path`` as TOML, converting every failure into a ConfigError."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"Monarch config file {path} does not exist.") from None
    except IsADirectoryError:
        raise ConfigError(
            f"Monarch config path {path} is a directory; expected a path to a "
            f"{MONARCH_TOML} or {PYPROJECT_TOML} file."
        ) from None
    except OSError as e:
        raise ConfigError(
            f"Cannot read Monarch config file {path}: {e.strerror or e}"
        ) from e
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"Monarch config file {path} is not valid UTF-8 TOML: {e}"
        ) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"Monarch config file {path} is not valid TOML: {e}\n"
            f"Fix the syntax at that position. A valid host mesh entry looks like:\n"
            f"{_example_snippet(path, 'my_mesh')}"
        ) from e


def _need_table(value: Any, path: pathlib.Path, what: str, fix: str = "") -> dict:
    """``value`` when it is a table, else the ConfigError: in ``path``, ``what``
    (``"[hosts] must be a table"``), got what it is, and ``fix``."""
    if not isinstance(value, dict):
        raise ConfigError(f"In {path}: {what}, got {type(value).__name__}.{fix}")
    return value


# ---------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------


def _env_config_path() -> pathlib.Path | None:
    """Path named by ``$MONARCH_CONFIG``, or None if unset/empty.

    Raises ConfigError if the variable is set but names no existing file.
    """
    value = os.environ.get(CONFIG_ENV_VAR)
    if not value:
        return None
    path = pathlib.Path(os.path.abspath(os.path.expanduser(value)))
    if not path.exists():
        raise ConfigError(
            f"{CONFIG_ENV_VAR}={value!r} but the file {path} does not exist. "
            f"Point {CONFIG_ENV_VAR} at an existing {MONARCH_TOML} or "
            f"{PYPROJECT_TOML}, or unset it to search from the current "
            f"directory upward."
        )
    if not path.is_file():
        raise ConfigError(
            f"{CONFIG_ENV_VAR}={value!r} names {path}, which is not a file. "
            f"Point {CONFIG_ENV_VAR} at a {MONARCH_TOML} or {PYPROJECT_TOML} file."
        )
    return path


def _search_start(start: str | os.PathLike[str] | None) -> pathlib.Path:
    base = pathlib.Path(os.path.abspath(os.fspath(start) if start is not None else os.getcwd()))
    if base.is_file():
        base = base.parent
    return base


def find_config_file(start: str | os.PathLike[str] | None = None) -> pathlib.Path | None:
    """Locate the Monarch configuration file.

    Contract:
        * If ``$MONARCH_CONFIG`` is set and non-empty it overrides everything
          (including ``start``): its path (made absolute, ``~`` expanded) is
          returned if it is an existing file, otherwise :class:`ConfigError` is
          raised naming it.  The file is not parsed here.
        * Otherwise the search begins at ``start`` (default: the current
          working directory; a file path means its directory) and walks up to
          the filesystem root.  In each directory, ``monarch.toml`` is returned
          if it is a file; else ``pyproject.toml`` is returned if it is a file
          containing a ``tool.monarch`` key; a ``pyproject.toml`` without one is
          skipped and the search continues upward.
        * Returns an absolute path, or ``None`` if nothing was found.

    Raises:
        ConfigError: ``$MONARCH_CONFIG`` names a missing/non-file path, or a
            ``pyproject.toml`` encountered during the search is not valid TOML
            (its contents cannot be inspected, so the search cannot safely
            skip it).
    """
    env_path = _env_config_path()
    if env_path is not None:
        return env_path

    directory = _search_start(start)
    for d in (directory, *directory.parents):
        candidate = d / MONARCH_TOML
        if candidate.is_file():
            return candidate
        pyproject = d / PYPROJECT_TOML
        if pyproject.is_file():
            tool = _read_toml(pyproject).get("tool")
            if isinstance(tool, dict) and "monarch" in tool:
                return pyproject
    return None


# ---------------------------------------------------------------------------
# Parsing and validation
# ---------------------------------------------------------------------------


def load_config(path: pathlib.Path) -> dict[str, HostMeshConfig]:
    """Parse ``path`` and validate every host mesh entry in it.

    The file's layout is chosen by its name: a file named ``pyproject.toml``
    keeps its Monarch tables under ``[tool.monarch]``; any other file name is
    read as a ``monarch.toml`` (tables at top level).  Tables other than
    ``hosts`` and ``defaults`` are ignored.

    Contract:
        * Returns ``{name: HostMeshConfig}`` for every entry of the hosts table,
          in file order.  A file with no hosts table (including a
          ``pyproject.toml`` without ``[tool.monarch]``) yields ``{}``.
        * ``params`` of each entry are a deep copy of ``defaults`` updated with
          the entry's own keys (minus ``scheduler``); entry keys win.
        * ``scheduler`` may come from the entry or from ``defaults``; after the
          merge it must be a non-empty str.

    Raises:
        ConfigError: the file is missing/unreadable or not valid TOML (message
            includes the parser's line/column), or a table has the wrong type
            (``tool.monarch``, ``hosts``, ``defaults``, an entry, or a
            missing/non-str/empty ``scheduler``).  Messages name the file and,
            where applicable, the entry's table locator.
    """
    path = pathlib.Path(path)
    data = _read_toml(path)
    if path.name == PYPROJECT_TOML:
        tool = _need_table(data.get("tool", {}), path, "'tool' must be a table")
        if "monarch" not in tool:
            return {}
        root = _need_table(tool["monarch"], path, "[tool.monarch] must be a table",
                           f" Define host meshes like:\n{_example_snippet(path, 'my_mesh')}")
    else:
        root = data
    defaults = _need_table(
        root.get("defaults", {}), path,
        f"{_locator(path, 'defaults')} must be a table of parameters merged under every host mesh entry",
        f' For example:\n    [{_prefix(path)}defaults]\n    scheduler = "local"',
    )
    hosts = _need_table(
        root.get("hosts", {}), path, f"{_locator(path, 'hosts')} must be a table of host mesh entries",
        f" Write one sub-table per mesh, for example:\n{_example_snippet(path, 'my_mesh')}",
    )

    result: dict[str, HostMeshConfig] = {}
    for name, entry in hosts.items():  # (TOML keys are str)
        loc = _locator(path, _hosts_table(name))
        _need_table(entry, path, f"host mesh entry {name!r} ({loc}) must be a table",
                    f" Write it as:\n{_example_snippet(path, name)}")
        merged: dict[str, Any] = copy.deepcopy(defaults)
        merged.update(copy.deepcopy(entry))
        if "scheduler" not in merged:
            raise ConfigError(
                f"In {path}: host mesh entry {name!r} ({loc}) is missing the "
                f"required 'scheduler' key (set it in the entry or in "
                f"{_locator(path, 'defaults')}). For example:\n"
                f"{_example_snippet(path, name)}"
            )
        scheduler = merged.pop("scheduler")
        if not isinstance(scheduler, str) or not scheduler:
            got = repr(scheduler) if isinstance(scheduler, str) else type(scheduler).__name__
            raise ConfigError(
                f"In {path}: host mesh entry {name!r} ({loc}) has an invalid "
                f"'scheduler': it must be a non-empty str naming a scheduler, "
                f"got {got}. For example:\n{_example_snippet(path, name)}"
            )
        result[name] = HostMeshConfig(
            name=name,
            scheduler=scheduler,
            params=merged,
            source=f"{path} {loc}",
            defaults_keys=frozenset(k for k in defaults if k not in entry and k != "scheduler"),
        )
    return result


# ---------------------------------------------------------------------------
# Lookup
# ---------------------------------------------------------------------------


def _no_config_error(name: str, start: str | os.PathLike[str] | None) -> ConfigError:
    directory = _search_start(start)
    root = directory.anchor or os.sep
    return ConfigError(
        f"No Monarch config file found while looking up host mesh {name!r}.\n"
        f"Searched {directory} and every parent directory up to {root} for "
        f"{MONARCH_TOML}, or a {PYPROJECT_TOML} with a [tool.monarch] table; "
        f"{CONFIG_ENV_VAR} is not set.\n"
        f"To fix, create {directory / MONARCH_TOML} (or set "
        f"{CONFIG_ENV_VAR}=/path/to/{MONARCH_TOML}) containing, for example:\n"
        f"{_example_snippet(None, name)}\n"
        f"or add the same entry to {PYPROJECT_TOML} as:\n"
        f"{_example_snippet(pathlib.Path(PYPROJECT_TOML), name)}"
    )


def lookup_host_mesh(
    name: str,
    *,
    installed_schedulers: Sequence[str],
    start: str | os.PathLike[str] | None = None,
) -> HostMeshConfig:
    """Find, load and validate the configuration for host mesh ``name``.

    Args:
        name: The ``<name>`` of a ``[hosts.<name>]`` entry.
        installed_schedulers: Names of the schedulers available in this
            process (e.g. from plugin discovery).  Used to check the entry's
            scheduler and to compose error messages.
        start: Directory where the upward search begins (default: cwd).
            Ignored when ``$MONARCH_CONFIG`` is set.

    Contract:
        Discovery follows :func:`find_config_file`; the whole file is parsed
        and *every* entry validated by :func:`load_config` (so a broken entry
        is reported even when a different name is requested).  Only the
        requested entry's scheduler is checked against
        ``installed_schedulers``.  Scheduler-specific parameters are not
        validated.

    Raises:
        ConfigError: ``name`` is not a non-empty str; no config file was
            found; the file is malformed or has wrongly-typed entries; ``name``
            is not configured (lists configured names and installed
            schedulers); or the entry's scheduler is not installed (lists
            installed schedulers and, for known plugin schedulers, the
            ``pip install`` command that provides it).
        TypeError: ``installed_schedulers`` is a single str instead of a
            sequence of str.
    """
    if isinstance(installed_schedulers, str):
        raise TypeError(
            "installed_schedulers must be a sequence of scheduler names, not a str"
        )
    installed = sorted(set(installed_schedulers))

    if not isinstance(name, str) or not name:
        got = repr(name) if isinstance(name, str) else type(name).__name__
        raise ConfigError(
            f"Host mesh name must be a non-empty str naming a [hosts.<name>] "
            f"entry, got {got}."
        )

    path = find_config_file(start)
    if path is None:
        raise _no_config_error(name, start)

    entries = load_config(path)
    if name not in entries:
        configured = sorted(entries)
        msg = (
            f"Host mesh {name!r} is not configured in {path}.\n"
            f"Configured host meshes: {_fmt_names(configured)}.\n"
            f"Installed schedulers: {_fmt_names(installed)}.\n"
        )
        close = difflib.get_close_matches(name, configured, n=1)
        if close:
            msg += f"Did you mean {close[0]!r}?\n"
        msg += f"To define it, add to {path}:\n{_example_snippet(path, name)}"
        raise ConfigError(msg)

    entry = entries[name]
    if entry.scheduler not in installed:
        loc = _locator(path, _hosts_table(name))
        msg = (
            f"Host mesh {name!r} ({loc} in {path}) uses scheduler "
            f"{entry.scheduler!r}, which is not installed.\n"
            f"Installed schedulers: {_fmt_names(installed)}.\n"
        )
        from monarch_core._plugins import KNOWN_SCHEDULER_PACKAGES, broken_note, install_hint

        package = KNOWN_SCHEDULER_PACKAGES.get(entry.scheduler)
        close = difflib.get_close_matches(entry.scheduler, installed, n=1)
        if package is not None:
            msg += f"The {entry.scheduler!r} scheduler is provided by the plugin {package}: {install_hint(package)}"
        elif close:
            msg += (
                f"Did you mean scheduler = {json.dumps(close[0])}? "
                f"Fix the 'scheduler' key of {loc} in {path}."
            )
        else:
            msg += (
                f"Install the package that provides the {entry.scheduler!r} "
                f"scheduler, or change the 'scheduler' key of {loc} in {path} "
                f"to one of the installed schedulers."
            )
        note = broken_note()  # a plugin that failed may be the one that provides it
        if note:
            msg += "\n" + note.strip()
        raise ConfigError(msg)
    return entry


# ---------------------------------------------------------------------------
# Zero-config defaults
# ---------------------------------------------------------------------------

#: The ``source`` of a :class:`HostMeshConfig` made by :func:`default_host_mesh`.
DEFAULT_SOURCE = "<no configuration file: the default host mesh>"


def default_host_mesh(
    name: str,
    *,
    installed_schedulers: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> HostMeshConfig:
    """The host mesh ``name`` when no configuration file exists at all
    (:func:`find_config_file` returned ``None``).

    Contract:
        * Inside a Slurm allocation (``SLURM_JOB_ID`` set) with the ``slurm``
          scheduler installed: the allocation itself (``scheduler =
          "slurm"``, no parameters: one host per node of the job).
        * Otherwise: the reference's stand-in, two hosts on this machine
          (``scheduler = "local"``, ``hosts = 2``).
        * Logs one INFO line on ``monarch.config`` saying which, and how to
          configure ``name`` instead.

    A file that exists but does not define ``name`` is not this case:
    :func:`lookup_host_mesh` raises (a typo must not silently become local
    hosts).
    """
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID", "").strip()
    how = (f"define [hosts.{_toml_key(name)}] in {MONARCH_TOML} (or [tool.monarch.hosts.{_toml_key(name)}] in "
           f"{PYPROJECT_TOML}, or name a file with {CONFIG_ENV_VAR}) to choose its hosts")
    if job and "slurm" in installed_schedulers:
        logger.info("hosts_from_config(%r): no configuration file found; inside Slurm job %s, using its allocation "
                    "(one host per node); %s", name, job, how)
        return HostMeshConfig(name=name, scheduler="slurm", params={}, source=DEFAULT_SOURCE)
    extra = ""
    if job:
        from monarch_core._plugins import KNOWN_SCHEDULER_PACKAGES, install_hint

        pkg = KNOWN_SCHEDULER_PACKAGES["slurm"]
        extra = f" (inside Slurm job {job}, but the 'slurm' scheduler is not installed: {install_hint(pkg)})"
    logger.info("hosts_from_config(%r): no configuration file found; using the default, two hosts on this machine "
                "(scheduler \"local\", hosts = 2)%s; %s", name, extra, how)
    return HostMeshConfig(name=name, scheduler="local", params={"hosts": 2}, source=DEFAULT_SOURCE)
