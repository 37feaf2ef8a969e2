"""``monarch._src.actor``: see the submodules."""
