"""The settings seam of the plugin contract: a plugin declares its own
``MONARCH_*`` environment variables.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from monarch_core._contract._common import hookspec

if TYPE_CHECKING:
    from monarch_core.settings import Setting

__all__ = ["monarch_settings"]


@hookspec
def monarch_settings() -> Sequence[Setting]:
    """The ``MONARCH_*`` variables this plugin reads, declared once.

    Called once per process, when the plugin registry loads the plugin; each
    :class:`~monarch_core.settings.Setting` gets the plugin's distribution as
    its ``owner``.  Then ``settings.get(name)`` parses the variable (a
    malformed value is a ``ConfigError`` naming it and what it expects) and
    ``monarch settings`` lists it beside the core's.  A name the core or
    another plugin declares already makes the plugin broken (``monarch
    plugins`` says so); name yours ``MONARCH_<PLUGIN>_...``.  Code of the
    plugin that may run before the registry loads it (imported directly)
    calls ``settings.declare(SETTINGS, owner)`` first -- it is idempotent.

    Complete example::

        from monarch_core import settings
        from monarch_core.hookspecs import Setting, hookimpl

        SETTINGS = [Setting("MONARCH_ZLIB_LEVEL", "int", 6, "zlib compression level of the zlib transport",
                            minimum=0)]

        @hookimpl
        def monarch_settings():
            return SETTINGS

        def level() -> int:
            settings.declare(SETTINGS, "monarch-zlib-transport")
            return settings.get("MONARCH_ZLIB_LEVEL")
    """
