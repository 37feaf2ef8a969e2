#!/usr/bin/env bash
# Install Slurm 22.05 + munge from Debian bookworm (about 7-10 s on a warm apt cache).
# (libslurm-dev, needed only to build pyslurm, is left out: no pyslurm builds against 22.05.)
source "$(dirname "$0")/lib.sh"
apt_install slurm-wlm munge slurm-client util-linux iproute2
# munge's postinst normally creates the key; make sure it exists with the right owner/mode
if [[ ! -s /etc/munge/munge.key ]]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
log "slurm installed: $(slurmd -V) in $(elapsed) s"
