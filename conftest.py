"""Test tiers for the whole suite (``tests/`` and ``plugins/*/tests``).

Every test is in exactly one tier, selected with ``-m``:

* ``unit``: no process, no socket to another process; a module opts in with
  ``pytestmark = pytest.mark.unit``.  The fast tier (``pytest -m unit``) is a
  developer's edit-test loop; a unit test that starts a process fails, saying
  to move it to ``procs``.
* ``testbed``: uses the multi-host testbed (namespace hosts, sshd, Slurm:
  the fixtures in :data:`TESTBED_FIXTURES`).  Marked here, automatically, and
  put in one of two xdist groups, so that, run in parallel (``-n``),
  the tests of one group still run one at a time (they share hosts, links and
  services) while the two groups run side by side: ``testbed-slurm`` (the
  tests that use the Slurm cluster, whose nodes are hosts h5..h7) and
  ``testbed`` (the rest: h1..h4, sshd).  No test of one group touches the
  other's hosts (``tests/_helpers/testbed.py``).
* ``procs``: everything else — real procs on this machine.  Marked here,
  automatically.  A module whose tests share a module- or class-scoped
  fixture (procs started once for the module) is one xdist group of its own,
  so that the fixture is set up once, not once per worker.

``scripts/test.sh`` runs the whole suite in parallel with ``--dist loadgroup``.
The fixtures every folder shares are in ``tests/_helpers/fixtures.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The suite's helpers (the ``_helpers`` package in ``tests/``) and its shared
# fixtures (``_helpers.fixtures``, loaded as a pytest plugin) serve every test
# folder alike: ``tests/`` and each plugin's ``plugins/<name>/tests/``.
_TESTS = str(Path(__file__).resolve().parent / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
pytest_plugins = ["_helpers.fixtures", "_helpers.budgets"]

# A suite started in the background of a non-interactive shell (``pytest ... &``,
# ``nohup``, some CI runners) inherits SIGINT *ignored*, and so would every
# interpreter a test starts: the tests of Ctrl-C, and of a fault that interrupts
# a client's main thread, would then fail for the launcher's reason. Each pytest
# process (xdist workers too) puts the default back before any test runs.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: fixtures that bring up or use the multi-host testbed (tests/_helpers/testbed.py, the scheduler suites)
TESTBED_FIXTURES = frozenset({"netns", "links_up", "sshd", "slurm", "cluster"})
#: of those, the ones on the Slurm cluster's hosts (h5..h7): their own group
SLURM_FIXTURES = frozenset({"slurm", "cluster"})
TIERS = ("unit", "procs", "testbed")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        testbed = bool(TESTBED_FIXTURES.intersection(names))
        if item.get_closest_marker("unit") is not None:
            if testbed:
                raise pytest.UsageError(f"{item.nodeid} is marked unit but uses the testbed fixtures "
                                        f"{sorted(TESTBED_FIXTURES.intersection(item.fixturenames))}: drop the unit mark")
            continue
        if testbed:
            item.add_marker(pytest.mark.testbed)
            item.add_marker(pytest.mark.xdist_group("testbed-slurm" if SLURM_FIXTURES.intersection(names) else "testbed"))
        else:
            item.add_marker(pytest.mark.procs)
            if _shares_a_fixture(item):
                item.add_marker(pytest.mark.xdist_group(f"module-{item.nodeid.split('::', 1)[0]}"))


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture set up once per module or class (procs a
    module's tests share, typically).  Such a module's tests run on one xdist
    worker, so that the fixture is set up once rather than once per worker
    that happens to get one of its tests (each set-up starts procs: seconds)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class", "package")
               for defs in info.name2fixturedefs.values())


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n N --dist loadgroup`` the testbed tests must really share one
    worker.  pytest-xdist (3.8) groups by a ``@group`` suffix it writes into
    ``item._nodeid``, which pytest 9.2 no longer reads: every group is then
    silently ignored, testbed tests run side by side on the same hosts and
    ports and fail in ways that point nowhere near the cause.  Refuse to run
    instead (the test extra pins a pytest that works)."""
    if getattr(config.option, "dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} ignores pytest-xdist's --dist loadgroup groups, so the testbed tests "
            "would run in parallel on shared hosts: install the pytest the test extra pins "
            "(pip install -e '.[test]'), or run without -n"
        )


class _ProcessStarted(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``unit`` test that starts a process fails: the fast tier stays fast."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise _ProcessStarted(f"{request.node.nodeid} is marked unit but started a process: "
                              "remove its module's `pytestmark = pytest.mark.unit` (it then runs in the procs tier)")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    if hasattr(os, "posix_spawn"):
        monkeypatch.setattr(os, "posix_spawn", refuse)
