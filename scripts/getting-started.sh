#!/usr/bin/env bash
# Install monarch-core and its transport plugin into .venv and run the
# getting-started example.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q . ./plugins/transport_tcp
exec "$VENV/bin/python" examples/getting_started.py
