"""Each test's time budget, and how much of it the test used (a pytest plugin).

A test's budget is its pytest-timeout limit: a ``@pytest.mark.timeout(N)``
on it (or on its module), else the ``timeout`` of ``pyproject.toml``.  The
rule (tests/README.md, "Time budgets"): a budget is at least twice the
longest run of its test measured on the CI machine's kind (2 cores) with two
CPU-bound processes beside the suite -- derived from measured durations, not
guessed.

With ``MONARCH_TEST_DURATIONS=FILE`` set (``scripts/test.sh`` sets it), one
JSON line per finished test is appended to ``FILE``: its node id, the seconds
its setup, call and teardown took together, its budget and its outcome.
``scripts/test_budgets.py FILE...`` reads the files of one or more runs and
names the tests that used more than half their budget.  Under pytest-xdist
the lines are written by the controlling process, from the workers' reports.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import pytest

_ENV = "MONARCH_TEST_DURATIONS"
_KEY = "budget_s"


def budget_of(item: pytest.Item) -> Optional[float]:
    """Seconds pytest-timeout gives ``item`` (None: no limit)."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        value = mark.kwargs.get("timeout", mark.args[0] if mark.args else None)
    else:
        value = item.config.getini("timeout")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The budget travels with the test's reports (``user_properties``)."""
    if not any(k == _KEY for k, _v in item.user_properties):
        item.user_properties.append((_KEY, budget_of(item)))


class _Recorder:
    """Sums each test's phases and appends its line when its teardown is reported."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.spent: dict[str, float] = {}
        self.outcome: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = report.nodeid
        self.spent[node] = self.spent.get(node, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)
        if report.failed:
            self.outcome[node] = "failed"
        elif report.when == "call" or report.skipped:
            self.outcome.setdefault(node, report.outcome)
        if report.when != "teardown":
            return
        budget = dict(report.user_properties).get(_KEY)
        line = {"test": node, "seconds": round(self.spent.pop(node), 3), "budget": budget,
                "outcome": self.outcome.pop(node, "skipped")}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(_ENV)
    if path and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes
        config.pluginmanager.register(_Recorder(path), "monarch-test-budgets")


def load(paths: list[str]) -> dict[str, dict[str, Any]]:
    """The longest measured run of each test in ``paths`` (files written as
    above): ``{node id: {"seconds": longest, "budget": s, "runs": n}}``."""
    out: dict[str, dict[str, Any]] = {}
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except json.JSONDecodeError:  # a run cut short mid-line
                    continue
                cur = out.setdefault(line["test"], {"seconds": 0.0, "budget": line.get("budget"), "runs": 0})
                cur["seconds"] = max(cur["seconds"], float(line["seconds"]))
                cur["runs"] += 1
                if line.get("budget") is not None:
                    cur["budget"] = line["budget"]
    return out
