"""A module-level counter: ``lifecycle.py`` adds one per run.  In a fresh
process (every run of a rank's script) it starts at 0."""
RUNS = 0
