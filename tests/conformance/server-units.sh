#!/usr/bin/env bash
# tests/conformance/server-units.sh NAME PROXY_BINARY [OUTDIR]
#
# A newer server's own Tcl units, directly and through the proxy (the server matrix,
# docs/compatibility.md). NAME is a server scripts/build-servers.sh built (redis-8.0,
# valkey-9.1): its binary and the tests/ folder of its own source tree are in
# $CACHE/NAME (CACHE as the build script says). The units are servers/NAME/units.txt
# (SERVER_UNITS overrides them). Twice, each time on a fresh server of that binary:
#
#   1. directly against the server             -> OUTDIR/direct
#   2. through the proxy (policy/passthrough.yaml, as run.sh; SERVER_UNITS_POLICY
#      overrides it), compared with 1           -> OUTDIR/proxy
#
# and fails when a test that passed directly does not pass through the proxy, unless
# servers/NAME/known-losses.txt lists it ("unit<TAB>test name", each with its reason in
# docs/compatibility.md), or when fewer than 99.5% of the direct passes pass through the
# proxy. Units with an unexpected loss run once more through the proxy (the machines are
# shared and busy) and only what they lose again counts, as in run.sh. Prints the listed
# losses that passed, so the lists only shrink. OUTDIR/summary.tsv has the counts per unit.
#
# servers/NAME/unskip.txt lists units whose `start_server {tags {"external:skip needs:debug"}}`
# blocks run all the same (in a private copy of the tree, the tag replaced by
# `matrix:unskipped`): Redis 8.0 marks its whole hash-field-expiry unit so, for its
# `DEBUG SET-ACTIVE-EXPIRE 0`, which the servers here allow (`--enable-debug-command yes`)
# and the passthrough policy forwards.
#
# servers/NAME/proxy-skip.txt ("unit<TAB>test name") lists tests not run through the proxy at
# all (runtest --skipfile), because running them breaks the proxy for the tests after them
# (a proxy bug, described there and in docs/compatibility.md); each is a loss and must be in
# known-losses.txt too. Remove the line once the bug is fixed.
#
# Exit status: 0 ok; 1 lost tests; 2 setup error; 3 NAME is not built.
# Needs tclsh (installed with apt when missing and root), python3 (free ports).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${1:?usage: server-units.sh NAME PROXY_BINARY [OUTDIR]}
proxy_bin=${2:?usage: server-units.sh NAME PROXY_BINARY [OUTDIR]}
out=${3:-$root/target/server-units/$name}
cache=${RPP_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redis-policy-proxy/servers}
tree=$cache/$name
conf=$here/servers/$name
policy=${SERVER_UNITS_POLICY:-$root/policy/passthrough.yaml}

server=$(ls "$tree"/bin/*-server 2>/dev/null | head -1 || true)
cli=$(ls "$tree"/bin/*-cli 2>/dev/null | head -1 || true)
if [[ -z $server || ! -x $server || ! -f $tree/tests/test_helper.tcl ]]; then
    echo "server-units: $name is not built in $tree (scripts/build-servers.sh)" >&2
    exit 3
fi
[[ -f $conf/units.txt ]] || { echo "server-units: no $conf/units.txt" >&2; exit 2; }
units=${SERVER_UNITS:-$(grep -v '^#' "$conf/units.txt" | xargs)}
known=$(grep -v '^#' "$conf/known-losses.txt" 2>/dev/null | grep -v '^[[:space:]]*$' || true)
if ! command -v tclsh >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tcl >/dev/null ||
        { echo "server-units: no tclsh" >&2; exit 2; }
fi

# Tests the proxy runs skip (proxy-skip.txt), each also a listed loss.
proxy_skip=$(grep -v '^#' "$conf/proxy-skip.txt" 2>/dev/null | grep -v '^[[:space:]]*$' || true)
if [[ -n $proxy_skip ]]; then
    unlisted_skip=$(printf '%s\n' "$proxy_skip" | grep -vxF -f <(printf '%s\n' "$known") || true)
    [[ -z $unlisted_skip ]] || { echo "server-units: proxy-skip.txt names tests known-losses.txt does not: $unlisted_skip" >&2; exit 2; }
fi

# A private copy of the tree for unskip.txt's units (tests/ patched, src/ linking the binaries).
unskip=$(grep -v '^#' "$conf/unskip.txt" 2>/dev/null | xargs || true)
if [[ -n $unskip ]]; then
    patched=$(mktemp -d)
    cp -R "$tree/tests" "$patched/tests"
    mkdir "$patched/src"
    for f in "$tree"/src/*; do ln -s "$(readlink -f "$f")" "$patched/src/${f##*/}"; done
    for u in $unskip; do
        grep -q 'start_server {tags {"external:skip needs:debug"}}' "$patched/tests/$u.tcl" ||
            { echo "server-units: unskip.txt: no external:skip needs:debug block in $u" >&2; exit 2; }
        sed -i 's/start_server {tags {"external:skip needs:debug"}}/start_server {tags {"matrix:unskipped"}}/' \
            "$patched/tests/$u.tcl"
    done
    tree_for_suite=$patched
