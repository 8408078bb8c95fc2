#!/usr/bin/env bash
# End-to-end benchmark: redis-benchmark against Redis directly, through redis-policy-proxy
# (passthrough and default configs) and through twemproxy, interleaved, several rounds.
#
#   scripts/bench.sh                 full run (about 11 minutes on 2 cores)
#   QUICK=1 scripts/bench.sh         requests / 10, for a smoke test (about 1.5 minutes)
#   CLUSTER=1 scripts/bench.sh       also the Redis Cluster rows (cP1, cP16)
#   PREDIXY=path CLUSTER=1 scripts/bench.sh   predixy too, standalone and in front of the cluster
#
# Environment:
#   ROUNDS=3     rounds; every round runs every target once per workload, in a rotated order so
#                that no target always runs first (cold) or last
#   QUICK=1      divide every -n by 10
#   PIN=1        CPU pinning with taskset: redis-server on core 0, both proxies and twemproxy
#                on core 1, redis-benchmark unpinned. It keeps the scheduler from moving the
#                servers between cores mid-run (less noise) and gives the proxy exactly one
#                core, as single-threaded twemproxy uses, so the comparison is like for like.
#                With 2 cores the unpinned benchmark client still competes with both.
#   WORKLOADS="P1 P16 c500 c1000 mixed ttl16"   subset of workloads to run
#   CLUSTER=1    add the cluster workloads cP1 and cP16 (SET/GET, -c 50 -r 100000, -P 1 and
#                -P 16): a 3-primary Redis Cluster (no replicas) on free ports, and the proxy in
#                `upstream.mode: cluster` in front of it. Their "direct" target is
#                `redis-benchmark --cluster` against the nodes (each client stays on one node
#                and its keys carry that node's hash tag); through the proxy the random keys
#                spread over all three primaries, so a -P 16 pipeline switches nodes (sent as
#                one batch per node, see docs/cluster.md). Naming
#                cP1 or cP16 in WORKLOADS also starts the cluster. With PREDIXY=path, predixy
#                in front of the cluster too (target predixy-cluster).
#   NUTCRACKER=path   twemproxy binary (default: nutcracker on PATH or /usr/sbin/nutcracker);
#                when missing, the twemproxy target is skipped
#   PREDIXY=path predixy binary (not packaged; build it from its source outside the repo, see
#                docs/performance.md): adds the predixy target, one worker thread, standalone
#                pool in front of the same Redis; with the cluster workloads (CLUSTER=1, or
#                cP1/cP16 in WORKLOADS) also predixy-cluster, a ClusterServerPool over the
#                same three nodes, one worker thread, pinned like the other proxies, a column
#                of the cluster rows next to proxy-cluster; skipped when unset
#   SYSCALLS=1   profile each proxy process per request (perf stat on syscall tracepoints,
#                needs linux-perf): syscalls (reads, writes, epoll_wait, other) and user vs
#                kernel CPU, a table per workload after the comparison; perf's counting costs
#                the traced process a little, so compare these runs among themselves
#   KEEP=1       keep the temp directory (logs, raw results) after exit
#   INSIGHT=1    add two targets: proxy-audit, the default policy with the audit trail of all
#                writes on (`audit.commands: writes`, JSON lines to a file in the temp
#                directory), and proxy-insight, the same plus the keyspace statistics of every
#                keyed command (`keyspace.sample: 1`) where the binary has them; compare their
#                ratios with proxy-default's for the cost (docs/performance.md)
#   ROUTES=1     add the target proxy-routes: the default policy with two routes, the upper
#                half of the random keys on a second redis-server (docs/routes.md)
#   MIRROR=1     add three targets, the default policy with a mirror (docs/migration.md):
#                proxy-mirror (every write also sent to a second redis-server),
#                proxy-mirror-compare (and 1% of reads compared), proxy-mirror-dead (the
#                mirror's port closed: what a dead mirror costs the clients)
#   BASELINE_POLICY_DIR=dir   where the baseline reads passthrough.yaml and default.yaml
#                (default policy/): an earlier commit's own, when the files changed since
#   BASELINE=path   another build of the proxy (e.g. an earlier commit's release binary):
#                adds the targets base-passthrough and base-default (and base-cluster with
#                CLUSTER=1), run interleaved with the
#                rest on the same policy files, so a change is measured before and after in
#                one run (ratios to direct, like every other target)
#
# Needs redis-server (7.0 or later for the cluster rows), redis-cli and redis-benchmark
# (Debian: redis-server redis-tools), and twemproxy for that column (Debian: nutcracker).
#
# Reports, for each workload and target: median ops/s, the ratio to direct (median of the
# per-round ratios, with min-max), median p50/p99 latency from redis-benchmark --csv, and the
# CPU each server process spent per request (utime+stime from /proc/PID/stat around each run,
# divided by the run's requests; in the cluster rows, Redis's CPU is the three nodes' summed).
# Ends with Markdown tables: per workload, then the comparison at a glance (a row per workload,
# a column per target, "throughput ratio / cpu-ratio" where cpu-ratio = direct Redis CPU per
# request / (proxy + Redis CPU per request behind it), and each proxy's CPU per request), then
# per test with p50/p99; and one `summary:` line.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"

ROUNDS="${ROUNDS:-3}"
QUICK="${QUICK:-0}"
PIN="${PIN:-0}"
WORKLOADS="${WORKLOADS:-P1 P16 c500 c1000 mixed ttl16}"
KEEP="${KEEP:-0}"
CLUSTER="${CLUSTER:-0}"
CLUSTER_WORKLOADS="cP1 cP16"

