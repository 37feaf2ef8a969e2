"""What an open dashboard costs: ``call_one`` latency and pipelined throughput with
the dashboard closed, and with it serving a live page (not asserted; the target is
within 3 %).

    python bench/dashboard_overhead.py                 # 5 alternating rounds of the two modes
    python bench/dashboard_overhead.py --rounds 3 --calls 20000 --burst 10000 --out d.json

Each measurement runs in a fresh child interpreter (one proc, one actor, ``ipc``), as in
``telemetry_overhead.py`` (same figures: p50 / p99 of sequential ``call_one().get()``, the
median rate of three pipelined bursts, CPU per pipelined call of client + proc).

Modes:

  closed  the default: endpoint metrics on, no dashboard
  open    ``monarch_dashboard.start()`` in the client, and another process following the
          Endpoints page's live stream (``/events?page=endpoints``, with the token's cookie),
          as an open browser tab does: each telemetry interval the client re-renders the page
          and sends it

Rounds alternate the modes; the table holds the medians and each mode's ratio to
``closed`` (``paired``: the median of the per-round ratios).  Needs monarch-dashboard
(``pip install ./plugins/dashboard`` or ``PYTHONPATH=plugins/dashboard``).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

import telemetry_overhead as _overhead  # the same child and rounds, beside this file

READER = textwrap.dedent(
    """
    import http.client, sys
    port, token = int(sys.argv[1]), sys.argv[2]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", f"/events?page=endpoints&token={token}", headers={"Host": f"127.0.0.1:{port}"})
    r = conn.getresponse()
    assert r.status == 200, r.status
    while r.read1(65536):
        pass
    """
)

# in the measuring child (telemetry_overhead.CHILD): argv[4] is the mode, argv[5] the reader's code
SETUP = textwrap.dedent(
    """
    reader = None
    if sys.argv[4] == "open":  # the dashboard, and a page of it open and following its live stream
        import subprocess
        from monarch_dashboard import start
        d = start(port=0)
        reader = subprocess.Popen([sys.executable, "-c", sys.argv[5], str(d.port), d.token], stdout=subprocess.DEVNULL)
    """
).strip()
TEARDOWN = textwrap.dedent(
    """
    if reader is not None:
        reader.kill()
        reader.wait()
    """
).strip()
CHILD = _overhead.child(SETUP, TEARDOWN)


def run(mode: str, args: argparse.Namespace, tmp: str) -> dict:
    """One measurement of ``mode`` (``closed`` or ``open``) in a fresh child."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    env["XDG_RUNTIME_DIR"] = tmp
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(here, "..", "plugins", "dashboard"), env.get("PYTHONPATH", "")])
    return _overhead.run(mode, args, env, CHILD, [mode, READER])


def main() -> int:
    return _overhead.rounds(__doc__.split("\n\n")[0], "closed,open", "closed", run)


if __name__ == "__main__":
    sys.exit(main())
