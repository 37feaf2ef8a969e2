"""The debugger's hooks: every new proc gets the remote-pdb breakpoint hook;
an endpoint that raises after its message stopped at a breakpoint stops again
(post-mortem); a proc that begins to stop releases the ranks stopped in it."""

from __future__ import annotations

from monarch_core.hookspecs import hookimpl
from monarch_debugger import _hook


@hookimpl
def monarch_proc_setup(proc_name: str, rank: int) -> None:
    _hook.install()


@hookimpl
def monarch_endpoint_raised(exc: BaseException) -> None:
    _hook.post_mortem(exc)


@hookimpl
def monarch_proc_stopping(why: str) -> None:
    _hook.stopping(why)


@hookimpl
def monarch_settings() -> list:
    from monarch_debugger import _settings  # lazy: the hooks of every proc's start stay import-light

    return _settings.SETTINGS
