#!/usr/bin/env bash
# Install every system package the test suite's testbed needs (root, Debian 12):
# iproute2 + util-linux (network-namespace hosts), OpenSSH server and client,
# Slurm 22.05 with munge.  Installs only what is missing; idempotent.
# Usage: install.sh
source "$(dirname "$0")/lib.sh"
apt_install iproute2 util-linux openssh-server openssh-client
"$(dirname "$0")/slurm-install.sh"
log "testbed packages installed in $(elapsed) s"
