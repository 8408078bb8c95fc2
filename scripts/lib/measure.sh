# Helpers of the measuring scripts (scripts/bench.sh, scripts/scaling.sh), sourced after the
# caller sets `log_prefix` (the prefix of its log lines).

log() { echo "$log_prefix: $*" >&2; }
die() {
    log "$*"
    exit 1
}

used_ports=" "
port=""
# Sets $port to a loopback port nobody listens on now and that this script has not handed out.
pick_port() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 40000))
        [[ "$used_ports" == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            used_ports+="$p "
            port="$p"
            return 0
        fi
    done
    die "no free port found"
}

# wait_ready PORT PID: polls PING under a 10 s deadline; fails early if PID died.
wait_ready() {
    local port="$1" pid="$2"
    for _ in $(seq 1 100); do
        if [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" == "PONG" ]]; then
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# CPU ticks (utime + stime, all threads) of PID; fields counted after the ")" closing comm.
cpu_ticks() {
    local rest
    rest="$(cat "/proc/$1/stat")"
    rest="${rest##*) }"
    # shellcheck disable=SC2086  # split the fields on purpose
    set -- $rest
    # After comm: 1=state ... 12=utime 13=stime (fields 14 and 15 of stat).
    echo $((${12} + ${13}))
}
