"""The core's version (``monarch_core.__version__``), in a module of its own
so that the layers below the package's façade can read it."""

__version__ = "0.1.0"
