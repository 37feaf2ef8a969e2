"""``python -m spmd_pkg.probe OUT [--fail-first]``: argv_probe.py, run as a module
(the same code, in this module's namespace, so that ``sys.argv`` and ``__name__``
are what ``-m`` set)."""
import os

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "argv_probe.py")
with open(_PATH) as _f:
    exec(compile(_f.read(), _PATH, "exec"))  # noqa: S102 - the probe itself, not input
