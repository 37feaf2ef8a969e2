"""monarch-compat's monarch-core plugin (entry point ``compat``).

It implements no hook: loading it, as every proc of a program loads the
installed plugins, adds the reference's attribute names to monarch-core's
classes there (:mod:`monarch_compat._attributes`), and, with
``MONARCH_COMPAT_CPU=1``, the CPU substitution (:mod:`monarch_compat._cpu`).
"""

from __future__ import annotations

from monarch_compat import _attributes, _cpu

_attributes.install()
_cpu.install()  # only with MONARCH_COMPAT_CPU=1: a test aid (docs/compat.md)
