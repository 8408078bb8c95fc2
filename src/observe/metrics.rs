//! Prometheus metrics. Every handle is registered once at start and stored here, so a command
//! pays a few relaxed atomic adds (no label lookup, no lock); the policy's per-rule counters
//! live in the engine and are read at scrape time ([`PolicyCollector`], through the
//! [`PolicyCounters`] trait, so this module, which every other one holds, knows nothing of
//! the policy's types).
//!
//! Labels are bounded by construction: command classes and outcomes are fixed lists, rules and
//! tenants come from the policy file. Nothing is ever labelled by key or client address.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Metric, Registry};
use tokio::time::Instant;

use crate::commands::{AclCategories as A, CommandSpec};
use crate::observe::procfs::ProcessStats;

/// Command classes: Redis's command groups, told apart by ACL category.
pub(crate) const CLASSES: [&str; 18] = [
    "string",
    "hash",
    "list",
    "set",
    "sorted_set",
    "stream",
    "pubsub",
    "transactions",
    "scripting",
    "connection",
    "server",
    "generic",
    "geo",
    "hyperloglog",
    "bitmap",
    "cluster",
    "other",
    "unknown",
];

/// What happened to a command at the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandOutcome {
    /// Sent upstream as the client wrote it.
    Forwarded,
    /// Sent upstream as the policy rewrote it.
    Rewritten,
    /// Answered with a policy (or protocol-state) error.
    Refused,
    /// Answered by the proxy itself (HELLO, CLIENT ID, QUIT…).
    Local,
}

const OUTCOME_NAMES: [&str; 4] = ["forwarded", "rewritten", "refused", "local"];

/// Index into [`CLASSES`] for a command; `None` (unknown to the table) is `unknown`.
pub fn class_of(spec: Option<&CommandSpec>) -> usize {
    let Some(spec) = spec else {
        return CLASSES.len() - 1;
    };
    let c = spec.acl_categories;
    // The commonest commands first (GET, SET, INCR…): @string and none of the categories
    // the walk below puts before it, which is where the walk would stop too. It cost 45
    // instructions per command, 2% of the proxy's at `-P 16` (callgrind).
    let before_string = A::GEO
        .union(A::HYPERLOGLOG)
        .union(A::BITMAP)
        .union(A::STREAM)
        .union(A::HASH)
        .union(A::LIST)
        .union(A::SORTEDSET)
        .union(A::SET);
    if c.contains(A::STRING) && !c.intersects(before_string) {
        return 0;
    }
    class_by_walk(spec)
}

/// [`class_of`] of a known command, by its categories in order.
fn class_by_walk(spec: &CommandSpec) -> usize {
    let c = spec.acl_categories;
    // Type categories first (GEO commands are also @sortedset, BITFIELD also @string…), then
    // the categories of commands that touch no data type.
    let order: [(A, usize); 15] = [
        (A::GEO, 12),
        (A::HYPERLOGLOG, 13),
        (A::BITMAP, 14),
        (A::STREAM, 5),
        (A::HASH, 1),
        (A::LIST, 2),
        (A::SORTEDSET, 4),
        (A::SET, 3),
        (A::STRING, 0),
        (A::PUBSUB, 6),
        (A::TRANSACTION, 7),
        (A::SCRIPTING, 8),
        (A::CONNECTION, 9),
        (A::KEYSPACE, 11),
        (A::ADMIN, 10),
    ];
    for (category, class) in order {
        if c.contains(category) {
            return class;
        }
    }
    if spec.name.starts_with("cluster") || matches!(spec.name, "readonly" | "readwrite" | "asking")
    {
        15
    } else if c.contains(A::DANGEROUS) || spec.name.contains('|') {
        10
    } else {
        16
    }
}

/// Histogram bucket bounds, in microseconds: 50 µs to 10 s, for a proxy whose commands take
/// tens of microseconds on loopback and whose slow tail is an upstream in trouble.
const BUCKETS_US: [u64; 17] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A latency histogram of plain atomics: `observe_n` is three relaxed adds, where the
/// library's histogram takes a lock per observation. Buckets are cumulated when scraped.
/// Clones share the counts (one is registered, the other observed).
#[derive(Debug, Default, Clone)]
pub struct LatencyHistogram {
    cells: Arc<HistogramCells>,
}

