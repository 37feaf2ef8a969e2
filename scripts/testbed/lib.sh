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

# ---------------------------------------------------------------- services
# (sshd, munged, slurmctld, slurmd started by ssh-up.sh / slurm-up.sh)
#
#   RT_RUN  state dir for pid files, logs and generated configs (default /tmp/rt)
#
# Every service runs in the background under setsid with its own foreground
# flag (-D/-F); its PID and process start time are saved under $RT_RUN/pids, and
# the *-down.sh scripts stop exactly that process (PID + start time guards
# against PID reuse; sshd rewrites its title, so the command line is no guide).
RT_RUN=${RT_RUN:-/tmp/rt}
mkdir -p "$RT_RUN/pids" "$RT_RUN/logs"
T0=$EPOCHREALTIME
elapsed() { awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.2f", b-a}'; }

# proc_start PID: the process start time (field 22 of /proc/PID/stat); fails
# for a process that is gone or a zombie (PID 1 here reaps orphans lazily)
proc_start() {
    local st
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    # shellcheck disable=SC2086
    set -- $st
    [[ $1 != Z && $1 != X ]] || return 1
    echo "${20}"
}

# pid_alive NAME: is $RT_RUN/pids/NAME.pid the live process we started?
pid_alive() {
    local f="$RT_RUN/pids/$1.pid" pid st
    [[ -s $f ]] || return 1
    pid=$(<"$f")
    st=$(proc_start "$pid") || return 1
    [[ ! -s "$f.start" || "$st" == "$(<"$f.start")" ]]
}

# start_bg NAME CMD...: run CMD (which stays in the foreground; exec-ing
# wrappers such as nsenter/unshare/setpriv are fine) in the background and
# save its PID and start time.  A no-op when NAME already runs.
start_bg() {
    local name=$1; shift
    if pid_alive "$name"; then log "$name already running (pid $(<"$RT_RUN/pids/$name.pid"))"; return 0; fi
    setsid "$@" >>"$RT_RUN/logs/$name.out" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$RT_RUN/pids/$name.pid"
    proc_start "$pid" >"$RT_RUN/pids/$name.pid.start" || die "$name exited at once; see $RT_RUN/logs/$name.out"
    log "started $name pid $pid"
}

# stop_pid NAME...: SIGTERM the saved processes (all at once), wait up to 10 s, then SIGKILL
stop_pid() {
    local name pid live=() names=()
    for name in "$@"; do
        if pid_alive "$name"; then
            pid=$(<"$RT_RUN/pids/$name.pid"); kill -TERM "$pid" 2>/dev/null || true
            live+=("$pid"); names+=("$name")
        fi
        rm -f "$RT_RUN/pids/$name.pid" "$RT_RUN/pids/$name.pid.start"
    done
    ((${#live[@]})) || return 0
    local any
    for _ in $(seq 1 100); do
        any=0
        for pid in "${live[@]}"; do proc_start "$pid" >/dev/null && any=1; done
        ((any)) || break
        sleep 0.1
    done
    for pid in "${live[@]}"; do
        if proc_start "$pid" >/dev/null; then log "pid $pid ignored TERM for 10 s: KILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    done
    log "stopped ${names[*]} (pids ${live[*]})"
}

# wait_tcp HOST PORT [TIMEOUT_S] [NETNS]: until something accepts on HOST:PORT
wait_tcp() {
    local host=$1 port=$2 t=${3:-20} ns=${4:-}
    local pre=()
    [[ -n $ns ]] && pre=(nsenter "--net=/run/netns/$ns")
    for _ in $(seq 1 $((t * 10))); do
        if "${pre[@]}" timeout 1 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    die "timeout waiting for $host:$port${ns:+ in $ns}"
}

# apt_install PKG...: install the missing ones (apt-get update first if needed)
apt_install() {
    local missing=() p
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    [[ $(id -u) == 0 ]] || die "missing packages ${missing[*]}; install them as root (apt-get install -y ${missing[*]})"
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$RT_RUN/logs/apt.log" 2>&1; then
        timeout 600 apt-get update -qq >>"$RT_RUN/logs/apt.log" 2>&1
        timeout 600 apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$RT_RUN/logs/apt.log" 2>&1 \
            || die "apt-get install ${missing[*]} failed; see $RT_RUN/logs/apt.log"
    fi
}
