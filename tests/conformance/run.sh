#!/usr/bin/env bash
# tests/conformance/run.sh PROXY_BINARY [OUTDIR]
#
# Redis 7.0.15's own Tcl test suite through the proxy: a fresh redis-server and the proxy
# (policy/passthrough.yaml) on free loopback ports, the suite run against the proxy by
# redis-tcl-suite.sh, and its result compared with the same suite run directly against Redis
# (baseline/results.tsv: 1747 tests pass). Fails when a test that passes directly does not pass
# through the proxy, unless known-losses.txt lists it (each entry with its reason; the list
# and the reasons are in docs/conformance.md). Prints tests on the list that passed, so the
# list only shrinks.
#
# Needs tclsh and the suite's files (get-redis-tests.sh fetches Debian's redis 7.0.15 source
# package once; root for apt), redis-server, python3 (free ports). CONFORMANCE_UNITS limits the
# units (default: all 33; "core", "server" or a list, as redis-tcl-suite.sh takes them).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
proxy_bin=${1:?usage: run.sh PROXY_BINARY [OUTDIR]}
out=${2:-$root/target/conformance}

src=$("$here/get-redis-tests.sh" | tail -1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rport=$(free_port)
pport=$(free_port)
work=$(mktemp -d)
cleanup() {
    kill "${proxy_pid:-}" "${redis_pid:-}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    >"$work/redis.log" 2>&1 &
redis_pid=$!
"$proxy_bin" --config "$root/policy/passthrough.yaml" --listen "127.0.0.1:$pport" \
    --upstream "127.0.0.1:$rport" --admin off >"$work/proxy.log" 2>&1 &
proxy_pid=$!

# Ready when both answer PING (bounded: 20 s).
for port in "$rport" "$pport"; do
    for attempt in $(seq 200); do
        if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]]; then break; fi
        if [[ $attempt == 200 ]]; then
            echo "conformance: nothing answers PING on port $port" >&2
            cat "$work/redis.log" "$work/proxy.log" >&2
            exit 2
        fi
        sleep 0.1
    done
done

rm -rf "$out"
TCL_SUITE_UNITS=${CONFORMANCE_UNITS:-all} TCL_SUITE_ADMIN="127.0.0.1:$rport" \
    TCL_SUITE_BASELINE="$here/baseline" REDIS_SRC="$src" \
    "$here/redis-tcl-suite.sh" 127.0.0.1 "$pport" "$out" | tail -4 || true

lost=$out/lost-vs-baseline.txt
[[ -f $lost ]] || { echo "conformance: the suite did not run (no $lost)" >&2; exit 2; }
known=$(grep -v '^#' "$here/known-losses.txt" | grep -v '^[[:space:]]*$' || true)
unexpected=$(grep -vxF -f <(printf '%s\n' "$known") "$lost" || true)
recovered=$(printf '%s\n' "$known" | grep -vxF -f "$lost" || true)
if [[ -n $recovered ]]; then
    echo "conformance: listed in known-losses.txt but passed now (remove them):"
    printf '  %s\n' "$recovered"
fi
if [[ -n $unexpected ]]; then
    echo "conformance: FAILED: tests that pass directly against Redis but not through the proxy:"
    printf '  %s\n' "$unexpected"
    echo "(logs: $out/logs; fix the proxy, or list the test with its reason in tests/conformance/known-losses.txt and docs/conformance.md)"
    exit 1
fi
echo "conformance: ok ($(wc -l <"$lost") known losses)"