#[derive(Debug, Default)]
struct HistogramCells {
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    /// Sum of observations, in nanoseconds.
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl LatencyHistogram {
    /// Records `n` observations of `d` (the commands of one batch share its latency).
    pub fn observe_n(&self, d: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let c = &*self.cells;
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_US.partition_point(|&b| b < us);
        c.buckets[i].fetch_add(n, Ordering::Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        c.sum_ns.fetch_add(ns.saturating_mul(n), Ordering::Relaxed);
        c.count.fetch_add(n, Ordering::Relaxed);
    }
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let mut buckets: Vec<(f64, u64)> = BUCKETS_US
            .iter()
            .map(|&us| us as f64 / 1e6)
            .chain([f64::MAX])
            .zip(&self.cells.buckets)
            .map(|(bound, n)| (bound, n.load(Ordering::Relaxed)))
            .collect();
        // The count is read after the buckets, so it is never below their total.
        let total: u64 = buckets.iter().map(|b| b.1).sum();
        let count = self.cells.count.load(Ordering::Relaxed).max(total);
        if let Some(last) = buckets.last_mut() {
            last.1 += count - total;
        }
        let sum = self.cells.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Every metric of one proxy instance (tests run several in one process, so nothing is
/// global).
#[derive(Debug)]
pub struct Metrics {
    /// What `/metrics` renders: the proxy's own metrics, under the `rpp_` prefix.
    registry: Registry,
    /// The standard `process_*` metrics, unprefixed as every Prometheus client library
    /// names them, so generic dashboards and alerts find them.
    process: Registry,
    /// `commands[class][outcome]`, pre-registered for every pair.
    commands: Vec<[Counter; 4]>,
    /// Client-observed latency of forwarded commands: read to reply ready.
    pub request_duration: LatencyHistogram,
    /// Round trip of each upstream batch: written to last reply read.
    pub(crate) upstream_duration: LatencyHistogram,
    /// Upstream connections established now: the shared ones and each node's control
    /// connection (standalone readiness means at least one is up).
    pub(crate) upstream_connections: Gauge,
    /// Dedicated upstream connections connected, logged in and waiting in the warm stock.
    pub(crate) upstream_dedicated_ready: Gauge,
    /// By upstream node (its address): 1 while the latest login of the proxy's there was
    /// refused, 0 once one is accepted (`upstream::credentials`); a series per node from its
    /// pool's start. Connections logged in earlier keep serving meanwhile, so the connection
    /// gauge alone does not show it.
    pub(crate) upstream_credentials_refused: Family<UpstreamLabels, Gauge>,
    /// The nodes whose latest login was refused, all together (INFO's
    /// `proxy_upstream_credentials_refused`); not exported itself.
    pub(crate) upstream_credentials_refused_nodes: Gauge,
    /// Shared upstream connections re-established after a loss.
    pub(crate) upstream_reconnects: Counter,
    /// Failed attempts to connect (and handshake) upstream.
    pub upstream_connect_errors: Counter,
    /// Established upstream connections lost.
    pub(crate) upstream_lost: Counter,
    /// Error replies Redis sent (forwarded to clients).
    pub(crate) upstream_error_replies: Counter,
    /// Commands that got no dedicated connection because their tenant held its whole share
    /// (`upstream.dedicated_caps`), and because the node's `dedicated_max` was reached.
    pub(crate) dedicated_refused: [Counter; 2],
    /// RESP3 pushes that arrived on a shared connection, where nothing subscribes or tracks:
    /// dropped, never matched to a client's request (`upstream::stray`). Above 0 means a
    /// `CLIENT TRACKING … REDIRECT` names a shared connection.
    pub(crate) upstream_stray_pushes: Counter,
    /// Cluster redirections followed, by kind (cluster mode).
    pub(crate) redirections_moved: Counter,
    /// See `redirections_moved`.
    pub(crate) redirections_ask: Counter,
    /// Cluster slot map refreshes that found a new map, by outcome: how often the topology
    /// changes under the proxy (resharding, failover) and whether the nodes answer.
    pub(crate) map_refreshes_changed: Counter,
    /// Refreshes that found the map as it was.
    pub(crate) map_refreshes_unchanged: Counter,
    /// Refreshes that reached no node (the map in use stays).
    pub(crate) map_refreshes_failed: Counter,
    /// Commands sent to a cluster replica (`read_from: replica | nearest`), so an operator
    /// sees how much read load the replicas take.
    pub(crate) replica_reads: Counter,
    /// Clients connected now.
    pub(crate) clients: Gauge,
    /// Clients accepted since start.
    pub(crate) clients_total: Counter,
    /// Clients refused at accept (max clients).
    pub(crate) clients_rejected: Counter,
    /// Request bytes read from clients.
    pub(crate) bytes_in: Counter,
    /// Reply bytes written to clients.
    pub(crate) bytes_out: Counter,
    /// Policy reloads that took effect.
    pub reloads_ok: Counter,
    /// Policy reloads refused (the running policy stayed).
    pub reloads_failed: Counter,
    /// Commands slower than the slow log threshold.
    pub(crate) slow_commands: Counter,
    /// Commands the policy denies that a script could still run as the proxy's upstream user
    /// (`upstream.script_acl`); -1 until the first check, so "not checked" is not "none".
    pub(crate) script_acl_open: Gauge,
    /// Client TLS handshakes by outcome ([`TLS_OUTCOMES`]): `ok`, then each reason a client
    /// was closed before its session started.
    pub(crate) tls_handshakes: [Counter; 8],
    /// Reloads of the client TLS files that took effect.
    pub(crate) tls_reloads_ok: Counter,
    /// Reloads of the client TLS files refused (the certificate in use stays).
    pub(crate) tls_reloads_failed: Counter,
    /// Findings of the latest eviction check (`eviction`); -1 before the first.
    pub(crate) eviction_findings: Gauge,
    /// `OOM command not allowed` replies from the upstream, forwarded with the proxy's note.
    pub(crate) oom_replies: Counter,
    /// Reads not sent upstream because an identical one in flight shared its reply
    /// (`upstream.coalesce_reads`).
    pub(crate) coalesced_reads: Counter,
    /// The latest eviction check's report: read by INFO, `/readyz` and every OOM reply, so
    /// it sits with the handles every connection and session already holds.
    pub(crate) memory_report: ArcSwapOption<MemoryReport>,
    /// The user scripts run as (`upstream.script_acl: confine`), installed by `server::serve`
    /// before the upstream starts: every node's dedicated connections log in as it, and like
    /// `memory_report` it sits with the handles every connection already holds.
    pub(crate) script_user: ArcSwapOption<crate::policy::script_user::ScriptUser>,
    /// The upstream server's name, version and learned commands (`server_facts`), for
    /// `INFO proxy` and `/readyz`; empty until first read.
    pub(crate) upstream_server: ArcSwapOption<crate::commands::server_facts::ServerFacts>,
    /// The keyspace statistics, installed by `server::serve` when on; read at scrape time
    /// for the top patterns' metrics.
    pub(crate) keyspace: Arc<arc_swap::ArcSwapOption<crate::observe::keyspace::Keyspace>>,
    /// Routes mode: the route table, installed by `server::serve`; its per-route command
    /// counts are read at scrape time (`route_commands_total`).
    pub(crate) routes: Arc<ArcSwapOption<crate::topology::routes::RouteTable>>,
    /// The mirror's counters (`mirror:`, docs/migration.md); at 0 while nothing mirrors.
    pub(crate) mirror: MirrorMetrics,
    /// Audit entries written by the writer thread.
    pub(crate) audit_written: Counter,
    /// Audit entries dropped because the writer's queue was full: the trail has gaps, the
    /// clients were not slowed.
    pub(crate) audit_dropped: Counter,
    /// Audit entries the writer could not write (disk full, file removed…).
    pub(crate) audit_failed: Counter,
    /// For uptime in INFO.
    pub(crate) started: Instant,
}

/// What `/metrics` reads of the running policy at each scrape (`rpp_policy_info`,
/// `rpp_policy_decisions_total`). `policy::Policy` implements it (in `ops`); defined here so
/// the metrics do not depend on the policy, which depends on modules that count in them.
pub trait PolicyCounters: std::fmt::Debug + Send + Sync + 'static {
    /// The policy file's version (a hash of its text).
    fn version(&self) -> &str;
    /// Calls `f(rule, tenant, outcome, count)` for every non-zero counter.
    fn for_each_counter(&self, f: &mut dyn FnMut(&str, &str, &str, u64));
}

/// The policy of metrics made without one (tests, tools): version `none`, no counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoPolicy;

impl PolicyCounters for NoPolicy {
    fn version(&self) -> &str {
        "none"
    }

    fn for_each_counter(&self, _: &mut dyn FnMut(&str, &str, &str, u64)) {}
}

/// What the latest eviction check found, in the form each reader needs.
#[derive(Debug, Default, Clone)]
pub(crate) struct MemoryReport {
    /// Appended to an upstream `-OOM` error: the upstream's memory state and the policy.
    pub(crate) oom_note: String,
    /// `field:value` lines for INFO's `# Proxy` section.
    pub(crate) info: String,
    /// One line for the log and `/readyz`.
    pub(crate) summary: String,
}

/// What the mirror did with the commands it was offered: the numbers an operator watches
/// before switching a migration over (docs/migration.md).
#[derive(Debug, Default)]
pub(crate) struct MirrorMetrics {
    /// 1 for the migration's phase now (`off`, `writes`, `compare`), 0 for the others.
    pub(crate) phase: [Gauge; 3],
    /// Commands sent to the mirror: `[writes, reads compared]`.
    pub(crate) sent: [Counter; 2],
    /// Writes the mirror did not get: `[queue_full, unavailable, unknown_outcome]` (its queue
    /// held `max_queue_bytes`; its connection was down or full; the primary's reply never
    /// came, so whether the write ran is unknown). Each one may leave the mirror behind.
    pub(crate) dropped: [Counter; 3],
    /// Commands the mirror is never sent: blocking commands with no non-blocking form, and
    /// the like (docs/migration.md says which).
    pub(crate) skipped: Counter,
    /// Writes the primary acknowledged that the mirror refused with an error.
    pub(crate) errors: Counter,
    /// Reads whose replies were compared.
    pub(crate) compared: Counter,
    /// Compared reads whose replies differed, by command and key prefix (the key's name up
    /// to its first `:`, the first 50 prefixes seen, later ones as `(other)`).
    pub(crate) divergent: Family<UpstreamLabels, Counter>,
    /// `divergent`, every command and prefix together (INFO; not exported itself).
    pub(crate) divergent_all: Counter,
}

/// `phase` labels of `rpp_mirror_phase`, in [`MirrorMetrics::phase`]'s order.
pub(crate) const MIRROR_PHASES: [&str; 3] = ["off", "writes", "compare"];

impl MirrorMetrics {
    /// Shows `phase` (one of [`MIRROR_PHASES`]) as the current one.
    pub(crate) fn set_phase(&self, phase: &str) {
        for (gauge, name) in self.phase.iter().zip(MIRROR_PHASES) {
            gauge.set(i64::from(name == phase));
        }
    }

    /// The current phase's name.
    pub(crate) fn phase(&self) -> &'static str {
        self.phase
            .iter()
            .zip(MIRROR_PHASES)
            .find(|(g, _)| g.get() == 1)
            .map_or("off", |(_, name)| name)
    }

    /// Counts one divergence of `command` on keys with `prefix`.
    pub(crate) fn diverged(&self, command: &'static str, prefix: String) {
        self.divergent
            .get_or_create(&vec![("command", command.to_string()), ("prefix", prefix)])
            .inc();
        self.divergent_all.inc();
    }
}

/// `outcome` labels of `rpp_tls_handshakes_total`: `ok`, then `listen::Refusal::ALL`'s.
pub(crate) const TLS_OUTCOMES: [&str; 8] = [
    "ok",
    "plaintext",
    "untrusted",
    "expired",
    "no_certificate",
    "timeout",
    "failed",
    "closed",
];

type Labels = Vec<(&'static str, &'static str)>;

/// The label of a per-node series: `upstream`, the node's address (bounded by the nodes the
/// proxy connects to).
pub(crate) type UpstreamLabels = Vec<(&'static str, String)>;

/// Registers a clone of `metric`: clones share their value, so the handle kept in [`Metrics`]
/// counts what `/metrics` renders.
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: &M) {
    registry.register(name, help, metric.clone());
}

/// Registers a counter family with one label and returns a handle for each of its `values`,
/// created up front: the family's series exist (at 0) from the first scrape, and counting
/// needs no label lookup.
fn labelled<const N: usize>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: [&'static str; N],
) -> [Counter; N] {
    let family = Family::<Labels, Counter>::default();
    registry.register(name, help, family.clone());
    values.map(|v| family.get_or_create(&vec![(label, v)]).clone())
}

impl Metrics {
    /// Registers every metric; `policy` is read at each scrape for the per-rule counters.
    /// Families are registered in a fixed order, which is the order `/metrics` renders them in.
    pub fn new<P: PolicyCounters>(policy: Arc<ArcSwap<P>>) -> Arc<Metrics> {
        let mut m = Metrics::unregistered();
        m.register_commands();
        m.register_latencies();
        m.register_upstream();
        m.register_cluster();
        m.register_clients();
        m.register_operations();
        m.register_tls();
        m.register_memory();
        m.register_mirror();
        m.registry
            .register_collector(Box::new(PolicyCollector { policy }));
        m.registry
            .register_collector(Box::new(crate::observe::keyspace::KeyspaceCollector {
                keyspace: m.keyspace.clone(),
            }));
        m.registry.register_collector(Box::new(RoutesCollector {
            routes: m.routes.clone(),
        }));
        m.registry.register_collector(Box::new(WorkersCollector));
        m.process.register_collector(Box::new(ProcessCollector {
            started: std::time::SystemTime::now(),
        }));
        Arc::new(m)
    }

    /// Every handle, none registered yet: the `register_*` functions register each one (a
    /// labelled family's handles are replaced by the family's own).
    fn unregistered() -> Metrics {
        Metrics {
            registry: Registry::with_prefix("rpp"),
            process: Registry::default(),
            commands: Vec::new(),
            request_duration: LatencyHistogram::default(),
            upstream_duration: LatencyHistogram::default(),
            upstream_connections: Gauge::default(),
            upstream_dedicated_ready: Gauge::default(),
            upstream_credentials_refused: Family::default(),
            upstream_credentials_refused_nodes: Gauge::default(),
            upstream_reconnects: Counter::default(),
            upstream_connect_errors: Counter::default(),
            upstream_lost: Counter::default(),
            upstream_error_replies: Counter::default(),
            redirections_moved: Counter::default(),
            redirections_ask: Counter::default(),
            map_refreshes_changed: Counter::default(),
            map_refreshes_unchanged: Counter::default(),
            map_refreshes_failed: Counter::default(),
            replica_reads: Counter::default(),
            clients: Gauge::default(),
            clients_total: Counter::default(),
            clients_rejected: Counter::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            reloads_ok: Counter::default(),
            reloads_failed: Counter::default(),
            slow_commands: Counter::default(),
            script_acl_open: {
                let g = Gauge::default();
                g.set(-1);
                g
            },
            eviction_findings: {
                let g = Gauge::default();
                g.set(-1);
                g
            },
            oom_replies: Counter::default(),
            coalesced_reads: Counter::default(),
            upstream_stray_pushes: Counter::default(),
            dedicated_refused: Default::default(),
            memory_report: ArcSwapOption::empty(),
            script_user: ArcSwapOption::empty(),
            upstream_server: ArcSwapOption::empty(),
            tls_handshakes: Default::default(),
            tls_reloads_ok: Counter::default(),
            tls_reloads_failed: Counter::default(),
            keyspace: Default::default(),
            routes: Default::default(),
            mirror: MirrorMetrics::default(),
            audit_written: Counter::default(),
            audit_dropped: Counter::default(),
            audit_failed: Counter::default(),
            started: Instant::now(),
        }
    }

    /// The command counters: one family, every class and outcome pair created up front so a
    /// command indexes an array instead of looking up labels.
    fn register_commands(&mut self) {
        let family = Family::<Labels, Counter>::default();
        self.registry.register(
            "commands",
            "Commands by class (Redis command group) and outcome at the proxy",
            family.clone(),
        );
        self.commands = CLASSES
            .iter()
            .map(|class| {
                OUTCOME_NAMES.map(|outcome| {
                    family
                        .get_or_create(&vec![("class", *class), ("outcome", outcome)])
                        .clone()
                })
            })
            .collect();
    }

    /// The two latency histograms: what clients see, and what the upstream takes.
    fn register_latencies(&mut self) {
        let r = &mut self.registry;
        register(
            r,
            "request_duration_seconds",
            "Client-observed latency of forwarded commands: from reading the command to its reply being ready to write",
            &self.request_duration,
        );
        register(
            r,
            "upstream_duration_seconds",
            "Upstream round trip of each batch of commands",
            &self.upstream_duration,
        );
    }

    /// The upstream connections' health: how many, reconnects, failures, error replies.
    fn register_upstream(&mut self) {
        let r = &mut self.registry;
        register(
            r,
            "upstream_connections",
            "Upstream connections established: the shared ones (one per RESP version and upstream.connections) and the proxy's control connection, per node",
            &self.upstream_connections,
        );
        register(
            r,
            "upstream_dedicated_ready",
            "Dedicated upstream connections connected and waiting in the warm stock",
            &self.upstream_dedicated_ready,
        );
        // A collector, not a registered family: a registry leaves out a family with no series
        // yet (no pool started), and the family must be described on every scrape.
        r.register_collector(Box::new(AlwaysDescribed {
            name: "upstream_credentials_refused",
            help: "1 while the upstream node refuses the proxy's own login (upstream.username / upstream.password), 0 once it accepts it",
            kind: MetricType::Gauge,
            family: self.upstream_credentials_refused.clone(),
        }));
        register(
            r,
            "upstream_reconnects",
            "Shared upstream connections re-established after a loss",
            &self.upstream_reconnects,
        );
        [self.upstream_connect_errors, self.upstream_lost] = labelled(
            r,
            "upstream_errors",
            "Upstream connection failures: connect (connect or handshake failed), lost (an established connection ended)",
            "kind",
            ["connect", "lost"],
        );
        register(
            r,
            "upstream_error_replies",
            "Error replies from Redis, forwarded to clients",
            &self.upstream_error_replies,
        );
        self.dedicated_refused = labelled(
            r,
            "upstream_dedicated_refused",
            "Commands that needed a dedicated upstream connection and got an error instead: tenant (the client's tenant held its share, upstream.dedicated_caps), node (upstream.dedicated_max reached)",
            "limit",
            ["tenant", "node"],
        );
        register(
            r,
            "upstream_stray_pushes",
            "RESP3 pushes that arrived on a shared upstream connection and were dropped instead of being taken for a reply (a CLIENT TRACKING REDIRECT naming a shared connection)",
            &self.upstream_stray_pushes,
        );
    }

    /// Cluster mode: redirections, slot map refreshes, replica reads.
    fn register_cluster(&mut self) {
        let r = &mut self.registry;
        [self.redirections_moved, self.redirections_ask] = labelled(
            r,
            "upstream_redirections",
            "Cluster redirections followed (MOVED, ASK)",
            "kind",
            ["moved", "ask"],
        );
        [
            self.map_refreshes_changed,
            self.map_refreshes_unchanged,
            self.map_refreshes_failed,
        ] = labelled(
            r,
            "cluster_map_refreshes",
            "Cluster slot map refreshes: changed (a new map installed), unchanged, failed (no node answered)",
            "outcome",
            ["changed", "unchanged", "failed"],
        );
        register(
            r,
            "replica_reads",
            "Read-only commands sent to a cluster replica (read_from replica or nearest)",
            &self.replica_reads,
        );
    }

    /// The client side: connections now, accepted, refused, and bytes each way.
    fn register_clients(&mut self) {
        let r = &mut self.registry;
        register(r, "client_connections", "Clients connected", &self.clients);
        // Not `client_connections_total`: a counter family may not share its name with the
        // gauge above, or OpenMetrics parsers reject the whole scrape.
        register(
            r,
            "client_connections_accepted",
            "Clients accepted since start",
            &self.clients_total,
        );
        register(
            r,
            "client_connections_rejected",
            "Clients refused at accept because max_clients was reached",
            &self.clients_rejected,
        );
        // The unit before `_total` (Prometheus naming: `…_received_bytes_total`).
        register(
            r,
            "client_received_bytes",
            "Request bytes read from clients",
            &self.bytes_in,
        );
        register(
            r,
            "client_sent_bytes",
            "Reply bytes written to clients",
            &self.bytes_out,
        );
    }

    /// Client TLS: handshakes by outcome, certificate reloads by result.
    fn register_tls(&mut self) {
        let r = &mut self.registry;
        self.tls_handshakes = labelled(
            r,
            "tls_handshakes",
            "Client TLS connections by outcome: ok, or why the client was closed before its session started (plaintext, untrusted, expired, no_certificate, timeout, failed, closed)",
            "outcome",
            TLS_OUTCOMES,
        );
        [self.tls_reloads_ok, self.tls_reloads_failed] = labelled(
            r,
            "tls_reloads",
            "Reloads of the client TLS certificate, key and CA files by result; a failed one keeps the certificate in use",
            "result",
            ["ok", "failed"],
        );
    }

    /// The eviction check and the OOM replies it explains.
    fn register_memory(&mut self) {
        let r = &mut self.registry;
        register(
            r,
            "eviction_findings",
            "Problems the latest eviction check found with the upstream's maxmemory and maxmemory-policy for its role and the TTL rule; -1 before the first check",
            &self.eviction_findings,
        );
        register(
            r,
            "oom_replies",
            "OOM command not allowed errors from the upstream, forwarded to clients with the proxy's note",
            &self.oom_replies,
        );
        register(
            r,
            "coalesced_reads",
            "Reads answered with the reply of an identical read already in flight on the same shared connection, instead of being sent upstream (upstream.coalesce_reads)",
            &self.coalesced_reads,
        );
    }

    /// The mirror (`mirror:`): phase, what it was sent, dropped and skipped, and the compared
    /// reads.
    fn register_mirror(&mut self) {
        let r = &mut self.registry;
        let m = &mut self.mirror;
        let phase = Family::<Labels, Gauge>::default();
        r.register(
            "mirror_phase",
            "The migration's phase: 1 for the current one (off, writes: writes mirrored, compare: writes mirrored and a share of reads compared)",
            phase.clone(),
        );
        m.phase = MIRROR_PHASES.map(|p| phase.get_or_create(&vec![("phase", p)]).clone());
        m.phase[0].set(1);
        m.sent = labelled(
            r,
            "mirror_commands",
            "Commands sent to the mirror: writes the primary acknowledged, and reads sent to be compared",
            "kind",
            ["write", "read"],
        );
        m.dropped = labelled(
            r,
            "mirror_dropped",
            "Writes not sent to the mirror: its queue was full (max_queue_bytes), its connection was down or full, or the primary's reply never came; each may leave the mirror behind",
            "reason",
            ["queue_full", "unavailable", "unknown_outcome"],
        );
        register(
            r,
            "mirror_skipped",
            "Commands never mirrored by design (blocking commands without a non-blocking form; docs/migration.md)",
            &m.skipped,
        );
        register(
            r,
            "mirror_errors",
            "Writes the primary acknowledged that the mirror answered with an error",
            &m.errors,
        );
        register(
            r,
            "mirror_compared",
            "Reads answered by both servers and compared",
            &m.compared,
        );
        r.register_collector(Box::new(AlwaysDescribed {
            name: "mirror_divergent",
            help: "Compared reads whose replies differed, by command and key prefix",
            kind: MetricType::Counter,
            family: m.divergent.clone(),
        }));
    }

    /// The proxy's own operation: policy reloads and slow commands.
    fn register_operations(&mut self) {
        let r = &mut self.registry;
        [self.reloads_ok, self.reloads_failed] = labelled(
            r,
            "config_reloads",
            "Policy reloads by result; a failed one keeps the running policy",
            "result",
            ["ok", "failed"],
        );
        register(
            r,
            "slow_commands",
            "Commands slower than the slow log threshold",
            &self.slow_commands,
        );
        [self.audit_written, self.audit_dropped, self.audit_failed] = labelled(
            r,
            "audit_entries",
            "Audit trail entries: written, dropped (the writer's queue was full; no client waited), failed (the write failed)",
            "result",
            ["written", "dropped", "failed"],
        );
        register(
            r,
            "script_acl_open_commands",
            "Commands the policy denies that a script could run as the proxy's upstream user (-1: not checked)",
            &self.script_acl_open,
        );
    }

    /// Counts one command of `class` (see [`class_of`]).
    #[inline]
    pub fn command(&self, class: usize, outcome: CommandOutcome) {
        self.commands[class][outcome as usize].inc();
    }

    /// The OpenMetrics text exposition of every metric: the proxy's, then the process's.
    pub fn render(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::with_capacity(16 * 1024);
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &self.process);
        let _ = encode_eof(&mut out);
        out
    }
}

/// Reads the running policy's counters at scrape time: they reset when a reload swaps the
/// policy, which Prometheus's `rate()` and `increase()` handle as counter resets.
#[derive(Debug)]
struct PolicyCollector<P> {
    policy: Arc<ArcSwap<P>>,
}

impl<P: PolicyCounters> Collector for PolicyCollector<P> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let policy = self.policy.load();
        let info = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "policy_info",
            "The running policy: version is a hash of the policy file",
            None,
            MetricType::Gauge,
        )?;
        info.encode(family.encode_family(&[("version", policy.version())])?)?;
        let mut family = encoder.encode_descriptor(
            "policy_decisions",
            "Policy decisions by rule, tenant and outcome (rule \"-\": commands every rule let through unchanged)",
            None,
            MetricType::Counter,
        )?;
        let mut result = Ok(());
        policy.for_each_counter(&mut |rule, tenant, outcome, value| {
            if result.is_err() {
                return;
            }
            let labels = [("rule", rule), ("tenant", tenant), ("outcome", outcome)];
            result = family
                .encode_family(&labels)
                .and_then(|m| ConstCounter::new(value).encode(m));
        });
        result?;
        let build = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "build_info",
            "Version of the proxy binary",
            None,
            MetricType::Gauge,
        )?;
        let labels = [("version", crate::VERSION), ("commit", crate::COMMIT)];
        build.encode(family.encode_family(&labels)?)?;
        Ok(())
    }
}

