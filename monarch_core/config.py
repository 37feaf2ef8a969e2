"""``configure()`` and ``configured()``: runtime settings from Python, as
``monarch.config`` offers them in the reference.

Every setting is one of the ``MONARCH_*`` variables declared in
:mod:`monarch_core.settings` (``monarch settings`` lists them, plugins'
included).  A keyword names one by its variable (``MONARCH_DELIVERY_TIMEOUT``)
or by the rest of it in lower case (``delivery_timeout``).  A value is checked
as the variable's text would be (a ``ConfigError`` naming it otherwise) and
then set in this process's environment, so that the code that reads the
setting next, and every proc started from here afterwards, sees it.

A setting read once when the runtime starts (the transport, the listener)
takes effect for a runtime started afterwards: configure those before the
first mesh.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Any, Iterator

from monarch_core import settings
from monarch_core.errors import ConfigError

__all__ = ["configure", "configured", "get_configuration", "host_mesh_names"]


def _name(key: str) -> str:
    name = key if key.startswith("MONARCH_") else "MONARCH_" + key.upper()
    try:
        settings.get(name)
    except KeyError:
        import difflib

        known = [s.name for s in settings.all_settings()]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(f"configure({key}=...): {name} is not a setting; {hint}`monarch settings` lists them "
                          f"(a plugin's appear once it is installed)") from None
    except ConfigError:
        pass  # declared; its current value is malformed, which the new one replaces
    return name


def _text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        text = "1" if value else "0"
    elif isinstance(value, (list, tuple, set, frozenset)):
        text = ",".join(str(v) for v in value)
    else:
        text = str(value)
    settings.get(name, {name: text})  # the variable's own check: ConfigError naming it
    return text


def _apply(items: dict[str, Any]) -> dict[str, str | None]:
    """Check every item first (nothing is set on an error), then set them; the previous texts."""
    texts: dict[str, str | None] = {}
    for key, value in items.items():
        name = _name(key)
        if name in texts:
            raise ConfigError(f"configure(): {key}=... sets {name} a second time in the same call")
        texts[name] = _text(name, value)
    previous = {name: os.environ.get(name) for name in texts}
    for name, text in texts.items():
        if text is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = text
    return previous


def configure(**kwargs: Any) -> None:
    """Set settings for this process and the procs started from it
    (``configure(delivery_timeout=5, log_level="DEBUG")``); ``None`` goes
    back to the default.  All are checked before any is set."""
    _apply(kwargs)


@contextlib.contextmanager
def configured(**kwargs: Any) -> Iterator[dict[str, Any]]:
    """:func:`configure` for a block: the previous values come back at its
    end.  Yields :func:`get_configuration`, as it is inside the block."""
    previous = _apply(kwargs)
    try:
        yield get_configuration()
    finally:
        for name, text in previous.items():
            if text is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = text


def get_configuration() -> dict[str, Any]:
    """Every declared setting's current value, by variable name."""
    out: dict[str, Any] = {}
    for s in settings.all_settings():
        try:
            out[s.name] = settings.get(s.name)
        except ConfigError as e:
            out[s.name] = e
    return out


def host_mesh_names(start: str | os.PathLike[str] | None = None) -> tuple[pathlib.Path | None, list[str]]:
    """The configuration file that ``hosts_from_config`` reads (``$MONARCH_CONFIG``,
    else the nearest ``monarch.toml`` or ``pyproject.toml`` with a
    ``[tool.monarch]`` table from ``start``, default the working directory,
    upward) and the host mesh names it defines, sorted; ``(None, [])`` when
    there is no such file (``hosts_from_config`` then falls back to its
    defaults).  ``ConfigError`` for a file that is malformed.  For tools that
    take a host mesh name (``monarch torchrun --hosts NAME``) and must refuse
    one that names nothing."""
    from monarch_core import _config

    path = _config.find_config_file(start)
    if path is None:
        return None, []
    return path, sorted(_config.load_config(path))
