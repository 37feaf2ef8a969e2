"""Fixtures shared by the whole suite (``tests/`` and ``plugins/*/tests``):
a pytest plugin that the root ``conftest.py`` loads (``pytest_plugins``), so
that a plugin's own test folder has them as much as ``tests/`` has.  The
helpers behind them live in the ``_helpers`` package (import it, never a
``conftest`` module).

* ``faults``: the session's recording ``unhandled_fault_hook`` (installed
  for every test, so failures made on purpose cannot end pytest).
* ``poll``: :func:`_helpers.poll_until`; ``run_async``: a fresh trio run.
* ``client_script``: write a script into ``tmp_path`` and run it in a child
  interpreter that imports this checkout.
* ``configured_hosts``: host meshes from a ``monarch.toml`` named through
  ``MONARCH_CONFIG`` (set with ``monkeypatch``); shut down at teardown.
* ``meshes``: a list a test appends the proc meshes it spawns to; they are
  stopped at teardown.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

#: the ``tests`` folder, which holds the ``_helpers`` package
HERE = str(Path(__file__).resolve().parents[1])
if HERE not in sys.path:  # whatever the import mode: ``import _helpers`` works everywhere
    sys.path.insert(0, HERE)
from _helpers.clients import code_roots  # noqa: E402

# Child interpreters a test starts with the inherited environment (rather than
# ``_helpers.clients.child_env``) run the code this process runs, and find
# ``_helpers`` (they import test modules, which import it).
_CODE = code_roots()
os.environ["PYTHONPATH"] = os.pathsep.join(
    dict.fromkeys([*_CODE, HERE, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)])
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test owns the asyncio loops it runs: after the last test of a module (its module's
    fixtures torn down) no asyncio loop may still be running on this thread, or every later
    test of this worker would run inside it (``asyncio.run`` refused, ``Future.get()`` taken
    for a call inside a loop).  The module is failed at its last test's teardown, and the loop
    is taken off the thread so that the tests after it are not failed by it."""
    yield
    if nextitem is not None and nextitem.module is getattr(item, "module", None):
        return  # a module-scoped fixture may still hold a loop until its module's end
    import asyncio

    loop = asyncio._get_running_loop()
    if loop is not None:
        asyncio._set_running_loop(None)
        pytest.fail(f"an asyncio loop is still running on the test thread after the tests of "
                    f"{item.nodeid.split('::', 1)[0]} and their fixtures ended ({loop!r}): close it where it is "
                    "opened (a session-scoped fixture that keeps one open leaks it into every later test)",
                    pytrace=False)


def pytest_report_header() -> str:
    return "monarch code under test: " + ", ".join(_CODE)

from _helpers import poll_until, run_async  # noqa: E402
from _helpers.clients import run_script, write_script  # noqa: E402
from _helpers.config import write_hosts_config  # noqa: E402
from _helpers.faults import RECORDER, FaultRecorder  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_faults() -> Iterator[FaultRecorder]:
    """Install :data:`_helpers.faults.RECORDER` as the fault hook for the
    session; restore the previous hook afterwards."""
    import monarch_core.actor as mactor

    saved = mactor.unhandled_fault_hook
    mactor.unhandled_fault_hook = RECORDER
    yield RECORDER
    mactor.unhandled_fault_hook = saved


@pytest.fixture
def faults() -> FaultRecorder:
    """The recording fault hook (every failure that reached this client)."""
    return RECORDER


@pytest.fixture(name="poll")
def poll_fixture() -> Callable[..., Any]:
    """``poll(predicate, timeout=T, what=None)``: :func:`_helpers.poll_until`."""
    return poll_until


@pytest.fixture(name="run_async")
def run_async_fixture() -> Callable[..., Any]:
    """``run_async(afn, *args, timeout=20)``: ``afn`` in a fresh trio run."""
    return run_async


@pytest.fixture
def client_script(tmp_path: Path) -> Callable[..., Any]:
    """``client_script(body, *args, env=None, timeout=60, name="client.py")``:
    write ``body`` into ``tmp_path`` and run it (:func:`_helpers.clients.run_script`);
    returns the ``CompletedProcess``."""

    def run(body: str, *args: str, name: str = "client.py", **kw: Any) -> Any:
        return run_script(write_script(tmp_path, body, name), *args, **kw)

    return run


@pytest.fixture
def configured_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``configured_hosts(name="two", hosts=2, scheduler="local", **settings)``:
    ``hosts_from_config(name)`` for a ``[hosts.<name>]`` table written to
    ``tmp_path/monarch.toml`` (``MONARCH_CONFIG`` names it for the rest of the
    test).  Every host mesh made is shut down at teardown."""
    from monarch_core.actor import hosts_from_config

    made: list = []

    def make(name: str = "two", **settings: Any) -> Any:
        monkeypatch.setenv("MONARCH_CONFIG", str(write_hosts_config(tmp_path, name, **settings)))
        hm = hosts_from_config(name)
        made.append(hm)
        return hm

    yield make
    for hm in made:
        try:
            hm.shutdown().get(timeout=60)
        except Exception:  # noqa: BLE001, S110 - already shut down by the test, or best-effort clean-up
            pass


@pytest.fixture
def meshes() -> Iterator[list]:
    """Proc meshes a test spawns (append them); stopped at the end of the test."""
    made: list = []
    yield made
    for pm in made:
        try:
            pm.stop().get(timeout=30)
        except Exception:  # noqa: BLE001, S110 - best-effort clean-up
            pass
