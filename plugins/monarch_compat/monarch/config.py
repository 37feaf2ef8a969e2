"""The reference's ``monarch.config``: ``configure``/``configured`` are
``monarch_core.config``'s (settings are the ``MONARCH_*`` variables:
``monarch settings`` lists them), and ``ChannelTransport`` is
``monarch_core.ChannelTransport``."""

from __future__ import annotations

from monarch_core import ChannelTransport
from monarch_core.config import configure, configured, get_configuration

__all__ = ["ChannelTransport", "configure", "configured", "get_configuration"]
