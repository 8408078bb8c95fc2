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

# Runs the suite (units "$1") into "$2" and prints the baseline-passing tests it lost that
# known-losses.txt does not list.
known=$(grep -v '^#' "$here/known-losses.txt" | grep -v '^[[:space:]]*$' || true)
run_units() {
    rm -rf "$2"
    TCL_SUITE_UNITS=$1 TCL_SUITE_ADMIN="127.0.0.1:$rport" \
        TCL_SUITE_BASELINE="$here/baseline" REDIS_SRC="$src" \
        "$here/redis-tcl-suite.sh" 127.0.0.1 "$pport" "$2" >&2 || true
    [[ -f $2/lost-vs-baseline.txt ]] || { echo "conformance: the suite did not run (no $2/lost-vs-baseline.txt)" >&2; exit 2; }
    grep -vxF -f <(printf '%s\n' "$known") "$2/lost-vs-baseline.txt" || true
}

unexpected=$(run_units "${CONFORMANCE_UNITS:-all}" "$out")
lost=$out/lost-vs-baseline.txt
[[ -f $lost ]] || exit 2
recovered=$(printf '%s\n' "$known" | grep -vxF -f "$lost" || true)
if [[ -n $recovered ]]; then
    echo "conformance: listed in known-losses.txt but passed now (remove them):"
    printf '%s\n' "$recovered" | sed 's/^/  /'
fi
if [[ -n $unexpected ]]; then
    # A test that fails once may have lost a race of the suite's own (the machines are shared
    # and busy); its unit runs again, and only what it loses again counts.
    units=$(printf '%s\n' "$unexpected" | cut -f1 | sort -u | tr '\n' ' ')
    echo "conformance: unexpected losses in $units; running those units again"
    printf '%s\n' "$unexpected" | sed 's/^/  /'
    again=$(run_units "$units" "$out/again")
    [[ -f $out/again/lost-vs-baseline.txt ]] || exit 2
    flaky=$(printf '%s\n' "$unexpected" | grep -vxF -f <(printf '%s\n' "$again") || true)
    if [[ -n $flaky ]]; then
        echo "conformance: passed on the second run (flaky through the proxy; see $out/logs):"
        printf '%s\n' "$flaky" | sed 's/^/  /'
    fi
    unexpected=$(printf '%s\n' "$again" | grep -xF -f <(printf '%s\n' "$unexpected") || true)
fi
if [[ -n $unexpected ]]; then
    echo "conformance: FAILED: tests that pass directly against Redis but not through the proxy, twice:"
    printf '%s\n' "$unexpected" | sed 's/^/  /'
    echo "(logs: $out/logs and $out/again/logs; fix the proxy, or list the test with its reason in tests/conformance/known-losses.txt and docs/conformance.md)"
    exit 1
fi
echo "conformance: ok ($(wc -l <"$lost") known losses of $(awk -F'\t' 'FNR>1 && $2=="ok"' "$here/baseline/results.tsv" | wc -l) baseline-passing tests)"
