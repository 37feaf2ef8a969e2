"""Kept so that ``python -m monarch_core._actor._proc_main`` (the proc module
before the launch code moved to :mod:`monarch_core._launch`) still starts a
proc: a ``BootstrapCommand`` written with the old module name keeps working."""

from monarch_core._launch._proc_main import main, tune_malloc  # noqa: F401

if __name__ == "__main__":
    main()
