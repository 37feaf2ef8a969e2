"""The reference's ``monarch.config``: ``configure``/``configured`` are
``monarch_core.config``'s (settings are the ``MONARCH_*`` variables:
``monarch settings`` lists them), and ``ChannelTransport`` is
``monarch_core.ChannelTransport``; ``get_runtime_config()`` is the settings
set in this process (what ``configure(**get_runtime_config())`` restores
elsewhere)."""

from __future__ import annotations

import os
from typing import Any

from monarch_core import ChannelTransport, settings
from monarch_core.config import configure, configured, get_configuration

__all__ = ["ChannelTransport", "configure", "configured", "get_configuration", "get_runtime_config"]


def get_runtime_config() -> dict[str, Any]:
    """The declared settings set in this process (by ``configure()`` or its
    environment), by variable name, as their text: ``configure(**snapshot)``
    in another process sets the same (the reference's snapshot of its
    Python-set layer, for the same snapshot/restore use)."""
    return {s.name: os.environ[s.name] for s in settings.all_settings() if s.name in os.environ}
