"""``monarch dashboard``: print the URL of this user's running dashboards.

Registered through the ``monarch.cli`` entry-point group (``register`` adds
the subcommand to ``monarch``'s argument parser).  Light: argparse only.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``dashboard`` to ``monarch``'s subcommands."""
    p = subparsers.add_parser("dashboard", help="print the URLs of your running job dashboards (MONARCH_DASHBOARD=1)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from monarch_dashboard import _files

    found = _files.running()
    if not found:
        print("no dashboard runs for this user on this machine; start a job with MONARCH_DASHBOARD=1 "
              "(or `with monarch_dashboard.dashboard(): ...`)")
        return 1
    for info in found:
        age = time.time() - float(info.get("started", time.time()))
        argv = " ".join(info.get("argv") or [])
        print(f"{info['url']}  pid {info['pid']}, up {age:.0f} s  {argv}")
    port = found[0]["port"]
    print(f"(loopback only; from another machine: ssh -L {port}:127.0.0.1:{port} <this host>)")
    return 0
