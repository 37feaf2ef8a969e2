"""Where running dashboards leave their URL for ``monarch dashboard`` (like
``jupyter server list``): one JSON file per client process in a directory only
its user can read (``$XDG_RUNTIME_DIR/monarch-dashboards``, else
``~/.cache/monarch/dashboards``; directory 0700, files 0600)."""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Optional


def directory() -> pathlib.Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = pathlib.Path(base) / "monarch-dashboards" if base else pathlib.Path.home() / ".cache" / "monarch" / "dashboards"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    return d


def write(info: dict[str, Any]) -> Optional[pathlib.Path]:
    """Record this dashboard (None where the directory cannot be written)."""
    try:
        path = directory() / f"{os.getpid()}-{info['port']}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        return path
    except OSError:
        return None


def running() -> list[dict[str, Any]]:
    """The dashboards of live processes (files of dead ones are removed)."""
    out = []
    try:
        files = sorted(directory().glob("*.json"))
    except OSError:
        return []
    for p in files:
        try:
            info = json.loads(p.read_text())
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
            continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append(info)
    return out
