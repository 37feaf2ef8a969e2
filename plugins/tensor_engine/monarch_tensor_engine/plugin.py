"""Hook implementation of monarch-tensor-engine (import-light: torch and the
engine are imported when the engine is first asked for)."""

from __future__ import annotations

from monarch_core.hookspecs import hookimpl


@hookimpl
def monarch_tensor_engine() -> object:
    # lazy, as this whole module: the plugin registry loads it in every process, torch and the engine only
    # where the engine is asked for
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the distributed tensor engine needs torch (pip install torch==2.13.0): {e}") from e
    from monarch_tensor_engine import api

    return api


@hookimpl
def monarch_settings() -> list:
    from monarch_tensor_engine import _settings  # lazy: this hook module stays import-light (see the module docstring)

    return _settings.SETTINGS
