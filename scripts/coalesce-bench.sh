#!/usr/bin/env bash
# Request coalescing, measured: redis-benchmark with 500 clients GETting one key through the
# release proxy, `upstream.coalesce_reads` off and on, alternating (ROUNDS pairs). Prints, per
# run, how many GETs reached Redis (INFO commandstats) for the client GETs, and
# redis-benchmark's throughput and latency summary. Results: policy/README.md, Stampede
# protection.
#
#   cargo build --release --bin redis-policy-proxy && scripts/coalesce-bench.sh
#
# Environment: ROUNDS=2, N=200000 (GETs per run), CLIENTS=500.
set -u
ROUNDS=${ROUNDS:-2}
N=${N:-200000}
CLIENTS=${CLIENTS:-500}
BIN="$(dirname "$0")/../target/release/redis-policy-proxy"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RPORT=$(free_port)
DIR=$(mktemp -d)
redis-server --port "$RPORT" --save "" --appendonly no --dir "$DIR" > "$DIR/redis.log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
until redis-cli -p "$RPORT" PING 2>/dev/null | grep -q PONG; do sleep 0.1; done
# Without -r, redis-benchmark's GET reads this one key.
redis-cli -p "$RPORT" SET key:__rand_int__ hello > /dev/null
for _ in $(seq "$ROUNDS"); do
  for mode in false true; do
    PPORT=$(free_port)
    printf 'upstream:\n  coalesce_reads: %s\n' "$mode" > "$DIR/p.yaml"
    "$BIN" --config "$DIR/p.yaml" --listen "127.0.0.1:$PPORT" --upstream "127.0.0.1:$RPORT" --admin off 2> "$DIR/proxy.log" &
    PROXY=$!
    until redis-cli -p "$PPORT" PING 2>/dev/null | grep -q PONG; do sleep 0.1; done
    redis-cli -p "$RPORT" CONFIG RESETSTAT > /dev/null
    OUT=$(redis-benchmark -p "$PPORT" -c "$CLIENTS" -n "$N" -t get 2>&1)
    CALLS=$(redis-cli -p "$RPORT" INFO commandstats | grep '^cmdstat_get:' | sed 's/^cmdstat_get:calls=\([0-9]*\),.*/\1/')
    RPS=$(echo "$OUT" | grep -m1 "requests per second" | tr -s ' ')
    LAT=$(echo "$OUT" | grep -A2 "latency summary" | tail -1 | tr -s ' ')
    echo "coalesce_reads=$mode: $CALLS GETs upstream for $N client GETs;$RPS; latency avg min p50 p95 p99 max (ms):$LAT"
    kill "$PROXY"; wait "$PROXY" 2>/dev/null
  done
done
