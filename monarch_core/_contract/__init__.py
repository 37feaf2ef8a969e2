"""The plugin contract, one private module per seam.

Import the contract from its public façade, :mod:`monarch_core.hookspecs`
(plugins, built-ins and the core alike): the names there are these modules'
objects.  ``_common`` holds what every seam shares (the project name, the
hook markers, lazily imported factories); ``_transport``, ``_scheduler``,
``_bootstrap``, ``_lifecycle``, ``_telemetry``, ``_rdma``, ``_settings``, ``_tensor`` and ``_spmd`` each hold one family of hooks
with its types, and import only ``_common`` (and ``monarch_core.errors`` /
``monarch_core._workspace``), never each other.
"""
