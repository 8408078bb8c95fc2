#!/usr/bin/env bash
# Runs redis-policy-proxy in front of a local Redis with policy/default.yaml.
#
#   scripts/run.sh [EXTRA PROXY ARGS...]      e.g. scripts/run.sh --listen 127.0.0.1:7000
#
# - Installs redis-server and redis-tools with apt-get when redis-server is missing (sudo only
#   when not root).
# - Uses the Redis answering PING on $UPSTREAM (default 127.0.0.1:6379); when none answers and
#   the address is local, starts a throwaway redis-server there (no persistence) and stops it
#   when this script exits.
# - Builds the binary (Cargo profile $PROFILE, default `quick`: about a minute and a half from
#   scratch on 2 cores, against three or more for `release`, for 3-17% more CPU per request;
#   docs/performance.md, "Build profiles") only when it is missing or older than the sources,
#   then runs it with --config $CONFIG --upstream $UPSTREAM plus the extra arguments. Pass the upstream
#   through UPSTREAM, not --upstream.
# - Refuses to start when the listen address already answers (another proxy, a Redis): the
#   hints would point at whatever holds the port. Prints the proxy's pid and how to connect,
#   reload, stop and read its logs once the proxy answers PING there. SIGHUP sent to this
#   script reaches the proxy (a reload), as does SIGHUP sent to the proxy itself; SIGINT and
#   SIGTERM stop it (SIGTERM drains) and then the Redis this script started.
#
# Environment: UPSTREAM=host:port of Redis (default 127.0.0.1:6379),
#              CONFIG=path of the config file (default policy/default.yaml),
#              LOG=file to append the proxy's log to (default: this terminal's stderr),
#              PROFILE=the Cargo profile to build (default quick; release for the build
#                      deployments and the benchmarks use),
#              RPP_BIN=a proxy binary to run instead of building one (e.g. a debug build),
#              RPP_LISTEN, RPP_ADMIN… are read by the proxy itself (redis-policy-proxy --help).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

UPSTREAM="${UPSTREAM:-127.0.0.1:6379}"
CONFIG="${CONFIG:-policy/default.yaml}"
LOG="${LOG:-}"
upstream_host="${UPSTREAM%:*}"
upstream_port="${UPSTREAM##*:}"
if [[ -z "$upstream_host" || ! "$upstream_port" =~ ^[0-9]+$ || "$upstream_host" == "$UPSTREAM" ]]; then
    echo "run.sh: UPSTREAM must be host:port, got '$UPSTREAM'" >&2
    exit 2
fi
# Bracketed IPv6 ([::1]:6379) for the proxy, bare for redis-cli -h.
upstream_host="${upstream_host#[}"
upstream_host="${upstream_host%]}"

log() { echo "run.sh: $*" >&2; }

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        exit 1
    fi
}

# --- Redis binaries -----------------------------------------------------------------------------
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    log "installing redis-server and redis-tools with apt-get"
    as_root apt-get update
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server redis-tools
fi

redis_ping() {
    [[ "$(redis-cli -h "$upstream_host" -p "$upstream_port" ping 2>/dev/null)" == "PONG" ]]
}

# --- Upstream Redis -----------------------------------------------------------------------------
redis_pid=""
redis_dir=""
proxy_pid=""

# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
    local status=$?
    if [[ -n "$proxy_pid" ]] && kill -0 "$proxy_pid" 2>/dev/null; then
        kill -TERM "$proxy_pid" 2>/dev/null || true
        wait "$proxy_pid" 2>/dev/null || true
    fi
    if [[ -n "$redis_pid" ]]; then
        log "stopping the redis-server this script started (pid $redis_pid)"
        kill -TERM "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
    fi
    if [[ -n "$redis_dir" ]]; then
        rm -rf "$redis_dir"
    fi
    exit "$status"
}
trap cleanup EXIT

if redis_ping; then
    log "using the Redis already answering on $UPSTREAM"
