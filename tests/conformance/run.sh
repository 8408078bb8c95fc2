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
#
# CONFORMANCE_UPSTREAM=cluster: the same, through the proxy in front of a Redis Cluster of three
# primaries (no replicas; `upstream.mode: cluster`), compared with the same standalone baseline
# and checked against cluster-known-losses.txt instead (each reason in docs/conformance.md,
# "In front of a Redis Cluster"). CONFORMANCE_UNITS defaults to cluster-units.txt there.
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
    # shellcheck disable=SC2086 # redis_pid holds one pid per node in cluster mode
    kill "${proxy_pid:-}" ${redis_pid:-} 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

mode=${CONFORMANCE_UPSTREAM:-standalone}
known_file=$here/known-losses.txt
units=${CONFORMANCE_UNITS:-all}
if [[ $mode == cluster ]]; then
    known_file=$here/cluster-known-losses.txt
    units=${CONFORMANCE_UNITS:-$(grep -v '^#' "$here/cluster-units.txt" | xargs)}
    # Three primaries, each owning a third of the slots once `--cluster create` has run.
    nodes=()
    for i in 1 2 3; do
        port=$(free_port)
        mkdir -p "$work/node$i"
        # The bus port explicitly: Redis's default (port + 10000) may be taken or past 65535.
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$work/node$i" --cluster-enabled yes --cluster-config-file nodes.conf \
            --cluster-port "$(free_port)" \
            >"$work/node$i/redis.log" 2>&1 &
        redis_pid="${redis_pid:-} $!"
        nodes+=("127.0.0.1:$port")
    done
    rport=${nodes[0]##*:}
    for node in "${nodes[@]}"; do
        for attempt in $(seq 200); do
            if [[ $(redis-cli -p "${node##*:}" ping 2>/dev/null) == PONG ]]; then break; fi
            [[ $attempt == 200 ]] && { echo "conformance: node $node never answered PING" >&2; exit 2; }
            sleep 0.1
        done
    done
    redis-cli --cluster create "${nodes[@]}" --cluster-yes >"$work/create.log" 2>&1 ||
        { echo "conformance: redis-cli --cluster create failed" >&2; cat "$work/create.log" >&2; exit 2; }
    # Ready when every node sees every slot served (bounded: 30 s).
    for node in "${nodes[@]}"; do
        for attempt in $(seq 300); do
            if redis-cli -p "${node##*:}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then break; fi
            [[ $attempt == 300 ]] && { echo "conformance: cluster not ok on $node" >&2; exit 2; }
            sleep 0.1
        done
    done
    seeds=$(IFS=,; echo "${nodes[*]}")
    { sed '/^upstream:/,$d' "$root/policy/passthrough.yaml"
      printf 'upstream:\n  mode: cluster\n  memory_check_ms: 0\n  cluster:\n    seeds: [%s]\n' "$seeds"
    } >"$work/cluster.yaml"
    "$proxy_bin" --config "$work/cluster.yaml" --listen "127.0.0.1:$pport" --admin off \
        >"$work/proxy.log" 2>&1 &
    proxy_pid=$!
    # The between-units reset goes through the proxy, which sends CONFIG SET and FLUSHALL to
    # every primary.
    admin_addr=127.0.0.1:$pport
else
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
        >"$work/redis.log" 2>&1 &
    redis_pid=$!
    "$proxy_bin" --config "$root/policy/passthrough.yaml" --listen "127.0.0.1:$pport" \
        --upstream "127.0.0.1:$rport" --admin off >"$work/proxy.log" 2>&1 &
    proxy_pid=$!
    admin_addr=127.0.0.1:$rport
fi

# Ready when both answer PING (bounded: 20 s).
for port in "$rport" "$pport"; do
    for attempt in $(seq 200); do
        if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]]; then break; fi
        if [[ $attempt == 200 ]]; then
            echo "conformance: nothing answers PING on port $port" >&2
            cat "$work"/redis.log "$work"/node*/redis.log "$work/proxy.log" >&2 2>/dev/null || true
            exit 2
        fi
        sleep 0.1
    done
done

# Runs the suite (units "$1") into "$2" and prints the baseline-passing tests it lost that
# known-losses.txt does not list.
known=$(grep -v '^#' "$known_file" | grep -v '^[[:space:]]*$' || true)
# In front of a cluster, tests that cannot pass there and would break the tests after them
# (a busy script the test never kills once its `PING` is answered by another node) are not
# run at all: cluster-skip.txt, each also a listed loss.
skip_args=
if [[ $mode == cluster ]]; then
    skip=$(grep -v '^#' "$here/cluster-skip.txt" | grep -v '^[[:space:]]*$' || true)
    unlisted_skip=$(printf '%s\n' "$skip" | grep -vxF -f <(printf '%s\n' "$known") || true)
    [[ -z $unlisted_skip ]] || { echo "conformance: cluster-skip.txt names tests cluster-known-losses.txt does not: $unlisted_skip" >&2; exit 2; }
    printf '%s\n' "$skip" | cut -f2- >"$work/skip"
    skip_args="--skipfile $work/skip"
fi
run_units() {
    rm -rf "$2"
    TCL_SUITE_EXTRA_ARGS=$skip_args TCL_SUITE_UNITS=$1 TCL_SUITE_ADMIN="$admin_addr" \
        TCL_SUITE_BASELINE="$here/baseline" REDIS_SRC="$src" \
        "$here/redis-tcl-suite.sh" 127.0.0.1 "$pport" "$2" >&2 || true
    [[ -f $2/lost-vs-baseline.txt ]] || { echo "conformance: the suite did not run (no $2/lost-vs-baseline.txt)" >&2; exit 2; }
    grep -vxF -f <(printf '%s\n' "$known") "$2/lost-vs-baseline.txt" || true
}

unexpected=$(run_units "$units" "$out")
lost=$out/lost-vs-baseline.txt
[[ -f $lost ]] || exit 2
recovered=$(printf '%s\n' "$known" | grep -vxF -f "$lost" || true)
if [[ -n $recovered ]]; then
    echo "conformance: listed in ${known_file##*/} but passed now (remove them):"
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
    echo "(logs: $out/logs and $out/again/logs; fix the proxy, or list the test with its reason in tests/conformance/${known_file##*/} and docs/conformance.md)"
    exit 1
fi
# The baseline-passing tests of the units that ran (every unit's for "all", "core", "server").
case $units in
    all | core | server) ran=" " ;;
    *) ran=" $(echo $units) " ;;
esac
passing=$(awk -F'\t' -v ran="$ran" 'FNR>1 && $2=="ok" && (ran==" " || index(ran, " "$1" "))' "$here/baseline/results.tsv" | wc -l)
echo "conformance: ok ($(wc -l <"$lost") known losses of $passing baseline-passing tests)"