/// Commands placed per route, read from the route table at scrape time; no samples without
/// routes. Labels are the routes' names from the file (bounded).
#[derive(Debug)]
struct RoutesCollector {
    /// Installed by `server::serve` in routes mode.
    routes: Arc<ArcSwapOption<crate::topology::routes::RouteTable>>,
}

impl Collector for RoutesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // The family is described even without routes (no samples then), so the metrics the
        // proxy can export are the same whatever the configuration.
        let mut family = encoder.encode_descriptor(
            "route_commands",
            "Commands placed on each route (by the route of their first key; keyless ones on default)",
            None,
            MetricType::Counter,
        )?;
        let Some(table) = self.routes.load_full() else {
            return Ok(());
        };
        for (route, count) in table.counts() {
            ConstCounter::new(count).encode(family.encode_family(&[("route", route)])?)?;
        }
        Ok(())
    }
}

/// Sessions per worker thread (`workers: N`), read at scrape time; no samples with one
/// worker. Shows whether the acceptor spreads clients evenly (`operations::workers`).
#[derive(Debug)]
struct WorkersCollector;

impl Collector for WorkersCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "worker_sessions",
            "Client sessions running on each worker thread now (workers: N > 1)",
            None,
            MetricType::Gauge,
        )?;
        for (worker, n) in crate::operations::workers::sessions()
            .into_iter()
            .enumerate()
        {
            let worker = worker.to_string();
            ConstGauge::new(n as i64)
                .encode(family.encode_family(&[("worker", worker.as_str())])?)?;
        }
        Ok(())
    }
}

