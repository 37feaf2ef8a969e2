"""``python -m monarch_compat.cpu program.py [args...]``: run a program written
for GPUs on CPU only (a test aid, not a feature; docs/compat.md).

Sets ``MONARCH_COMPAT_CPU=1`` and puts a directory holding a
``sitecustomize`` first on ``PYTHONPATH``, so that this process and every
Python process started from it (procs, torchrun's ranks, scripts run by
them) install :mod:`monarch_compat._cpu`'s substitution; then runs the
program as ``__main__``, as ``python program.py`` would (its directory first
on ``sys.path``, ``sys.argv`` its own).
"""

from __future__ import annotations

import os
import runpy
import sys

from monarch_compat import _cpu

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cpu_site")


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` (a script path) with ``argv[1:]`` under the substitution."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    os.environ[_cpu.ENV] = "1"
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = SITE + (os.pathsep + path if path else "")
    _cpu.install()
    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