log_prefix=bench
# log, die, pick_port, wait_ready, cpu_ticks: shared with scripts/scaling.sh.
# shellcheck source=scripts/lib/measure.sh
source "$repo/scripts/lib/measure.sh"

for tool in redis-server redis-cli redis-benchmark; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "$tool not found (Debian: apt-get install -y redis-server redis-tools)"
done
NUTCRACKER="${NUTCRACKER:-$(command -v nutcracker || echo /usr/sbin/nutcracker)}"
have_twemproxy=1
if [[ ! -x "$NUTCRACKER" ]]; then
    log "twemproxy (nutcracker) not found; skipping that target (Debian: apt-get install -y nutcracker)"
    have_twemproxy=0
fi
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer"

is_cluster_workload() { [[ " $CLUSTER_WORKLOADS " == *" $1 "* ]]; }
if [[ "$CLUSTER" == 1 ]]; then
    for w in $CLUSTER_WORKLOADS; do
        [[ " $WORKLOADS " == *" $w "* ]] || WORKLOADS+=" $w"
    done
fi
need_cluster=0
for w in $WORKLOADS; do
    if is_cluster_workload "$w"; then need_cluster=1; fi
done

# 1000 clients need ~1000 descriptors in each of redis-benchmark, the proxy and Redis.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if (($(ulimit -n) < 4096)); then
    log "warning: open-file limit is $(ulimit -n); the 1000-client workload may fail"
fi

clk_tck="$(getconf CLK_TCK)"

# --- Pinning ----------------------------------------------------------------------------------
redis_pin=()
proxy_pin=()
if [[ "$PIN" == 1 ]]; then
    if command -v taskset >/dev/null 2>&1 && (($(nproc) >= 2)); then
        redis_pin=(taskset -c 0)
        proxy_pin=(taskset -c 1)
        log "PIN=1: redis-server on core 0, proxies on core 1, redis-benchmark unpinned"
    else
        log "PIN=1 needs taskset and at least 2 cores; running unpinned"
    fi
fi

# --- Temp dir and teardown --------------------------------------------------------------------
work="$(mktemp -d -t rpp-bench.XXXXXX)"
pids=()

# shellcheck disable=SC2317  # called from the EXIT trap
cleanup() {
    local status=$?
    local pid
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        # Bounded: SIGKILL whatever has not exited after ~5 s.
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ "$KEEP" == 1 ]]; then
        log "kept $work"
    else
        rm -rf "$work"
    fi
    exit "$status"
}
# Every way out goes through cleanup, also a closed output pipe (`| head`) or a lost terminal.
trap cleanup EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 141' PIPE
trap 'exit 143' TERM

# --- Helpers ----------------------------------------------------------------------------------
# start NAME LAUNCHER LOG...: picks a port, runs `LAUNCHER PORT`, which starts one background
# process and sets $launched_pid, then waits for PING. A port taken in the meantime (or any
# start failure) is retried with a new port, three attempts in all. Every process started is
# recorded for teardown. Sets $started_port and $started_pid.
launched_pid=""
started_port=""
started_pid=""
start() {
    local name="$1" launcher="$2" p
    shift 2
    for attempt in 1 2 3; do
        pick_port
        p="$port"
        "$launcher" "$p"
        pids+=("$launched_pid")
        if wait_ready "$p" "$launched_pid"; then
            started_port="$p"
            started_pid="$launched_pid"
            return 0
        fi
        kill -KILL "$launched_pid" 2>/dev/null || true
        log "$name did not answer PING on port $p (attempt $attempt); its log:"
        tail -n 20 "$@" >&2 2>/dev/null || true
    done
    die "could not start $name"
}


# --- Build and start everything ---------------------------------------------------------------
log "building the proxy (cargo build --release)"
cargo build --release --quiet
bin="${CARGO_TARGET_DIR:-$repo/target}/release/redis-policy-proxy"
[[ -x "$bin" ]] || die "no binary at $bin"

launch_redis() {
    "${redis_pin[@]}" redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no \
        --dir "$work" --logfile "$work/redis.log" --maxclients 10000 >>"$work/redis.out" 2>&1 &
    launched_pid=$!
}
start redis-server launch_redis "$work/redis.log" "$work/redis.out"
redis_port="$started_port"
redis_pid="$started_pid"

targets=(direct)
declare -A port_of pid_of
port_of[direct]="$redis_port"
pid_of[direct]=""

# add_target NAME LAUNCHER LOG...: `start`s it and records it as a target of every standalone
# workload.
add_target() {
    local name="$1"
    start "$@"
    targets+=("$name")
    port_of[$name]="$started_port"
    pid_of[$name]="$started_pid"
}

proxy_config=""
proxy_log=""
proxy_bin="$bin"
launch_proxy() {
    RUST_LOG="${RUST_LOG:-info}" "${proxy_pin[@]}" "$proxy_bin" --config "$proxy_config" \
        --listen "127.0.0.1:$1" --upstream "127.0.0.1:$redis_port" --admin off 2>>"$proxy_log" &
    launched_pid=$!
}
# add_proxy NAME CONFIG: the proxy binary ($proxy_bin) with CONFIG as target NAME.
add_proxy() {
    proxy_config="$2"
    proxy_log="$work/$1.log"
    add_target "$1" launch_proxy "$proxy_log"
}
for name in proxy-passthrough proxy-default; do
    add_proxy "$name" "policy/${name#proxy-}.yaml"
