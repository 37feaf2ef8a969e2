"""Loaded at start-up by every Python process that ``python -m monarch_compat.cpu``
starts (its directory is put first on ``PYTHONPATH``): installs the CPU
substitution of :mod:`monarch_compat._cpu` there, a test aid (docs/compat.md)."""

from monarch_compat import _cpu

_cpu.install()