/// A labelled family described on every scrape, also before its first series (a registered
/// family with no series is left out of the exposition, and dashboards and alerts should find
/// the name from the start): `upstream_credentials_refused{upstream}` before any node's pool
/// has started, `mirror_divergent{command,prefix}` before the first divergence.
#[derive(Debug)]
struct AlwaysDescribed<M> {
    /// The name, without the registry's prefix.
    name: &'static str,
    /// The help text.
    help: &'static str,
    /// Its type.
    kind: MetricType,
    /// The series.
    family: Family<UpstreamLabels, M>,
}

impl<M> Collector for AlwaysDescribed<M>
where
    M: EncodeMetric
        + prometheus_client::metrics::TypedMetric
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let metric = encoder.encode_descriptor(self.name, self.help, None, self.kind)?;
        self.family.encode(metric)
    }
}

/// The `process_*` metrics, read from `/proc/self` at each scrape ([`ProcessStats`]).
#[derive(Debug)]
struct ProcessCollector {
    /// The start time where `/proc` cannot give it (see [`ProcessStats::read`]).
    started: std::time::SystemTime,
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read(self.started);
        if let Some(v) = s.cpu_seconds {
            let family = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(v).encode(family)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_memory_bytes.map(|v| v as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_memory_bytes.map(|v| v as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (soft limit)",
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                ConstGauge::new(v).encode(family)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::lookup;

    #[test]
    fn the_string_shortcut_classes_as_the_walk_does() {
        for spec in crate::commands::all_commands() {
            assert_eq!(class_of(Some(spec)), class_by_walk(spec), "{}", spec.name);
        }
    }

    #[test]
    fn classes_follow_redis_command_groups() {
        let class = |name: &str| CLASSES[class_of(lookup(name.as_bytes(), None))];
        assert_eq!(class("get"), "string");
        assert_eq!(class("hset"), "hash");
        assert_eq!(class("zadd"), "sorted_set");
        assert_eq!(class("geoadd"), "geo");
        assert_eq!(class("pfadd"), "hyperloglog");
        assert_eq!(class("setbit"), "bitmap");
        assert_eq!(class("xadd"), "stream");
        assert_eq!(class("subscribe"), "pubsub");
        assert_eq!(class("multi"), "transactions");
        assert_eq!(class("evalsha"), "scripting");
        assert_eq!(class("hello"), "connection");
        assert_eq!(class("del"), "generic");
        assert_eq!(class("flushall"), "generic");
        let config_get = lookup(b"config", Some(b"get"));
        assert_eq!(CLASSES[class_of(config_get)], "server");
        assert_eq!(class("cluster"), "cluster");
        assert_eq!(CLASSES[class_of(None)], "unknown");
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_a_sum_in_seconds() {
        let policy = Arc::new(ArcSwap::from_pointee(NoPolicy));
        let m = Metrics::new(policy);
        m.request_duration.observe_n(Duration::from_micros(70), 3);
        m.request_duration.observe_n(Duration::from_secs(20), 1);
        m.command(0, CommandOutcome::Forwarded);
        let text = m.render();
        assert!(
            text.contains("rpp_request_duration_seconds_count 4\n"),
            "{text}"
        );
        assert!(
            text.contains("rpp_request_duration_seconds_bucket{le=\"0.00005\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("rpp_request_duration_seconds_bucket{le=\"0.0001\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("rpp_request_duration_seconds_bucket{le=\"+Inf\"} 4\n"),
            "{text}"
        );
        assert!(
            text.contains("rpp_request_duration_seconds_sum 20.00021"),
            "{text}"
        );
        assert!(
            text.contains("rpp_commands_total{class=\"string\",outcome=\"forwarded\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("rpp_build_info{version="), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_have_their_standard_unprefixed_names() {
        let policy = Arc::new(ArcSwap::from_pointee(NoPolicy));
        let text = Metrics::new(policy).render();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(name)),
                "{name}missing:\n{text}"
            );
        }
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(!text.contains("rpp_process_"), "{text}");
        assert!(text.contains("rpp_client_received_bytes_total 0"), "{text}");
    }
}
