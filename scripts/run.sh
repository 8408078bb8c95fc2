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
# - Builds the release binary and runs it with --config policy/default.yaml --upstream $UPSTREAM
#   plus the extra arguments. Pass the upstream through UPSTREAM, not --upstream.
#
# Environment: UPSTREAM=host:port of Redis (default 127.0.0.1:6379),
#              CONFIG=path of the config file (default policy/default.yaml).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

UPSTREAM="${UPSTREAM:-127.0.0.1:6379}"
CONFIG="${CONFIG:-policy/default.yaml}"
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
if ! command -v cargo >/dev/null 2>&1; then
    log "cargo not found: install the Rust toolchain (https://rustup.rs) and retry"
    exit 1
fi
cargo build --release
bin="${CARGO_TARGET_DIR:-target}/release/redis-policy-proxy"

# --- Run ----------------------------------------------------------------------------------------
# The port clients should use: from --listen in the extra args, else the config file's default.
listen_port=6380
prev=""
for arg in "$@"; do
    case "$arg" in
        --listen=*) listen_port="${arg##*:}" ;;
        *) if [[ "$prev" == "--listen" ]]; then listen_port="${arg##*:}"; fi ;;
    esac
    prev="$arg"
done

echo "redis-policy-proxy -> Redis at $UPSTREAM; try: redis-cli -p $listen_port"

if [[ -z "$redis_pid" ]]; then
    # Nothing to clean up afterwards: become the proxy, so signals reach it directly.
    trap - EXIT
    exec "$bin" --config "$CONFIG" --upstream "$UPSTREAM" "$@"
fi

# We own the Redis: run the proxy as a child, forward SIGINT/SIGTERM to it (SIGTERM drains
# gracefully), then stop Redis in the EXIT trap.
"$bin" --config "$CONFIG" --upstream "$UPSTREAM" "$@" &
proxy_pid=$!
trap 'kill -TERM "$proxy_pid" 2>/dev/null || true' HUP INT TERM
status=0
while kill -0 "$proxy_pid" 2>/dev/null; do
    # `wait` returns early (status > 128) when a trapped signal arrives; loop until it exits.
    if wait "$proxy_pid"; then status=0; else status=$?; fi
done
proxy_pid=""
exit "$status"