done
if [[ "${INSIGHT:-0}" == 1 ]]; then
    # The default policy plus the audit trail of every write (proxy-audit, and proxy-insight
    # with the keyspace statistics too, where this build has them: `--check` says whether
    # the file parses). Each writes its own trail, rotated at 20 MB, one old file kept.
    for name in proxy-audit proxy-insight; do
        proxy_config="$work/$name.yaml"
        {
            cat policy/default.yaml
            printf '\naudit:\n  commands: writes\n  output: %s\n' "$work/$name.jsonl"
            printf '  max_file_bytes: 20000000\n  max_files: 1\n'
        } >"$proxy_config"
        if [[ "$name" == proxy-insight ]]; then
            printf 'keyspace:\n  sample: 1\n' >>"$proxy_config"
            if ! "$bin" --check "$proxy_config" >/dev/null 2>&1; then
                log "this build has no keyspace statistics: skipping proxy-insight"
                continue
            fi
        fi
        add_proxy "$name" "$proxy_config"
    done
fi
if [[ "${ROUTES:-0}" == 1 ]]; then
    # The default policy with two routes (docs/routes.md): keys key:000000050000 and up (half
    # of -r 100000) go to a second redis-server, the rest to the first. The second server's
    # CPU is not in the Redis column: compare this target's proxy µs and throughput ratio.
    start redis-server-2 launch_redis "$work/redis.log" "$work/redis.out"
    second_port="$started_port"
    {
        cat policy/default.yaml
        printf '\nupstreams:\n  second:\n    address: 127.0.0.1:%s\n' "$second_port"
        printf 'routes:\n  - name: upper-half\n    upstream: second\n'
        printf '    prefixes: ["key:00000005", "key:00000006", "key:00000007", "key:00000008", "key:00000009"]\n'
    } >"$work/proxy-routes.yaml"
    add_proxy proxy-routes "$work/proxy-routes.yaml"
fi
if [[ "${MIRROR:-0}" == 1 ]]; then
    # The default policy with a mirror (docs/migration.md): proxy-mirror sends every write to
    # a second redis-server, proxy-mirror-compare also compares 1% of the reads, and
    # proxy-mirror-dead mirrors to a port nothing listens on (its writes are dropped and
    # counted). The mirror's own CPU is not in the Redis column: compare these targets' proxy
    # µs and throughput ratio with proxy-default's.
    start redis-server-mirror launch_redis "$work/redis.log" "$work/redis.out"
    mirror_port="$started_port"
    pick_port
    dead_port="$port"
    for name in proxy-mirror proxy-mirror-compare proxy-mirror-dead; do
        target_port="$mirror_port"
        if [[ "$name" == proxy-mirror-dead ]]; then
            target_port="$dead_port"
        fi
        {
            cat policy/default.yaml
            printf '\nmirror:\n  upstream:\n    address: 127.0.0.1:%s\n    connections: 1\n' "$target_port"
            if [[ "$name" == proxy-mirror-compare ]]; then
                printf '  compare:\n    share: 1%%\n'
            fi
        } >"$work/$name.yaml"
        add_proxy "$name" "$work/$name.yaml"
    done
fi
if [[ -n "${BASELINE:-}" ]]; then
    [[ -x "$BASELINE" ]] || die "BASELINE=$BASELINE is not an executable"
    proxy_bin="$BASELINE"
    for name in base-passthrough base-default; do
        add_proxy "$name" "${BASELINE_POLICY_DIR:-policy}/${name#base-}.yaml"
    done
    proxy_bin="$bin"
fi

launch_twemproxy() {
    cat >"$work/nutcracker.yml" <<EOF
bench:
  listen: 127.0.0.1:$1
  hash: fnv1a_64
  distribution: ketama
  redis: true
  preconnect: true
  auto_eject_hosts: false
  server_connections: 1
  servers:
    - 127.0.0.1:$redis_port:1
EOF
    if ! "$NUTCRACKER" --test-conf --conf-file="$work/nutcracker.yml" \
        >"$work/nutcracker-test.log" 2>&1; then
        cat "$work/nutcracker-test.log" >&2
        die "twemproxy rejected its generated config"
    fi
    # The stats listener gets a free port of its own instead of the fixed default 22222.
    pick_port
    "${proxy_pin[@]}" "$NUTCRACKER" --conf-file="$work/nutcracker.yml" \
        --output="$work/nutcracker.log" --stats-port="$port" --stats-addr=127.0.0.1 \
        --pid-file="$work/nutcracker.pid" &
    launched_pid=$!
}
tw_port=""
if [[ "$have_twemproxy" == 1 ]]; then
    add_target twemproxy launch_twemproxy "$work/nutcracker.log"
    tw_port="$started_port"
fi

# predixy is not a Debian package: PREDIXY=path/to/predixy adds it (a build of its source, see
# docs/performance.md). One worker thread, like twemproxy and the proxy, on the proxies' core.
# predixy_head NAME PORT LOG: the settings both predixy targets share, before the pool.
predixy_head() {
    cat <<EOF
Name $1
Bind 127.0.0.1:$2
WorkerThreads 1
ClientTimeout 0
Log $3
LogVerbSample 0
LogDebugSample 0
LogInfoSample 0
LogNoticeSample 1
LogWarnSample 1
LogErrorSample 1
Authority {
    Auth {
        Mode write
    }
}
EOF
}
launch_predixy() {
    {
        predixy_head bench "$1" "$work/predixy.log"
        cat <<EOF
StandaloneServerPool {
    RefreshMethod fixed
    Group shard001 {
        + 127.0.0.1:$redis_port
    }
}
EOF
    } >"$work/predixy.conf"
    "${proxy_pin[@]}" "$PREDIXY" "$work/predixy.conf" >>"$work/predixy.out" 2>&1 &
    launched_pid=$!
}
if [[ -n "${PREDIXY:-}" ]]; then
    [[ -x "$PREDIXY" ]] || die "PREDIXY=$PREDIXY is not an executable"
    add_target predixy launch_predixy "$work/predixy.log" "$work/predixy.out"
