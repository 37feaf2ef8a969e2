#!/usr/bin/env bash
# Create N fake hosts as network namespaces (idempotent; needs root and iproute2).
#
#   root namespace : bridge rtbr0 with 10.250.0.1/24 (name "rtctl")
#   host I         : namespace rt-hI, eth0 = 10.250.0.(10+I)/24, lo up (name "hI")
#                    joined to the bridge by the veth pair rtvI <-> eth0
#
# The namespaces have no default route and ip_forward is not touched: they reach
# each other and the root namespace, nothing else.  A marked block in /etc/hosts
# (and in /etc/netns/rt-hI/hosts, which `ip netns exec` mounts over /etc/hosts)
# maps rtctl and every host hI that exists.  Running it again with the same N
# changes nothing; with a larger N it adds hosts, with a smaller one it keeps them.  Undo with netns-down.sh.
#
# Usage: netns-up.sh [N=3]     prints "rt-hI ADDRESS" per host on stdout
source "$(dirname "$0")/lib.sh"
N=${1:-3}
[[ $N =~ ^[1-9][0-9]*$ ]] && ((N <= 200)) || die "N must be a number from 1 to 200, got '$N'"
require_root

if ! ip link show "$RT_BR" >/dev/null 2>&1; then
    ip link add "$RT_BR" type bridge
fi
ip addr replace "$RT_NET.1/24" dev "$RT_BR"
ip link set "$RT_BR" up

for i in $(seq 1 "$N"); do
    ns=$(ns_name "$i"); addr=$(ns_addr "$i"); veth=$(veth_name "$i")
    ns_exists "$ns" || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
        ip link add "$veth" type veth peer name eth0 netns "$ns"
    elif ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
        # a leftover root-side veth whose peer is gone or elsewhere: recreate the pair
        ip link del "$veth"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$RT_BR"
    ip link set "$veth" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
done

# the names cover every testbed host that exists, not only the first N: a
# smaller N (another checkout's suite) must not unname hosts others still use
top=$N
for ns in $(testbed_namespaces); do i=${ns#rt-h}; ((i > top)) && top=$i; done
block=$(
    echo "$RT_HOSTS_BEGIN"
    echo "$RT_NET.1 rtctl"
    for i in $(seq 1 "$top"); do ns_exists "$(ns_name "$i")" && echo "$(ns_addr "$i") h$i"; done
    echo "$RT_HOSTS_END"
)
write_in_place /etc/hosts "$(strip_hosts_block /etc/hosts; echo "$block")"
for i in $(seq 1 "$top"); do
    ns_exists "$(ns_name "$i")" || continue
    ns=$(ns_name "$i")
    mkdir -p "/etc/netns/$ns"
    write_in_place "/etc/netns/$ns/hosts" "$(printf '127.0.0.1 localhost\n::1 localhost\n'; echo "$block")"
done

# every host has a route to the root namespace, and the bridge answers
for i in $(seq 1 "$N"); do
    ip -n "$(ns_name "$i")" route get "$RT_NET.1" >/dev/null || die "$(ns_name "$i") has no route to $RT_NET.1"
done
log "netns up: $N hosts on $RT_BR ($RT_NET.1/24)"
for i in $(seq 1 "$N"); do echo "$(ns_name "$i") $(ns_addr "$i")"; done