else
    case "$upstream_host" in
        127.0.0.1 | localhost | ::1) ;;
        *)
            log "no Redis answers PING on $UPSTREAM and it is not local; start it or set UPSTREAM"
            exit 1
            ;;
    esac
    redis_dir="$(mktemp -d -t rpp-run-redis.XXXXXX)"
    log "no Redis on $UPSTREAM: starting redis-server (log: $redis_dir/redis.log)"
    bind_addr="$upstream_host"
    if [[ "$bind_addr" == localhost ]]; then bind_addr=127.0.0.1; fi
    redis-server --port "$upstream_port" --bind "$bind_addr" \
        --save "" --appendonly no --dir "$redis_dir" --logfile "$redis_dir/redis.log" \
        --daemonize no &
    redis_pid=$!
    # Readiness: poll PING under a deadline (10 s), failing early if the server died.
    ready=0
    for _ in $(seq 1 100); do
        if redis_ping; then
            ready=1
            break
        fi
        if ! kill -0 "$redis_pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    if [[ "$ready" -ne 1 ]]; then
        log "redis-server did not become ready on $UPSTREAM; its log:"
        cat "$redis_dir/redis.log" >&2 || true
        exit 1
    fi
fi

# --- Build --------------------------------------------------------------------------------------
# Even an up-to-date `cargo build` checks every dependency; so build only when the binary is
# missing or a source is newer than it.
PROFILE="${PROFILE:-quick}"
if [[ -n "${RPP_BIN:-}" ]]; then
    bin="$RPP_BIN"
    log "using RPP_BIN=$bin (not building)"
else
    # Cargo puts the dev profile's output in debug/, every other profile's under its name.
    profile_dir="$PROFILE"
    [[ "$PROFILE" == dev ]] && profile_dir=debug
    bin="${CARGO_TARGET_DIR:-target}/$profile_dir/redis-policy-proxy"
    why=""
    if [[ ! -x "$bin" ]]; then
        why="no $PROFILE binary yet"
    elif [[ -n "$(find src lua build.rs Cargo.toml Cargo.lock -newer "$bin" -print -quit 2>/dev/null)" ]]; then
        why="sources changed since $bin was built"
    fi
    if [[ -n "$why" ]]; then
        if ! command -v cargo >/dev/null 2>&1; then
            log "cargo not found: install the Rust toolchain (https://rustup.rs) and retry"
            exit 1
        fi
        log "building the $PROFILE binary ($why); the first build takes a minute or more"
        cargo build --profile "$PROFILE" --bin redis-policy-proxy
    else
        log "$PROFILE binary up to date: $bin"
    fi
fi

# --- Run ----------------------------------------------------------------------------------------
# The ports to print: from --listen/--admin in the extra args, else RPP_LISTEN/RPP_ADMIN, else
# the defaults (the proxy's own startup line shows the addresses it actually bound).
listen_addr="${RPP_LISTEN:-127.0.0.1:6380}"
admin_addr="${RPP_ADMIN:-127.0.0.1:8379}"
prev=""
for arg in "$@"; do
    case "$arg" in
        --listen=*) listen_addr="${arg#--listen=}" ;;
        --admin=*) admin_addr="${arg#--admin=}" ;;
        *)
            if [[ "$prev" == "--listen" ]]; then listen_addr="$arg"; fi
            if [[ "$prev" == "--admin" ]]; then admin_addr="$arg"; fi
            ;;
    esac
    prev="$arg"
done

# Where clients reach the proxy from this host: a wildcard address is reached on loopback.
listen_host="${listen_addr%:*}"
listen_port="${listen_addr##*:}"
listen_host="${listen_host#[}"
listen_host="${listen_host%]}"
case "$listen_host" in
    0.0.0.0 | "") listen_host=127.0.0.1 ;;
    ::) listen_host=::1 ;;
esac

# Something already accepts connections on the address: the proxy could not bind it, and a
# `redis-cli -p` hint would talk to that instead.
port_taken() {
    timeout 2 bash -c ": <>/dev/tcp/$listen_host/$listen_port" 2>/dev/null
}
if port_taken; then
    log "$listen_addr is already in use by another process (not this proxy): \
redis-cli -p $listen_port would talk to that. Stop it, or pick a free port: scripts/run.sh --listen 127.0.0.1:PORT"
    if command -v ss >/dev/null 2>&1; then
        ss -ltnpH "sport = :$listen_port" >&2 2>/dev/null || true
    fi
    exit 1
fi

# Whether the proxy answers PING on the listen address (NOAUTH counts: it serves, and wants
# an AUTH first).
proxy_answers() {
    local reply
    reply="$(timeout 2 redis-cli -h "$listen_host" -p "$listen_port" ping 2>/dev/null)" || true
    [[ "$reply" == PONG || "$reply" == NOAUTH* ]]
}

# Polls PING under a deadline (30 s) while the proxy `$1` runs: 0 once it answers, 1 if it
# exited first (its own log says why), 2 when the deadline passed.
wait_serving() {
    local pid=$1
    for _ in $(seq 1 300); do
        if proxy_answers; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        sleep 0.1
    done
    return 2
}

