"""monarch-compat's monarch-core plugin (entry point ``compat``).

It implements one hook, ``monarch_settings``; loading it, as every proc of a
program loads the installed plugins, adds the reference's attribute names to monarch-core's
classes there (:mod:`monarch_compat._attributes`), and, with
``MONARCH_COMPAT_CPU=1``, the CPU substitution (:mod:`monarch_compat._cpu`).
"""

from __future__ import annotations

from monarch_compat import _attributes, _cpu
from monarch_core.hookspecs import hookimpl

_attributes.install()
_cpu.install()  # only with MONARCH_COMPAT_CPU=1: a test aid (docs/compat.md)


@hookimpl
def monarch_settings() -> list:
    """The variables this distribution reads (``MONARCH_COMPAT_CPU``, ...)."""
    from monarch_compat import _settings

    return _settings.SETTINGS
