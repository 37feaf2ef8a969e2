#!/usr/bin/env bash
# Cut a testbed host off the network, or reconnect it (needs root).
#
#   netns-link.sh I down    the root-side veth rtvI goes down: packets to and
#                           from hI are dropped (no RST), so connects time out
#                           and open connections stall
#   netns-link.sh I up      reconnect
#   netns-link.sh I status  print "up" or "down"
source "$(dirname "$0")/lib.sh"
[[ $# == 2 ]] || die "usage: $0 I down|up|status"
i=$1
[[ $i =~ ^[1-9][0-9]*$ ]] || die "host number must be a positive integer, got '$i'"
require_root
dev=$(veth_name "$i")
ip link show "$dev" >/dev/null 2>&1 || die "no link $dev: is host h$i up (netns-up.sh)?"
case $2 in
    down) ip link set "$dev" down ;;
    up) ip link set "$dev" up ;;
    status) ip -o link show "$dev" | grep -q '[<,]UP[,>]' && echo up || echo down ;;
    *) die "usage: $0 I down|up|status" ;;
esac
