"""The reference's ``monarch._src.job.process``: ``ProcessJob`` is ``monarch_core.job``'s."""

from __future__ import annotations

from typing import Any

__all__ = ["ProcessJob"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import monarch_core.job

        return getattr(monarch_core.job, name)
    raise AttributeError(f"module 'monarch._src.job.process' has no attribute {name!r}")
