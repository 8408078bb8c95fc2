#!/usr/bin/env bash
# Instructions per request of the proxy's release build, counted by callgrind: the steady
# measure where timings on a shared 2-core machine are too noisy to rank small changes
# (docs/performance.md, "How to measure").
#
#   scripts/callgrind.sh [BINARY...]
#
# For each BINARY (default: target/release/redis-policy-proxy, built if missing), runs the
# proxy under `valgrind --tool=callgrind` and a fixed redis-benchmark load through it, once per
# workload, and prints total user-space instructions of the whole proxy process ÷ requests.
# The same servers serve every binary, so two builds (e.g. a baseline worktree's and this
# one's) compare directly.
#
# Workloads (WORKLOADS, default all):
#   getP1     GET, -P 1 -c 50 -r 100000, 20,000 requests (the start, ~450 instructions per
#             request at this length, is included)
#   P16       SET+GET, -P 16, 100,000 of each
#   mixed     SET, GET, INCR, LPUSH, RPOP, HSET, 1 KB values, -P 1, 20,000 of each
#   cP1, cP16 SET+GET through the proxy in front of a 3-primary cluster, -P 1 (20,000 of each)
#             and -P 16 (100,000 of each)
# Standalone workloads use policy/passthrough.yaml; the cluster ones a config with only the
# upstream. OUT=dir keeps the callgrind files there (default: a temp dir, removed), for
# `callgrind_annotate --auto=no FILE`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

WORKLOADS="${WORKLOADS:-getP1 P16 mixed cP1 cP16}"
bins=("$@")
if [[ ${#bins[@]} -eq 0 ]]; then
    [[ -x target/release/redis-policy-proxy ]] || cargo build --release
    bins=(target/release/redis-policy-proxy)
fi
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }

work="$(mktemp -d)"
out="${OUT:-$work}"
mkdir -p "$out"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for PORT ARGS...: until redis-cli ARGS answers OK/PONG on PORT (bounded).
wait_for() {
    local port="$1"
    shift
    for _ in $(seq 1 300); do
        case "$(redis-cli -p "$port" "$@" 2>/dev/null)" in OK | PONG) return 0 ;; esac
        sleep 0.1
    done
    echo "callgrind.sh: nothing answered on $port" >&2
    exit 1
}

redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$work" --logfile "$work/redis.log" &
pids+=($!)
wait_for "$redis_port" ping

cluster_ports=()
if [[ " $WORKLOADS " == *" cP"* ]]; then
    for _ in 1 2 3; do
        p="$(free_port)"
        bus="$(free_port)"
        redis-server --port "$p" --cluster-enabled yes --cluster-port "$bus" \
            --cluster-config-file "$work/nodes-$p.conf" --bind 127.0.0.1 --save "" \
            --appendonly no --dir "$work" --logfile "$work/cluster-$p.log" &
        pids+=($!)
        cluster_ports+=("$p")
        wait_for "$p" ping
    done
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster_ports[@]}") \
        --cluster-yes >"$work/create.log" 2>&1
    for _ in $(seq 1 300); do
        redis-cli -p "${cluster_ports[0]}" cluster info | grep -q 'cluster_state:ok' && break
        sleep 0.1
    done
fi

# count BINARY NAME MODE P N TESTS [EXTRA]: prints NAME's instructions per request.
count() {
    local bin="$1" name="$2" mode="$3" p="$4" n="$5" tests="$6" extra="${7:-}"
    local port cfg file tag
    port="$(free_port)"
    cfg="$work/$name-$port.yaml"
    if [[ "$mode" == cluster ]]; then
        printf 'listen: 127.0.0.1:%s\nupstream:\n  mode: cluster\n  cluster:\n    seeds: [%s]\n' \
            "$port" "$(printf '127.0.0.1:%s, ' "${cluster_ports[@]}" | sed 's/, $//')" >"$cfg"
    else
        sed "s/^listen: .*/listen: 127.0.0.1:$port/; s/^  address: .*/  address: 127.0.0.1:$redis_port/" \
            policy/passthrough.yaml >"$cfg"
    fi
    tag="$(echo "$bin" | tr '/' '_')"
    file="$out/callgrind.$name.$tag.out"
    valgrind --tool=callgrind --callgrind-out-file="$file" "$bin" --config "$cfg" --admin off \
        2>"$work/valgrind-$port.log" &
    local vpid=$!
    wait_for "$port" set callgrind:ready 1
    # shellcheck disable=SC2086 # extra holds several arguments
    redis-benchmark -p "$port" -c 50 -P "$p" -n "$n" -r 100000 -t "$tests" $extra -q \
        >"$work/bench-$port.log" 2>&1
    kill -INT "$vpid"
    wait "$vpid" 2>/dev/null || true
    local total k
    total="$(callgrind_annotate "$file" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')"
    k="$(tr ',' '\n' <<<"$tests" | wc -l)"
    printf '%-6s %8d instructions per request  %s\n' "$name" "$((total / (k * n)))" "$bin"
}

for w in $WORKLOADS; do
    for bin in "${bins[@]}"; do
        case "$w" in
            getP1) count "$bin" getP1 standalone 1 20000 get ;;
            P16) count "$bin" P16 standalone 16 100000 set,get ;;
            mixed) count "$bin" mixed standalone 1 20000 set,get,incr,lpush,rpop,hset "-d 1024" ;;
            cP1) count "$bin" cP1 cluster 1 20000 set,get ;;
            cP16) count "$bin" cP16 cluster 16 100000 set,get ;;
            *) echo "callgrind.sh: unknown workload $w" >&2; exit 1 ;;
        esac
    done
done
