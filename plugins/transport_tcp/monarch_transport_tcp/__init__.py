"""monarch-transport-tcp: channels for monarch-core (see ``plugin``)."""

__version__ = "0.1.0"
