"""``monarch._src.job``: see the submodules (all from ``monarch_core.job``)."""
