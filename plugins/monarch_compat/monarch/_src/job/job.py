"""The reference's ``monarch._src.job.job``: ``JobTrait`` and ``JobState`` (and
the jobs) are ``monarch_core.job``'s."""

from __future__ import annotations

from typing import Any

__all__ = ["JobState", "JobTrait", "LocalJob"]


def __getattr__(name: str) -> Any:  # resolved when used: monarch_core.job loads only then
    if name in __all__:
        import monarch_core.job

        return getattr(monarch_core.job, name)
    raise AttributeError(f"module 'monarch._src.job.job' has no attribute {name!r}")
