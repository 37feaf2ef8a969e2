"""monarch-scheduler-ssh: host meshes over SSH for monarch-core.

``scheduler = "ssh"`` in ``monarch.toml`` (see this distribution's README and
the project's docs/ssh.md).  Importing this package is cheap: paramiko is
imported only when the scheduler connects.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
