"""monarch-compat's monarch-core plugin (entry point ``compat``).

It implements no hook: loading it, as every proc of a program loads the
installed plugins, adds the reference's attribute names to monarch-core's
classes there (:mod:`monarch_compat._attributes`).
"""

from __future__ import annotations

from monarch_compat import _attributes

_attributes.install()
