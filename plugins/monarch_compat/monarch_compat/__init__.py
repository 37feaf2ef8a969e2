"""monarch-compat's machinery (the reference's names themselves are the
``monarch`` package): the check that no other distribution provides
``monarch`` (:mod:`._shadow`), the module aliases (:mod:`._alias`), the
attribute aliases (:mod:`._attributes`) and the plugin that installs those
in every proc (:mod:`.plugin`).  See docs/compat.md."""