else
    patched=
    tree_for_suite=$tree
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
work=$(mktemp -d)
cleanup() {
    [[ ${#pids[@]} -eq 0 ]] || kill "${pids[@]}" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work" ${patched:+"$patched"}
}
trap cleanup EXIT

# Waits (20 s at most) until 127.0.0.1:$1 answers PING.
wait_ping() {
    for _ in $(seq 200); do
        [[ $("$cli" -p "$1" ping 2>/dev/null) == PONG ]] && return 0
        sleep 0.1
    done
    echo "server-units: nothing answers PING on port $1" >&2
    cat "$work"/*.log >&2
    exit 2
}

# run_suite MODE UNITS OUTDIR [BASELINE]: a fresh server (and proxy, MODE=proxy) and the units.
run_suite() {
    local mode=$1 run_units=$2 dir=$3 baseline=${4:-} rport pport target
    rport=$(free_port)
    mkdir -p "$work/$mode"
    "$server" --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work/$mode" \
        --enable-debug-command yes >"$work/$mode-server.log" 2>&1 &
    local spid=$!
    pids+=("$spid")
    wait_ping "$rport"
    target=$rport
    local ppid=
    if [[ $mode == proxy* ]]; then
        pport=$(free_port)
        "$proxy_bin" --config "$policy" --listen "127.0.0.1:$pport" \
            --upstream "127.0.0.1:$rport" --admin off >"$work/$mode-proxy.log" 2>&1 &
        ppid=$!
        pids+=("$ppid")
        wait_ping "$pport"
        target=$pport
    fi
    rm -rf "$dir"
    local extra=
    if [[ $mode == proxy* && -n $proxy_skip ]]; then
        printf '%s\n' "$proxy_skip" | cut -f2- >"$work/proxy-skip"
        extra="--skipfile $work/proxy-skip"
    fi
    TCL_SUITE_EXTRA_ARGS=$extra \
    TCL_SUITE_UNITS=$run_units TCL_SUITE_ADMIN="127.0.0.1:$rport" TCL_SUITE_BASELINE=$baseline \
        REDIS_SRC=$tree_for_suite REDIS_SERVER_BIN=$server REDIS_CLI_BIN=$cli \
        "$here/redis-tcl-suite.sh" 127.0.0.1 "$target" "$dir" >&2 || true
    kill $ppid "$spid" 2>/dev/null || true
    wait $ppid "$spid" 2>/dev/null || true
    [[ -z $ppid ]] || cp "$work/$mode-proxy.log" "$dir/proxy.log"
    [[ -f $dir/units.tsv ]] || { echo "server-units: the suite did not run ($dir)" >&2; exit 2; }
}

# The lost tests of a proxy run that known-losses.txt does not list.
unlisted() { grep -vxF -f <(printf '%s\n' "$known") "$1/lost-vs-baseline.txt" || true; }

t0=$(date +%s)
echo "server-units: $name ($("$server" --version | cut -c1-60)): $units"
run_suite direct "$units" "$out/direct"
t1=$(date +%s)
run_suite proxy "$units" "$out/proxy" "$out/direct"
t2=$(date +%s)
lost=$out/proxy/lost-vs-baseline.txt
[[ -f $lost ]] || { echo "server-units: no $lost" >&2; exit 2; }

unexpected=$(unlisted "$out/proxy")
if [[ -n $unexpected ]]; then
    again_units=$(printf '%s\n' "$unexpected" | cut -f1 | sort -u | xargs)
    echo "server-units: unexpected losses in $again_units; running those units again"
    printf '%s\n' "$unexpected" | sed 's/^/  /'
    run_suite proxy-again "$again_units" "$out/again" "$out/direct"
    again=$(unlisted "$out/again")
    flaky=$(printf '%s\n' "$unexpected" | grep -vxF -f <(printf '%s\n' "$again") || true)
    if [[ -n $flaky ]]; then
        echo "server-units: passed on the second run (flaky through the proxy; see $out/proxy/logs):"
        printf '%s\n' "$flaky" | sed 's/^/  /'
    fi
    unexpected=$(printf '%s\n' "$again" | grep -xF -f <(printf '%s\n' "$unexpected") || true)
fi
recovered=$(printf '%s\n' "$known" | grep -vxF -f "$lost" | grep -v '^$' || true)
if [[ -n $recovered ]]; then
    echo "server-units: listed in servers/$name/known-losses.txt but passed now (remove them):"
    printf '%s\n' "$recovered" | sed 's/^/  /'
fi

# Per unit: passes directly, passes through the proxy, lost, seconds of each run.
awk -F'\t' -v OFS='\t' '
    FILENAME ~ /direct\/units.tsv$/ && FNR > 1 { d[$1] = $3; ds[$1] = $7; st[$1] = $2; order[++n] = $1 }
    FILENAME ~ /proxy\/units.tsv$/ && FNR > 1  { p[$1] = $3; ps[$1] = $7; pst[$1] = $2 }
    FILENAME ~ /lost-vs-baseline.txt$/         { l[$1]++ }
    END {
        print "unit", "direct", "proxy", "lost", "direct_s", "proxy_s", "direct_status", "proxy_status"
        for (i = 1; i <= n; i++) { u = order[i]
            print u, d[u], p[u] + 0, l[u] + 0, ds[u], ps[u], st[u], pst[u]
            td += d[u]; tp += p[u]; tl += l[u]; tds += ds[u]; tps += ps[u] }
        print "total", td, tp, tl, tds, tps, "", ""
    }' "$out/direct/units.tsv" "$out/proxy/units.tsv" "$lost" >"$out/summary.tsv"
column -t -s $'\t' "$out/summary.tsv" | sed 's/^/  /'
read -r direct_passes kept nlost < <(awk -F'\t' '$1=="total"{print $2, $2-$4, $4}' "$out/summary.tsv")
errored=$(awk -F'\t' 'FNR>1 && $2=="errored"{print $1}' "$out/direct/units.tsv" | xargs)
[[ -z $errored ]] || echo "server-units: WARNING: units that errored directly (their tests after the error are in neither count): $errored"
echo "server-units: $name: $kept of $direct_passes direct passes pass through the proxy ($nlost lost, $(grep -c . <<<"$known" || true) listed); direct $((t1 - t0))s, proxy $((t2 - t1))s, all $(( $(date +%s) - t0 ))s"

status=0
if [[ -n $unexpected ]]; then
    echo "server-units: FAILED: tests of $name's own suite that pass directly but not through the proxy, twice:"
    printf '%s\n' "$unexpected" | sed 's/^/  /'
    echo "(logs: $out/proxy/logs, $out/again/logs; fix the proxy, or list the test with its reason in tests/conformance/servers/$name/known-losses.txt and docs/compatibility.md)"
    status=1
fi
if [[ $direct_passes -eq 0 ]] || (( kept * 1000 < direct_passes * 995 )); then
    echo "server-units: FAILED: $kept of $direct_passes is below 99.5% of the direct passes"
    status=1
fi
[[ $status -ne 0 ]] || echo "server-units: $name ok"
exit $status
