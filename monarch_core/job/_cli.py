"""``monarch apply`` and ``monarch kill``: the job of this folder from the
command line (the reference's commands of the same names).

``monarch apply myjob.job`` imports ``job`` from ``myjob`` (the current
folder is on the path), remembers it as this folder's job (``.monarch/spec``),
applies it (or reattaches to the job saved in ``.monarch/job_state.pkl``) and
waits until its hosts answer; later programs' ``job.state()`` attach to it.
``monarch apply`` alone applies the remembered job again.  ``monarch kill``
kills the saved job and removes ``.monarch/job_state.pkl``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``apply`` and ``kill`` to the ``monarch`` command line."""
    p = sub.add_parser("apply", help="apply the job object MODULE.ATTR (e.g. myjob.job) and save its state in "
                                     ".monarch/job_state.pkl (docs/job.md)")
    p.add_argument("module_path", nargs="?", default=None,
                   help="dotted path of a job object (e.g. myjob.job); default: the one applied here last")
    p.set_defaults(func=apply)
    p = sub.add_parser("kill", help="kill the job saved in .monarch/job_state.pkl (docs/job.md)")
    p.set_defaults(func=kill)


def apply(args: argparse.Namespace) -> int:
    from monarch_core.job._trait import load_current_job, set_current_job

    try:
        if args.module_path is not None:
            set_current_job(args.module_path)
        job = load_current_job()
    except (ImportError, AttributeError, TypeError, ValueError, FileNotFoundError) as e:
        print(f"monarch apply: {e}", file=sys.stderr)
        return 2
    state = job.state()
    for name, hosts in sorted(state._hosts.items()):
        print(f"{name}: {len(hosts.hosts)} host(s)")
    print(f"Job is ready (apply id {job.apply_id})")
    return 0


def kill(args: argparse.Namespace) -> int:
    from monarch_core.job._trait import DEFAULT_JOB_PATH, job_load

    path = Path(DEFAULT_JOB_PATH)
    try:
        job = job_load(str(path))
    except FileNotFoundError:
        print(f"monarch kill: no job saved here ({path} does not exist)", file=sys.stderr)
        return 1
    job.kill()
    path.unlink(missing_ok=True)
    print("Killed job")
    return 0
