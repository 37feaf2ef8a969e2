# shellcheck shell=bash
# Helpers shared by the testbed scripts (source it, do not run it).
#
#   RT_NET  first three octets of the private test /24 (default 10.250.0):
#           the root namespace is $RT_NET.1 on bridge $RT_BR, host I is $RT_NET.(10+I)
#   RT_BR   bridge name in the root namespace (default rtbr0)
#
# Host I is the network namespace rt-hI; its end of the veth pair is eth0, the
# root-namespace end is rtvI (a port of the bridge).
set -euo pipefail

RT_NET=${RT_NET:-10.250.0}
RT_BR=${RT_BR:-rtbr0}
RT_HOSTS_BEGIN="# BEGIN monarch-testbed hosts"
RT_HOSTS_END="# END monarch-testbed hosts"

log() { printf '[testbed %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

ns_name() { echo "rt-h$1"; }
ns_addr() { echo "$RT_NET.$((10 + $1))"; }
veth_name() { echo "rtv$1"; }

require_root() {
    [[ $(id -u) == 0 ]] || die "must run as root (network namespaces, /etc/hosts)"
    command -v ip >/dev/null || die "'ip' (iproute2) is not installed: apt-get install -y iproute2"
}

# ns_exists NAME: is there a named network namespace NAME?
ns_exists() { [[ -e "/run/netns/$1" ]]; }

# existing testbed namespaces (rt-h<digits>), one per line
testbed_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^rt-h[0-9]+$' || true; }

# strip_hosts_block FILE: FILE's content without our marked block
strip_hosts_block() { sed "/^$RT_HOSTS_BEGIN\$/,/^$RT_HOSTS_END\$/d" "$1"; }

# write_in_place FILE CONTENT: rewrite FILE only if it changes; in place,
# because /etc/hosts may be a bind mount that cannot be replaced by rename.
write_in_place() {
    local file=$1 content=$2
    [[ -e $file && "$content" == "$(cat "$file")" ]] && return 0
    printf '%s\n' "$content" >"$file"
}