fi

log "redis :$redis_port  passthrough :${port_of[proxy-passthrough]}  default :${port_of[proxy-default]}$(
    [[ "$have_twemproxy" == 1 ]] && echo "  twemproxy :$tw_port"
)$([[ -n "${PREDIXY:-}" ]] && echo "  predixy :${port_of[predixy]}")  (temp dir $work)"

# --- Redis Cluster and the proxy in front of it (CLUSTER=1) ---------------------------------
cluster_ports=()
cluster_pids=()
cluster_targets=(direct)
launch_cluster_node() {
    # The bus port is chosen too: Redis's default (port + 10000) may be taken or above 65535.
    pick_port
    "${redis_pin[@]}" redis-server --port "$1" --cluster-enabled yes --cluster-port "$port" \
        --cluster-config-file "$work/nodes-$1.conf" --bind 127.0.0.1 --save "" \
        --appendonly no --dir "$work" --logfile "$work/cluster-$1.log" --maxclients 10000 \
        >>"$work/cluster.out" 2>&1 &
    launched_pid=$!
}

# cluster_ok PORT: the node sees a whole cluster: state ok, all slots served, every node known.
cluster_ok() {
    local info
    info="$(redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r')" || return 1
    grep -qx 'cluster_state:ok' <<<"$info" &&
        grep -qx 'cluster_slots_ok:16384' <<<"$info" &&
        grep -qx "cluster_known_nodes:${#cluster_ports[@]}" <<<"$info"
}

launch_cluster_proxy() {
    local seeds
    seeds="$(printf '127.0.0.1:%s, ' "${cluster_ports[@]}")"
    # One file per proxy: each watches its own, and rewriting a shared one would look to the
    # first like a changed `listen` ("changed settings need a restart").
    cat >"$work/$cluster_name.yaml" <<EOF
listen: 127.0.0.1:$1
upstream:
  mode: cluster
  cluster:
    seeds: [${seeds%, }]
EOF
    RUST_LOG="${RUST_LOG:-info}" "${proxy_pin[@]}" "$cluster_bin" --config "$work/$cluster_name.yaml" \
        --admin off 2>>"$work/$cluster_name.log" &
    launched_pid=$!
}

# add_cluster_target NAME LAUNCHER LOG...: `start`s a proxy in front of the cluster and waits
# until it serves a SET (its slot map read): PING is answered before the map is, a keyed
# command needs it. Records it as a target of the cluster workloads.
add_cluster_target() {
    local name="$1"
    start "$@"
    port_of[$name]="$started_port"
    pid_of[$name]="$started_pid"
    cluster_targets+=("$name")
    local ready=0
    for _ in $(seq 1 100); do
        if [[ "$(redis-cli -h 127.0.0.1 -p "$started_port" set bench:ready 1 2>/dev/null)" == OK ]]; then
            ready=1
            break
        fi
        sleep 0.1
    done
    [[ "$ready" == 1 ]] || die "$name did not serve a SET within 10 s"
}

# start_cluster_proxy NAME BINARY: the proxy BINARY in front of the cluster as target NAME.
start_cluster_proxy() {
    cluster_name="$1"
    cluster_bin="$2"
    add_cluster_target "$1" launch_cluster_proxy "$work/$1.log"
}

