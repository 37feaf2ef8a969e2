#!/usr/bin/env python3
"""Which tests come close to their time budget, from measured runs.

Usage: ``python scripts/test_budgets.py FILE... [--share 0.5] [--check]``

Each FILE is a run's record (``MONARCH_TEST_DURATIONS``, written by
``tests/_helpers/budgets.py``; ``scripts/test.sh`` writes
``.test-durations.jsonl``).  Prints the tests whose longest run used more than
``--share`` of their budget (pytest-timeout's limit), and the slowest tests;
with ``--check``, exits 1 when there is any such test.  The rule it checks
(tests/README.md, "Time budgets"): a budget is at least twice the longest run
measured on a 2-core machine with two CPU-bound processes beside the suite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _helpers.budgets import load  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="run records (JSON lines)")
    ap.add_argument("--share", type=float, default=0.5, help="flag tests whose longest run used more than this share of their budget")
    ap.add_argument("--slowest", type=int, default=10, help="also list this many slowest tests")
    ap.add_argument("--check", action="store_true", help="exit 1 when a test is flagged")
    a = ap.parse_args(argv)
    missing = [f for f in a.files if not Path(f).is_file()]
    if missing:
        print(f"test_budgets: no such record: {', '.join(missing)} (set MONARCH_TEST_DURATIONS when running the suite)",
              file=sys.stderr)
        return 2
    tests = load(a.files)
    runs = max((t["runs"] for t in tests.values()), default=0)
    tight = sorted(((t["seconds"] / t["budget"], name, t) for name, t in tests.items() if t["budget"]),
                   reverse=True)
    flagged = [x for x in tight if x[0] > a.share]
    print(f"{len(tests)} tests, up to {runs} run(s) each; budget rule: longest run <= {a.share:.0%} of the budget")
    if flagged:
        print(f"{len(flagged)} test(s) used more than {a.share:.0%} of their budget (raise the budget, or make the test cheaper):")
        for share, name, t in flagged:
            print(f"  {share:5.0%}  {t['seconds']:7.1f} s of {t['budget']:g} s  {name}")
    else:
        print(f"every test's longest run stayed within {a.share:.0%} of its budget"
              + (f" (the closest: {tight[0][0]:.0%}, {tight[0][1]})" if tight else ""))
    slow = sorted(tests.items(), key=lambda kv: kv[1]["seconds"], reverse=True)[: a.slowest]
    if slow:
        print(f"slowest {len(slow)}:")
        for name, t in slow:
            budget = f"{t['budget']:g} s" if t["budget"] else "none"
            print(f"  {t['seconds']:7.1f} s (budget {budget})  {name}")
    return 1 if a.check and flagged else 0


if __name__ == "__main__":
    sys.exit(main())
