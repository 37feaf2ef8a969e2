"""Configured host meshes: a ``monarch.toml`` named through ``MONARCH_CONFIG``
(set with ``pytest.MonkeyPatch``, so the variable is always put back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def toml_value(v: Any) -> str:
    """``v`` (bool, number, str, list, dict) as a TOML value."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {v!r}")


def write_hosts_config(directory: Path, name: str = "two", *, scheduler: str = "local", **settings: Any) -> Path:
    """``directory/monarch.toml`` with one ``[hosts.<name>]`` table
    (``hosts=2`` unless ``settings`` say otherwise)."""
    settings = {"hosts": 2, **settings}
    lines = [f"[hosts.{name}]"] + [f"{k} = {toml_value(v)}" for k, v in {"scheduler": scheduler, **settings}.items()]
    path = Path(directory) / "monarch.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def configured_host_mesh(directory: Path, name: str = "two", **settings: Any):  # type: ignore[no-untyped-def]
    """``hosts_from_config(name)`` with ``MONARCH_CONFIG`` naming a config
    written by :func:`write_hosts_config`; the variable is restored at once
    (for fixtures of any scope; function-scoped ones can use the
    ``configured_hosts`` fixture)."""
    import pytest

    from monarch_core.actor import hosts_from_config

    cfg = write_hosts_config(directory, name, **settings)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MONARCH_CONFIG", str(cfg))
        return hosts_from_config(name)
