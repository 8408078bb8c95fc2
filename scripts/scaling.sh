#!/usr/bin/env bash
# Scaling past one core: the proxy with `workers: N` for each N in WORKERS, interleaved round
# by round, measuring what decides whether throughput grows with cores once the proxy has
# cores of its own: requests per proxy-CPU-second (constant as N grows = linear scaling until
# Redis or the network is the bottleneck), how evenly the work spreads over the worker
# threads (the accept model's imbalance), and the model cores per 100k requests/s.
#
#   scripts/scaling.sh                       workers 1 and 2 in front of a local Redis
#   PROXY_CPUS=2-5 REDIS=10.0.0.7:6379 BENCH_CPUS=6-15 WORKERS="1 2 4" scripts/scaling.sh
#                                            a big host: the proxy on 4 cores of its own
#
# Environment:
#   WORKERS="1 2"    the `workers:` values measured (1: one current-thread runtime on the main
#                    thread; N: N worker threads, `rpp-worker-*`, each its own runtime)
#   PROXY_CPUS=1     taskset CPU list every proxy runs on (empty: unpinned)
#   REDIS_CPUS=0     taskset CPU list of the local redis-server (empty: unpinned)
#   BENCH_CPUS=      taskset CPU list of redis-benchmark (empty: unpinned)
#   REDIS=host:port  an existing Redis to forward to instead of a local one (its CPU is then
#                    not measured; put it on another host so that it is not the bottleneck)
#   CLIENTS=100 PIPELINE=1 REQUESTS=200000 ROUNDS=3 TESTS=set,get THREADS=2
#                    the load: redis-benchmark -c -P -n -t, and --threads (its own threads,
#                    so that one benchmark process can outrun several proxy cores)
#   POLICY=policy/passthrough.yaml   the policy every proxy runs
#   BIN=path         the proxy binary (default: this checkout, cargo build --release)
#   BASELINE=path    another build measured the same way in the same rounds (rows "base N"):
#                    a change's before and after in one interleaved run
#
# Reports per N: median throughput, proxy CPU µs per request, requests per proxy-CPU-second,
# the busiest worker thread's CPU over the mean of the N (1.00 = even: the acceptor gives
# each client to the worker with the fewest sessions), and cores per 100k requests/s = µs per request / 10. On this 2-core machine
# the proxy, Redis and the benchmark share the cores, so throughput cannot grow with N here;
# the per-request CPU and the balance can still be compared.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

WORKERS="${WORKERS:-1 2}"
PROXY_CPUS="${PROXY_CPUS-1}"
REDIS_CPUS="${REDIS_CPUS-0}"
BENCH_CPUS="${BENCH_CPUS-}"
CLIENTS="${CLIENTS:-100}"
PIPELINE="${PIPELINE:-1}"
REQUESTS="${REQUESTS:-200000}"
ROUNDS="${ROUNDS:-3}"
TESTS="${TESTS:-set,get}"
THREADS="${THREADS:-2}"
POLICY="${POLICY:-policy/passthrough.yaml}"

log_prefix=scaling
# log, die, pick_port, wait_ready, cpu_ticks: shared with scripts/bench.sh.
# shellcheck source=scripts/lib/measure.sh
source scripts/lib/measure.sh
# The taskset prefix of a CPU list (none when empty), as an array: processes are started
# with it directly, not through a function, so that `$!` is their own pid.
pin_for() {
    if [[ -n "$1" ]]; then
        pin=(taskset -c "$1")
    else
        pin=()
    fi
}

work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

if [[ -z "${BIN:-}" ]]; then
    log "building the proxy (cargo build --release)"
    cargo build --release --quiet
    BIN="${CARGO_TARGET_DIR:-target}/release/redis-policy-proxy"
fi
[[ -x "$BIN" ]] || die "no proxy binary at $BIN"

redis_pid=""
if [[ -n "${REDIS:-}" ]]; then
    upstream="$REDIS"
else
    pick_port
    pin_for "$REDIS_CPUS"
    "${pin[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" \
        --appendonly no --maxclients 10000 --logfile "$work/redis.log" >/dev/null 2>&1 &
    redis_pid=$!
    pids+=("$redis_pid")
    wait_ready "$port" "$redis_pid" || die "redis-server did not start"
    upstream="127.0.0.1:$port"
fi

declare -A port_of pid_of
# One proxy per measured build and N: label N for BIN, "base N" for BASELINE.
labels=()
for n in $WORKERS; do
    labels+=("$n")
    [[ -n "${BASELINE:-}" ]] && labels+=("base$n")
