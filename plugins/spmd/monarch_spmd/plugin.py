"""Hook implementation of monarch-spmd (import-light: the actor API and the
launcher are imported when a name of ``monarch_core.spmd`` is first used)."""

from __future__ import annotations

from monarch_core.hookspecs import hookimpl


@hookimpl
def monarch_spmd_api() -> object:
    from monarch_spmd import api

    return api