# Where the proxy logs: this terminal's stderr, or the LOG file.
if [[ -n "$LOG" ]]; then
    logs="$LOG (tail -f $LOG)"
    exec 3>>"$LOG"
else
    logs="this terminal (stderr); LOG=FILE scripts/run.sh to write them to a file"
    exec 3>&2
fi

# How to drive the proxy, printed once its pid is known; the second argument is this script's
# pid when the proxy runs as its child (a HUP to the script is forwarded).
usage() {
    local pid=$1 script_pid=${2:-}
    log "redis-policy-proxy pid $pid: clients on $listen_addr -> Redis at $UPSTREAM, policy $CONFIG"
    log "  try:     redis-cli -p ${listen_addr##*:}"
    if [[ -n "$script_pid" && "$hup_forwarded" == 1 ]]; then
        log "  reload:  kill -HUP $pid   (or kill -HUP $script_pid, this script, which forwards it; or edit $CONFIG: the file is watched)"
    elif [[ -n "$script_pid" ]]; then
        log "  reload:  kill -HUP $pid   (this script started with SIGHUP ignored, e.g. under nohup, so it cannot forward one; or edit $CONFIG: the file is watched)"
    else
        log "  reload:  kill -HUP $pid   (or edit $CONFIG: the file is watched)"
    fi
    log "  stop:    Ctrl-C, or kill $pid (SIGTERM drains clients first)"
    log "  logs:    $logs"
    if [[ "$admin_addr" != off ]]; then
        log "  metrics: curl -s http://$admin_addr/metrics   (health: /healthz, /readyz)"
    else
        log "  metrics: off (--admin off)"
    fi
}

# The hints once the proxy `$1` answers (`$2`: this script's pid when the proxy is its child),
# or why there are none.
usage_when_serving() {
    local rc=0
    wait_serving "$1" || rc=$?
    case "$rc" in
        0) usage "$@" ;;
        1) log "redis-policy-proxy exited before answering on $listen_addr; its log: $logs" ;;
        *) log "redis-policy-proxy (pid $1) does not answer PING on $listen_addr after 30 s; its log: $logs" ;;
    esac
}

if [[ -z "$redis_pid" ]]; then
    # Nothing to clean up afterwards: become the proxy (same pid), so signals reach it directly.
    # The hints come from a watcher once the proxy answers; started from a subshell that
    # exits at once, so the proxy is not left with a child it never reaps.
    trap - EXIT
    (usage_when_serving $$ 3>&- &)
    exec "$bin" --config "$CONFIG" --upstream "$UPSTREAM" "$@" 2>&3 3>&-
fi

# We own the Redis: run the proxy as a child, forward SIGHUP to it (reload), forward SIGINT and
# SIGTERM (SIGTERM drains gracefully), then stop Redis in the EXIT trap. The traps are set
# before the proxy starts, so a signal that arrives as soon as it serves is never missed.
# A signal ignored when bash started (nohup ignores SIGHUP) cannot be trapped: then the HUP
# hint names the proxy's pid only (SigIgn bit 0 is SIGHUP).
hup_forwarded=1
sig_ignored="$(awk '/^SigIgn:/ { print $2 }' "/proc/$$/status" 2>/dev/null || true)"
if [[ -n "$sig_ignored" ]] && (((16#$sig_ignored & 1) != 0)); then
    hup_forwarded=0
fi
interrupted=0
trap 'interrupted=1; if [[ -n "$proxy_pid" ]]; then kill -HUP "$proxy_pid" 2>/dev/null || true; fi' HUP
trap 'interrupted=1; if [[ -n "$proxy_pid" ]]; then kill -TERM "$proxy_pid" 2>/dev/null || true; else exit 143; fi' INT TERM
"$bin" --config "$CONFIG" --upstream "$UPSTREAM" "$@" 2>&3 3>&- &
proxy_pid=$!
usage_when_serving "$proxy_pid" $$
status=0
while :; do
    # `wait` also returns (status > 128) when a trapped signal arrives; then wait again, for
    # the proxy's own exit status (bash keeps it even if the proxy is already gone).
    interrupted=0
    if wait "$proxy_pid"; then rc=0; else rc=$?; fi
    # 127: the previous wait already collected the exit (a signal came just before this one).
    if [[ "$rc" -ne 127 ]]; then status=$rc; fi
    if [[ "$interrupted" -eq 0 || "$rc" -eq 127 ]]; then break; fi
done
proxy_pid=""
exit "$status"