done
[[ -z "${BASELINE:-}" || -x "$BASELINE" ]] || die "no baseline binary at $BASELINE"
for label in "${labels[@]}"; do
    n="${label#base}"
    bin="$BIN"
    [[ "$label" == base* ]] && bin="$BASELINE"
    {
        grep -v '^workers:' "$POLICY"
        printf '\nworkers: %s\n' "$n"
    } >"$work/$label.yaml"
    "$bin" --check "$work/$label.yaml" >/dev/null || die "$bin rejects $work/$label.yaml"
    pick_port
    pin_for "$PROXY_CPUS"
    RUST_LOG=warn "${pin[@]}" "$bin" --config "$work/$label.yaml" \
        --listen "127.0.0.1:$port" --upstream "$upstream" --admin off >"$work/$label.log" 2>&1 &
    pid_of[$label]=$!
    pids+=("$!")
    port_of[$label]="$port"
    wait_ready "$port" "${pid_of[$label]}" || die "the proxy $label did not start: $(tail -5 "$work/$label.log")"
done

# The space-separated "tid:ticks" of each worker thread of PID (the runtime's workers when
# N > 1; the main thread, which runs the current-thread runtime, when N = 1).
thread_ticks() {
    local pid="$1" n="$2" t name out="" workers="tokio-r*-w*"
    # Worker threads: rpp-worker-* (builds since 2026-12-07), else tokio-runtime-worker (tokio's
    # multi-threaded scheduler before; the newer builds' blocking-pool threads share that
    # name, so it is matched only where no rpp-worker exists).
    if grep -qx 'rpp-worker-.*' /proc/"$pid"/task/*/comm 2>/dev/null; then
        workers="rpp-worker-*"
    fi
    for t in /proc/"$pid"/task/*; do
        name="$(cat "$t/comm")"
        # shellcheck disable=SC2053  # $workers is a glob on purpose
        if { [[ "$n" == 1 && "${t##*/}" == "$pid" ]] || [[ "$n" != 1 && "$name" == $workers ]]; }; then
            out+="${t##*/}:$(cpu_ticks "$pid/task/${t##*/}") "
        fi
    done
    echo "$out"
}

hz="$(getconf CLK_TCK)"
results="$work/results"
: >"$results"
tests_count="$(tr ',' '\n' <<<"$TESTS" | grep -c .)"
requests_per_run=$((REQUESTS * tests_count))
order=("${labels[@]}")
for round in $(seq 1 "$ROUNDS"); do
    # Rotated so that no N always runs first.
    rotated=("${order[@]:$(((round - 1) % ${#order[@]}))}" "${order[@]:0:$(((round - 1) % ${#order[@]}))}")
    for label in "${rotated[@]}"; do
        n="${label#base}"
        pid="${pid_of[$label]}"
        before="$(cpu_ticks "$pid")"
        threads_before="$(thread_ticks "$pid" "$n")"
        pin_for "$BENCH_CPUS"
        csv="$("${pin[@]}" redis-benchmark -h 127.0.0.1 -p "${port_of[$label]}" \
            -c "$CLIENTS" -P "$PIPELINE" -n "$REQUESTS" -t "$TESTS" -r 100000 \
            --threads "$THREADS" --csv 2>/dev/null)"
        after="$(cpu_ticks "$pid")"
        threads_after="$(thread_ticks "$pid" "$n")"
        ops="$(awk -F'"' 'NR > 1 && $4 != "" { s += $4; k++ } END { if (k) printf "%.0f", s / k }' <<<"$csv")"
        # The busiest worker thread's ticks over the mean of the workers this run.
        balance="$(awk -v b="$threads_before" -v a="$threads_after" 'BEGIN {
            nb = split(b, bs, " "); for (i = 1; i <= nb; i++) { split(bs[i], kv, ":"); before[kv[1]] = kv[2] }
            na = split(a, as, " "); max = 0; sum = 0; k = 0
            for (i = 1; i <= na; i++) { split(as[i], kv, ":"); d = kv[2] - before[kv[1]]; sum += d; k++; if (d > max) max = d }
            if (k && sum) printf "%.2f", max / (sum / k); else printf "n/a" }')"
        us="$(awk -v t=$((after - before)) -v hz="$hz" -v r="$requests_per_run" 'BEGIN { printf "%.2f", t / hz * 1e6 / r }')"
        echo "$label $ops $us $balance" >>"$results"
        log "round $round workers $label: $ops ops/s, proxy $us µs per request, busiest worker $balance of the mean"
    done
done

echo
echo "workers: N, $ROUNDS rounds, redis-benchmark -c $CLIENTS -P $PIPELINE -t $TESTS --threads $THREADS, proxy on CPUs '${PROXY_CPUS:-any}', Redis '${REDIS:-local}' on '${REDIS_CPUS:-any}'; medians"
echo
echo "| workers | ops/s | proxy µs per request | requests per proxy-CPU-second | busiest worker / mean | cores per 100k requests/s |"
echo "|---:|---:|---:|---:|---:|---:|"
for label in "${labels[@]}"; do
    awk -v n="$label" '$1 == n { ops[++k] = $2; us[k] = $3; bal[k] = $4 }
        function median(a, k,   i, j, t) {
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            return a[int((k + 1) / 2)] }
        END {
            o = median(ops, k); u = median(us, k); b = median(bal, k)
            sub(/^base/, "base ", n); printf "| %s | %.0f | %.2f | %.0f | %s | %.2f |\n", n, o, u, (u > 0 ? 1e6 / u : 0), b, u / 10 }' "$results"
done
