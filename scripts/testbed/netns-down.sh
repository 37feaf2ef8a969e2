#!/usr/bin/env bash
# Remove every testbed host made by netns-up.sh: namespaces rt-hI, veths rtvI,
# bridge rtbr0 and the /etc/hosts block.  Idempotent; needs root.
#
# Deleting a namespace does not end the processes inside it.  By default a
# namespace that still has processes is reported and removed anyway; with
# --kill those processes (they can only be ones the tests started there) are
# sent SIGKILL first, by PID.
#
# Usage: netns-down.sh [--kill]
source "$(dirname "$0")/lib.sh"
KILL=0
[[ ${1:-} == --kill ]] && KILL=1
require_root

for ns in $(testbed_namespaces); do
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)
    if [[ -n ${pids// /} ]]; then
        if ((KILL)); then
            log "$ns: killing leftover processes $pids"
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null || true
        else
            log "warning: $ns still has processes: $pids (use --kill)"
        fi
    fi
    ip netns del "$ns"
    rm -rf "/etc/netns/$ns"
done
for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^rtv[0-9]+$' || true); do
    ip link del "$l" 2>/dev/null || true
done
if ip link show "$RT_BR" >/dev/null 2>&1; then ip link del "$RT_BR"; fi
if grep -qxF "$RT_HOSTS_BEGIN" /etc/hosts; then
    write_in_place /etc/hosts "$(strip_hosts_block /etc/hosts)"
fi
log "netns down"
