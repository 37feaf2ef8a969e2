"""The distributed tensor engine, as the mesh API finds it: the plugin that
answers ``monarch_tensor_engine`` (``monarch-tensor-engine``), or an
``ImportError`` saying what to install."""

from __future__ import annotations

from typing import Any

DISTRIBUTION = "monarch-tensor-engine"


def engine(what: str) -> Any:
    """The engine; ``what`` (e.g. ``"ProcMesh.activate()"``) names the caller in the error."""
    from monarch_core._plugins import provided
    from monarch_core.errors import PluginError

    try:
        return provided("monarch_tensor_engine", DISTRIBUTION, f"{what} needs the distributed tensor engine",
                        "it needs torch==2.13.0; see docs/tensors.md")
    except PluginError as e:
        if isinstance(e.__cause__, ImportError):  # the engine is there, what it needs is not (torch)
            raise ImportError(f"{what}: {e.__cause__}") from e.__cause__
        raise
