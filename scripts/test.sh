#!/usr/bin/env bash
# Install everything the test suite needs into .venv and run the whole suite.
# Usage: bash scripts/test.sh [pytest args...]
# Works on a fresh Debian 12 machine with Python >= 3.10 (run as root for the
# system packages later suites need).
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages of the multi-host testbed (tests/_helpers/testbed.py):
# iproute2 for the network-namespace hosts, OpenSSH server, Slurm + munge.
# The suites that need them start the services themselves and skip, saying
# why, without root.
if [ "$(id -u)" = 0 ]; then
  bash scripts/testbed/install.sh
fi
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e ".[test]" -e plugins/transport_tcp -e plugins/telemetry_otel
"$VENV/bin/python" -m pip install -q -e plugins/scheduler_slurm
"$VENV/bin/python" -m pip install -q -e plugins/scheduler_ssh
"$VENV/bin/python" -m pip install -q -e plugins/transport_rdma
"$VENV/bin/python" -m pip install -q -e plugins/debugger
# torchrun's launcher (monarch_core.spmd, `monarch torchrun`); torch is not its
# dependency (the scripts it runs need it, installed below)
"$VENV/bin/python" -m pip install -q -e plugins/spmd
# `import monarch` for the reference's programs (docs/compat.md); never beside torchmonarch
"$VENV/bin/python" -m pip install -q -e plugins/monarch_compat
# the dashboard and its browser tests (Playwright drives the system Chromium of
# scripts/testbed/install.sh; never `playwright install`)
"$VENV/bin/python" -m pip install -q -e "plugins/dashboard[test]"
# pyverbs for the ibverbs backend's discovery tests comes from the system (Debian:
# python3-pyverbs; not installable from the package index): link it in when present.
# numpy is an optional test dependency (buffers over numpy arrays).
if [ "$(id -u)" = 0 ] && [ ! -d /usr/lib/python3/dist-packages/pyverbs ]; then
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends python3-pyverbs >/dev/null \
    || echo "warning: python3-pyverbs could not be installed; the pyverbs discovery test takes its not-installed path" >&2
fi
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ -d /usr/lib/python3/dist-packages/pyverbs ] && [ ! -e "$SITE/pyverbs" ]; then
  ln -s /usr/lib/python3/dist-packages/pyverbs "$SITE/pyverbs"
fi
"$VENV/bin/python" -m pip install -q numpy || echo "warning: numpy could not be installed; numpy buffer tests will be skipped" >&2
# torch (CPU build, pinned: an unpinned torch pulls a multi-GB CUDA build) for
# the tensor payload tests; they skip, loudly, where it cannot be installed.
"$VENV/bin/python" -m pip install -q torch==2.13.0 \
  || echo "warning: torch==2.13.0 could not be installed; tensor tests will be skipped" >&2
# the distributed tensor engine needs that torch (its tests skip without it)
"$VENV/bin/python" -m pip install -q -e plugins/tensor_engine \
  || echo "warning: monarch-tensor-engine could not be installed (torch missing?); its tests will be skipped" >&2
# The whole suite in parallel: it mostly waits on processes, hosts and
# timeouts (on 2 cores, -n 2 kept them a third busy), so 4 workers.  Testbed
# tests are in two xdist groups (conftest.py: the Slurm half on h5..h7, the
# rest on h1..h4) that run side by side, each one test at a time;
# MONARCH_TEST_WORKERS=0 runs everything in this process.
WORKERS="${MONARCH_TEST_WORKERS:-4}"
# Each test's duration and time budget are recorded (tests/_helpers/budgets.py),
# and the tests that used more than half their budget are named at the end.
export MONARCH_TEST_DURATIONS="${MONARCH_TEST_DURATIONS:-$PWD/.test-durations.jsonl}"
: > "$MONARCH_TEST_DURATIONS"
rc=0
if [ "$WORKERS" = 0 ]; then
  "$VENV/bin/python" -m pytest "$@" || rc=$?
else
  "$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadgroup "$@" || rc=$?
fi
"$VENV/bin/python" scripts/test_budgets.py "$MONARCH_TEST_DURATIONS" || true
exit "$rc"
