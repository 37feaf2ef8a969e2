#!/usr/bin/env bash
# Install every system package the test suite's testbed needs (root, Debian 12):
# iproute2 + util-linux (network-namespace hosts), OpenSSH server and client,
# Slurm 22.05 with munge; Chromium (the dashboard's browser tests, through
# Playwright).  Installs only what is missing; idempotent.
# Usage: install.sh
source "$(dirname "$0")/lib.sh"
apt_install iproute2 util-linux openssh-server openssh-client
"$(dirname "$0")/slurm-install.sh"
# Chromium for plugins/dashboard/tests (Playwright drives /usr/bin/chromium)
apt_install chromium
log "testbed packages installed in $(elapsed) s"