# predixy in front of the same cluster (PREDIXY=path): a ClusterServerPool seeded with every
# node (it reads the slot map with CLUSTER NODES and refreshes it every second), one worker
# thread and the proxies' core, like the standalone predixy target. The nodes have no
# replicas, so MasterReadPriority 100 only says what is true anyway: reads go to primaries.
launch_predixy_cluster() {
    {
        predixy_head bench-cluster "$1" "$work/predixy-cluster.log"
        cat <<EOF
ClusterServerPool {
    MasterReadPriority 100
    StaticSlaveReadPriority 0
    DynamicSlaveReadPriority 0
    Servers {
EOF
        printf '        + 127.0.0.1:%s\n' "${cluster_ports[@]}"
        printf '    }\n}\n'
    } >"$work/predixy-cluster.conf"
    "${proxy_pin[@]}" "$PREDIXY" "$work/predixy-cluster.conf" >>"$work/predixy-cluster.out" 2>&1 &
    launched_pid=$!
}

if [[ "$need_cluster" == 1 ]]; then
    for i in 1 2 3; do
        start "cluster node $i" launch_cluster_node "$work/cluster.out"
        cluster_ports+=("$started_port")
        cluster_pids+=("$started_pid")
    done
    # shellcheck disable=SC2046  # one argument per node on purpose
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${cluster_ports[@]}") \
        --cluster-replicas 0 --cluster-yes >"$work/cluster-create.log" 2>&1 ||
        die "redis-cli --cluster create failed: $(tail -n 5 "$work/cluster-create.log")"
    # Every node must agree before anything is measured (polled, 30 s deadline).
    ready=0
    for _ in $(seq 1 300); do
        ready=1
        for p in "${cluster_ports[@]}"; do
            cluster_ok "$p" || ready=0
        done
        [[ "$ready" == 1 ]] && break
        sleep 0.1
    done
    [[ "$ready" == 1 ]] ||
        die "cluster not ready within 30 s: $(redis-cli -p "${cluster_ports[0]}" cluster info)"
    start_cluster_proxy proxy-cluster "$bin"
    # The baseline build in front of the same cluster, interleaved like base-passthrough.
    if [[ -n "${BASELINE:-}" ]]; then
        start_cluster_proxy base-cluster "$BASELINE"
    fi
    if [[ -n "${PREDIXY:-}" ]]; then
        add_cluster_target predixy-cluster launch_predixy_cluster \
            "$work/predixy-cluster.log" "$work/predixy-cluster.out"
    fi
    log "cluster nodes :${cluster_ports[*]}  proxy-cluster :${port_of[proxy-cluster]}$(
        [[ -n "${BASELINE:-}" ]] && echo "  base-cluster :${port_of[base-cluster]}")$(
        [[ -n "${PREDIXY:-}" ]] && echo "  predixy-cluster :${port_of[predixy-cluster]}")"
fi

# --- Workloads --------------------------------------------------------------------------------
scale() { if [[ "$QUICK" == 1 ]]; then echo $(($1 / 10)); else echo "$1"; fi; }

declare -A wl_tests wl_args wl_n
wl_tests[P1]="set,get"
wl_n[P1]="$(scale 200000)"
wl_args[P1]="-c 50 -r 100000"
wl_tests[P16]="set,get"
wl_n[P16]="$(scale 1000000)"
wl_args[P16]="-c 50 -r 100000 -P 16"
wl_tests[c500]="set,get"
wl_n[c500]="$(scale 200000)"
wl_args[c500]="-c 500 -r 100000"
wl_tests[c1000]="set,get"
wl_n[c1000]="$(scale 200000)"
wl_args[c1000]="-c 1000 -r 100000"
wl_tests[mixed]="set,get,incr,lpush,rpop,hset"
wl_n[mixed]="$(scale 200000)"
wl_args[mixed]="-c 50 -r 100000 -d 1024"
# What a client following the guide sends itself: SET with its own TTL, pipelined. Direct
# Redis does measurably more work per SET with an expiry; comparing the default policy's P16
# SET (the proxy adds PX) with this row separates Redis's TTL cost from the proxy's.
declare -A wl_cmd
wl_tests[ttl16]="SET-PX"
wl_cmd[ttl16]="SET key:__rand_int__ xxx PX 3600000"
wl_n[ttl16]="$(scale 1000000)"
wl_args[ttl16]="-c 50 -r 100000 -P 16"

# Redis Cluster (CLUSTER=1): random keys over three primaries.
wl_tests[cP1]="set,get"
wl_n[cP1]="$(scale 200000)"
wl_args[cP1]="-c 50 -r 100000"
wl_tests[cP16]="set,get"
wl_n[cP16]="$(scale 1000000)"
wl_args[cP16]="-c 50 -r 100000 -P 16"

for w in $WORKLOADS; do
    [[ -n "${wl_tests[$w]:-}" ]] ||
        die "unknown workload '$w' (known: P1 P16 c500 c1000 mixed ttl16 $CLUSTER_WORKLOADS)"
done
# The targets a workload runs against; a cluster workload's "direct" is the cluster itself
# (the proxies in front of it were added to cluster_targets as they started).
targets_of() {
    if is_cluster_workload "$1"; then
        echo "${cluster_targets[*]}"
    else
        echo "${targets[*]}"
    fi
}

# "utime stime" in ticks of process $1.
cpu_split() {
    local rest
    rest="$(cat "/proc/$1/stat")"
    rest="${rest##*) }"
    # shellcheck disable=SC2086  # split the fields on purpose
    set -- $rest
    echo "${12} ${13}"
}

# The syscalls SYSCALLS=1 counts, by the column they are reported in.
sys_reads="read recvfrom readv recvmsg"
sys_writes="write sendto writev sendmsg"
sys_waits="epoll_wait epoll_pwait epoll_pwait2"
sys_events="raw_syscalls:sys_enter"
for call in $sys_reads $sys_writes $sys_waits; do
    sys_events="$sys_events,syscalls:sys_enter_$call"
done
if [[ "${SYSCALLS:-0}" == 1 ]]; then
    command -v perf >/dev/null 2>&1 || die "SYSCALLS=1 needs perf (Debian: linux-perf)"
fi
# One TSV line per (workload, round, proxy target) under SYSCALLS=1:
#   workload round target requests all reads writes waits utime_ticks stime_ticks
syscalls_tsv=""

# Sum of the CPU ticks of several processes.
sum_ticks() {
    local total=0 pid
    for pid in "$@"; do
        total=$((total + $(cpu_ticks "$pid")))
    done
    echo "$total"
}

# One TSV line per (workload, round, target, test):
#   workload round target test n rps p50 p99 cpu_redis_us_per_req cpu_proxy_us_per_req errors
results="$work/results.tsv"
: >"$results"
errors_log="$work/errors.log"
: >"$errors_log"
syscalls_tsv="$work/syscalls.tsv"
: >"$syscalls_tsv"

run_one() {
    local w="$1" round="$2" target="$3"
    local port="${port_of[$target]}" ppid="${pid_of[$target]}"
    local rpids=("$redis_pid") mode=()
    if is_cluster_workload "$w"; then
        rpids=("${cluster_pids[@]}")
        if [[ "$target" == direct ]]; then
            port="${cluster_ports[0]}"
            mode=(--cluster)
        fi
    fi
    local n="${wl_n[$w]}" tests="${wl_tests[$w]}"
    local ntests requests r0 r1 p0=0 p1=0 out err rc=0
    ntests="$(tr ',' '\n' <<<"$tests" | wc -l)"
    requests=$((n * ntests))
    out="$work/out.$w.$round.$target"
    err="$work/err.$w.$round.$target"

    r0="$(sum_ticks "${rpids[@]}")"
    [[ -n "$ppid" ]] && p0="$(cpu_ticks "$ppid")"
    local select=(-t "$tests")
    if [[ -n "${wl_cmd[$w]:-}" ]]; then
        # shellcheck disable=SC2206  # a command line, split on spaces on purpose
        select=(${wl_cmd[$w]})
    fi
    local perf_pid="" perf_out="$work/perf.$w.$round.$target" split0=""
    if [[ "${SYSCALLS:-0}" == 1 && -n "$ppid" ]]; then
        split0="$(cpu_split "$ppid")"
        perf stat -x, -e "$sys_events" -p "$ppid" -o "$perf_out" &
        perf_pid=$!
    fi
    # shellcheck disable=SC2086  # wl_args holds several options
    redis-benchmark -h 127.0.0.1 -p "$port" "${mode[@]}" -n "$n" ${wl_args[$w]} --csv "${select[@]}" \
        >"$out" 2>"$err" </dev/null || rc=$?
    r1="$(sum_ticks "${rpids[@]}")"
    [[ -n "$ppid" ]] && p1="$(cpu_ticks "$ppid")"
    if [[ -n "$perf_pid" ]]; then
        kill -INT "$perf_pid"
        wait "$perf_pid" || true
        # perf -x, lines: count,unit,event,...; an event it could not count reads "<not counted>".
        awk -F, -v w="$w" -v round="$round" -v target="$target" -v req="$requests" \
            -v reads="$sys_reads" -v writes="$sys_writes" -v waits="$sys_waits" \
            -v split0="$split0" -v split1="$(cpu_split "$ppid")" '
            BEGIN {
                split(reads, a, " "); for (i in a) col["syscalls:sys_enter_" a[i]] = "r"
                split(writes, a, " "); for (i in a) col["syscalls:sys_enter_" a[i]] = "w"
                split(waits, a, " "); for (i in a) col["syscalls:sys_enter_" a[i]] = "e"
            }
            $3 == "raw_syscalls:sys_enter" { all = $1 + 0 }
            $3 in col { n[col[$3]] += $1 + 0 }
            END {
                split(split0, s0, " "); split(split1, s1, " ")
                printf "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", w, round, target, req,
                    all, n["r"], n["w"], n["e"], s1[1] - s0[1], s1[2] - s0[2]
            }' "$perf_out" >>"$syscalls_tsv"
    fi

    # Anything unexpected: a non-zero exit (redis-benchmark 7 exits at the first error reply),
    # non-CSV stdout, stderr other than the CONFIG warning twemproxy causes (no CONFIG there).
    # `--cluster` prints the primaries it found ("Cluster has 3 master nodes:", "Master 0: …").
    local nerr banner='^$|^Cluster has [0-9]+ master nodes:|^Master [0-9]+: '
    nerr="$(grep -v '^"' "$out" | grep -Evc "$banner" || true)"
    if ((rc != 0)) || ((nerr > 0)) || grep -qv 'Could not fetch server CONFIG' "$err"; then
        {
            echo "== $w round $round $target: exit $rc, $nerr non-CSV stdout lines"
            grep -v '^"' "$out" | grep -Ev "$banner" | sort | uniq -c | sort -rn | head -n 5 || true
            grep -v 'Could not fetch server CONFIG' "$err" | head -n 5 || true
        } >>"$errors_log"
    fi

    awk -F, -v w="$w" -v round="$round" -v target="$target" -v n="$n" -v req="$requests" \
        -v rcpu="$((r1 - r0))" -v pcpu="$((p1 - p0))" -v tck="$clk_tck" \
        -v hasproxy="$([[ -n "$ppid" ]] && echo 1 || echo 0)" -v nerr="$nerr" \
        -v name="${wl_cmd[$w]:+${wl_tests[$w]}}" '
        function unq(s) { gsub(/"/, "", s); return s }
        /^"test"/ || !/^"/ { next }
        {
            rc = rcpu * 1e6 / tck / req
            pc = hasproxy ? sprintf("%.2f", pcpu * 1e6 / tck / req) : "-"
            printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\n", w, round, target,
                (name != "" ? name : unq($1)), n, unq($2), unq($5), unq($7), rc, pc, nerr
        }' "$out" >>"$results"
    local got
    got="$(awk -F'\t' -v w="$w" -v r="$round" -v t="$target" \
        '$1 == w && $2 == r && $3 == t { printf "%s=%s ", $4, $6 }' "$results")"
    log "$w round $round $target: ${got:-NO RESULT (exit $rc)}"
}

for w in $WORKLOADS; do
    log "workload $w: redis-benchmark -t ${wl_tests[$w]} -n ${wl_n[$w]} ${wl_args[$w]}"
    if is_cluster_workload "$w"; then
        for p in "${cluster_ports[@]}"; do
            redis-cli -h 127.0.0.1 -p "$p" flushall >/dev/null
        done
    else
        redis-cli -h 127.0.0.1 -p "$redis_port" flushall >/dev/null
    fi
    read -r -a wt <<<"$(targets_of "$w")"
    for round in $(seq 1 "$ROUNDS"); do
        nt=${#wt[@]}
        for i in $(seq 0 $((nt - 1))); do
            run_one "$w" "$round" "${wt[$(((i + round - 1) % nt))]}"
        done
    done
done

# --- Report -----------------------------------------------------------------------------------
report="$work/report.md"
awk -F'\t' -v targets="${targets[*]}" -v workloads="$WORKLOADS" -v rounds="$ROUNDS" \
    -v cluster_workloads="$CLUSTER_WORKLOADS" -v cluster_targets="${cluster_targets[*]}" '
function sort_nums(a, k,    i, j, t) {
    for (i = 2; i <= k; i++) {
        t = a[i]
        for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]
        a[j + 1] = t
    }
}
# Median, min and max of a space-separated list of numbers ("" when empty).
function stats(list,    a, k) {
    k = split(list, a, " ")
    if (k == 0) return ""
    sort_nums(a, k)
    S_MIN = a[1]; S_MAX = a[k]
    S_MED = (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    return S_MED
}
function add(arr, key, v) { arr[key] = (key in arr) ? arr[key] " " v : v }
# The comparison at a glance, for the standalone workloads (cluster = 0) or the cluster ones:
# a row per workload, a column per target other than direct, each cell "throughput ratio /
# cpu-ratio", then the CPU each proxy spent per request. cpu-ratio = direct Redis CPU per request
# / (proxy + Redis CPU per request behind it), per round, median: the steadier figure on a
# shared machine, since it does not depend on how the scheduler split the cores in that run.
function compact(cluster,    i, w, nt, T, j, t, r, ratio, cr, pc, line, uline, head, sep, any) {
    nt = split(cluster ? cluster_targets : targets, T, " ")
    head = "| workload |"; sep = "|---|"
    for (j = 2; j <= nt; j++) { head = head " " T[j] " |"; sep = sep "---|" }
    any = 0
    for (i = 1; i <= nw; i++) {
        w = W[i]
        if ((w in CW) != cluster) continue
        if (!any) {
            print "## " (cluster ? "Cluster: " : "") "throughput ratio / cpu-ratio (median of rounds)"
            print ""
            print head; print sep
            any = 1
        }
        line = "| " w " |"; uline[w] = "| " w " |"
        for (j = 2; j <= nt; j++) {
            t = T[j]; ratio = ""; cr = ""; pc = ""
            for (r = 1; r <= rounds; r++) {
                if (!((w, r, t) in TIME) || !((w, r, "direct") in TIME)) continue
                if (TIME[w, r, t] <= 0 || TIME[w, r, "direct"] <= 0) continue
                ratio = ratio " " (REQ[w, r, t] / TIME[w, r, t]) / (REQ[w, r, "direct"] / TIME[w, r, "direct"])
                if (PCPU[w, r, t] != "-" && PCPU[w, r, t] + RCPU[w, r, t] > 0) {
                    cr = cr " " RCPU[w, r, "direct"] / (PCPU[w, r, t] + RCPU[w, r, t])
                    pc = pc " " PCPU[w, r, t]
                }
            }
            line = line (ratio == "" ? " - /" : sprintf(" %.2f /", stats(ratio)))
            line = line (cr == "" ? " - |" : sprintf(" %.2f |", stats(cr)))
            uline[w] = uline[w] (pc == "" ? " - |" : sprintf(" %.2f |", stats(pc)))
        }
        print line
    }
    if (!any) return
    print ""
    print "Proxy CPU us per request (median of rounds):"
    print ""
    print head; print sep
    for (i = 1; i <= nw; i++) if ((W[i] in CW) == cluster) print uline[W[i]]
    print ""
}
{
    w = $1; r = $2; t = $3; test = $4; n = $5; rps = $6
    if (!(w SUBSEP test in seen_test)) {
        seen_test[w SUBSEP test] = 1
        tests[w] = (w in tests) ? tests[w] " " test : test
    }
    RPS[w, r, t, test] = rps
    add(P50, w SUBSEP t SUBSEP test, $7)
    add(P99, w SUBSEP t SUBSEP test, $8)
    # Workload-level rate per round: requests / time, summed over the tests.
    TIME[w, r, t] += n / rps; REQ[w, r, t] += n
    RCPU[w, r, t] = $9; PCPU[w, r, t] = $10; ERR[w, r, t] += $11
}
END {
    nw = split(workloads, W, " ")
    split(cluster_workloads, CWL, " ")
    for (i in CWL) CW[CWL[i]] = 1
    print "## Per workload (all its tests together)"
    print ""
    print "| workload | target | ops/s (median) | vs direct: median (min-max) | redis CPU us/req | proxy CPU us/req | error lines |"
    print "|---|---|---:|---:|---:|---:|---:|"
    summary = "summary:"
    for (i = 1; i <= nw; i++) {
        w = W[i]
        nt = split((w in CW) ? cluster_targets : targets, T, " ")
        summary = summary " " w
        for (j = 1; j <= nt; j++) {
            t = T[j]; ops = ""; ratio = ""; rc = ""; pc = ""; errs = 0
            for (r = 1; r <= rounds; r++) {
                if ((w, r, t) in TIME && TIME[w, r, t] > 0) {
                    v = REQ[w, r, t] / TIME[w, r, t]
                    ops = ops " " v
                    if ((w, r, "direct") in TIME && TIME[w, r, "direct"] > 0)
                        ratio = ratio " " v / (REQ[w, r, "direct"] / TIME[w, r, "direct"])
                    rc = rc " " RCPU[w, r, t]
                    if (PCPU[w, r, t] != "-") pc = pc " " PCPU[w, r, t]
                    errs += ERR[w, r, t]
                }
            }
            if (ops == "") { printf "| %s | %s | FAILED | | | | |\n", w, t; continue }
            m_ops = stats(ops)
            m_ratio = stats(ratio); lo = S_MIN; hi = S_MAX
            m_rc = stats(rc)
            m_pc = (pc == "") ? "-" : sprintf("%.2f", stats(pc))
            printf "| %s | %s | %.0f | %.2f (%.2f-%.2f) | %.2f | %s | %d |\n", w, t, m_ops,
                m_ratio, lo, hi, m_rc, m_pc, errs
            if (t != "direct") summary = summary sprintf(" %s/direct=%.2f", t, m_ratio)
        }
    }
    print ""
    compact(0)
    compact(1)
    print "## Per test"
    print ""
    print "| workload | test | target | ops/s (median) | vs direct: median (min-max) | p50 ms | p99 ms |"
    print "|---|---|---|---:|---:|---:|---:|"
    for (i = 1; i <= nw; i++) {
        w = W[i]; ntest = split(tests[w], X, " ")
        nt = split((w in CW) ? cluster_targets : targets, T, " ")
        for (x = 1; x <= ntest; x++) {
            test = X[x]
            for (j = 1; j <= nt; j++) {
                t = T[j]; ops = ""; ratio = ""
                for (r = 1; r <= rounds; r++) {
                    if ((w, r, t, test) in RPS) {
                        ops = ops " " RPS[w, r, t, test]
                        if ((w, r, "direct", test) in RPS && RPS[w, r, "direct", test] > 0)
                            ratio = ratio " " RPS[w, r, t, test] / RPS[w, r, "direct", test]
                    }
                }
                if (ops == "") { printf "| %s | %s | %s | FAILED | | | |\n", w, test, t; continue }
                m_ops = stats(ops); m_ratio = stats(ratio); lo = S_MIN; hi = S_MAX
                printf "| %s | %s | %s | %.0f | %.2f (%.2f-%.2f) | %.3f | %.3f |\n", w, test, t,
                    m_ops, m_ratio, lo, hi, stats(P50[w, t, test]), stats(P99[w, t, test])
            }
        }
    }
    print ""
    print summary
}' "$results" >"$report"

echo
echo "# redis-policy-proxy benchmark"
echo
echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, redis $(redis-server --version | awk '{print $3}')," \
    "rounds=$ROUNDS quick=$QUICK pin=$PIN. CPU = utime+stime of the server process per request," \
    "in microseconds (1 tick = $((1000000 / clk_tck)) us); the benchmark client's own CPU is not counted."
echo
cat "$report"
if [[ -s "$syscalls_tsv" ]]; then
    echo
    echo "## Per request, each proxy process (SYSCALLS=1, median of rounds)"
    echo
    echo "| workload | target | syscalls | reads | writes | epoll waits | other | user CPU us | kernel CPU us |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' -v tck="$clk_tck" '
        function med(list,    a, k, i, j, t) {
            k = split(list, a, " ")
            for (i = 2; i <= k; i++) {
                t = a[i]
                for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]
                a[j + 1] = t
            }
            return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
        }
        function add(key, v) { L[key] = (key in L) ? L[key] " " v : v }
        {
            key = $1 "\t" $3
            if (!(key in seen)) { seen[key] = 1; order[++n] = key }
            add(key SUBSEP "all", $5 / $4); add(key SUBSEP "r", $6 / $4)
            add(key SUBSEP "w", $7 / $4); add(key SUBSEP "e", $8 / $4)
            add(key SUBSEP "o", ($5 - $6 - $7 - $8) / $4)
            add(key SUBSEP "u", $9 * 1e6 / tck / $4); add(key SUBSEP "s", $10 * 1e6 / tck / $4)
        }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]; split(k, wt, "\t")
                printf "| %s | %s | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f | %.2f |\n", wt[1], wt[2],
                    med(L[k SUBSEP "all"]), med(L[k SUBSEP "r"]), med(L[k SUBSEP "w"]),
                    med(L[k SUBSEP "e"]), med(L[k SUBSEP "o"]), med(L[k SUBSEP "u"]),
                    med(L[k SUBSEP "s"])
            }
        }' "$syscalls_tsv"
fi
if [[ -s "$errors_log" ]]; then
    echo
    echo "Unexpected output from redis-benchmark (first lines per run):"
    cat "$errors_log"
fi
for name in proxy-audit proxy-insight; do
    [[ -f "$work/$name.jsonl" ]] || continue
    echo
    echo "$name audit trail: $(wc -l <"$work/$name.jsonl") entries in the current file, $(du -ch "$work/$name".jsonl* | tail -n 1 | cut -f1) in all"
done
for name in proxy-passthrough proxy-default proxy-audit proxy-insight proxy-cluster base-cluster; do
    [[ -f "$work/$name.log" ]] || continue
    if grep -qiE 'warn|error' "$work/$name.log"; then
        echo
        echo "$name log warnings/errors:"
        grep -iE 'warn|error' "$work/$name.log" | sort | uniq -c | sort -rn | head -n 10
    fi
done
