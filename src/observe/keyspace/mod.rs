//! The key-pattern report: in-line, sampled statistics per tenant and key pattern (commands,
//! bytes in and out, writes without a TTL, value sizes) and the hot keys of the last minute.
//! Served as `PROXY KEYSPACE`, on the admin endpoint as `/keyspace` (JSON), and as metrics for
//! the top patterns only (never a raw key as a label).
//!
//! Bounded: at most `keyspace.max_patterns` (tenant, pattern) pairs are tracked (later ones
//! count under `(other)`), the hot-key sketch has a fixed size (`hot`), and a sampled command
//! costs one lock and its key names' patterns. Off (`sample: 0`, the default), `Ops::keyspace`
//! is `None` and a command pays one branch.

pub(crate) mod hot;
pub(crate) mod pattern;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::commands::CommandSpec;
use crate::config::KeyspaceConfig;

/// The statistics of one (tenant, pattern).
#[derive(Debug, Default, Clone)]
struct Stats {
    /// Commands naming a key of the pattern (estimated: sampled ones × the sample rate).
    commands: u64,
    /// Request bytes of those commands (a command of several patterns splits its bytes).
    bytes_in: u64,
    /// Reply bytes of those commands.
    bytes_out: u64,
    /// Of `commands`, the writes.
    writes: u64,
    /// Of `writes`, those that set no TTL (and were not given one by the policy).
    writes_without_ttl: u64,
    /// Writes by the size of the largest value they carry (`pattern::BUCKETS`).
    sizes: [u64; pattern::BUCKET_NAMES.len()],
}

/// What the locked part holds.
struct State {
    /// By tenant, then pattern: looked up by `&str`, so counting a known pattern allocates
    /// nothing. At most `max_patterns` pairs besides the `(other)` ones.
    patterns: HashMap<String, HashMap<String, Stats>>,
    /// Pairs in `patterns`.
    pairs: usize,
    /// Where a count would go if a pattern just inserted were not found (it cannot be), so
    /// counting has no panicking path.
    scratch: Stats,
    /// The hot-key sketch.
    hot: hot::HotKeys,
}

/// What a sampled command contributes, measured where it is decided (its arguments are at
/// hand) and counted once it is forwarded.
#[derive(Debug, Clone)]
pub(crate) struct Measured {
    /// The client's tenant.
    tenant: String,
    /// The distinct patterns of its keys.
    patterns: Vec<String>,
    /// Its key names, for the hot keys.
    keys: Vec<Vec<u8>>,
    /// A write (Redis's `write` flag).
    write: bool,
    /// A write that sets no TTL and gets none from the policy.
    without_ttl: bool,
    /// The size of its largest argument that is not a key (the value, for writes).
    value: usize,
    /// Its length as the client sent it.
    request_bytes: usize,
}

/// A sampled command's patterns, kept until its reply so the reply's bytes count for them.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    /// The client's tenant.
    tenant: String,
    /// The distinct patterns of its keys.
    patterns: Vec<String>,
}

/// The keyspace statistics of a running proxy.
pub(crate) struct Keyspace {
    /// One keyed command in this many is counted; each counts this many times.
    sample: u64,
    /// `:`-separated segments a pattern keeps.
    segments: usize,
    /// (tenant, pattern) pairs tracked at most.
    max_patterns: usize,
    /// Patterns per tenant reported and exported as metrics.
    top: usize,
    /// Hot keys reported.
    hot_keys: usize,
    /// Keyed commands seen, for the 1-in-N sample.
    seen: AtomicU64,
    /// When counting began: rates are per second since then, hot-key periods count from it.
    started: Instant,
    /// The counts; one lock, taken once per sampled command.
    state: Mutex<State>,
}

/// The pattern for pairs beyond `max_patterns`.
pub(crate) const OTHER: &str = "(other)";

impl Keyspace {
    /// The statistics `config` asks for, or `None` when off (`sample: 0`).
    pub(crate) fn new(config: &KeyspaceConfig) -> Option<Keyspace> {
        let sample = config.sample.value;
        (sample > 0).then(|| Keyspace {
            sample,
            segments: config.segments.value.max(1),
            max_patterns: config.max_patterns.value,
            top: config.top.value,
            hot_keys: config.hot_keys.value,
            seen: AtomicU64::new(0),
            started: Instant::now(),
            state: Mutex::new(State {
                patterns: HashMap::new(),
                pairs: 0,
                scratch: Stats::default(),
                hot: hot::HotKeys::new(config.hot_keys.value),
            }),
        })
    }

    /// Whether this command of `spec` is in the sample: keyed commands only, one in
    /// `sample`. One relaxed atomic add.
    pub(crate) fn wants(&self, spec: Option<&CommandSpec>) -> bool {
        spec.is_some_and(CommandSpec::may_have_keys)
            && (self.sample == 1 || self.seen.fetch_add(1, Ordering::Relaxed) % self.sample == 0)
    }

    /// What a sampled command contributes, read off `args` as the client sent them (name at
    /// 0) with its key arguments at `keys` (`audit::key_indices`): `request_bytes` its
    /// length, `ttl_added` whether the policy gives it a TTL. Pure:
    /// a command decided again (paused) is measured again and counted once (`count`).
    /// `None` when it names no key.
    pub(crate) fn measure(
        &self,
        tenant: &str,
        spec: &CommandSpec,
        args: &[&[u8]],
        keys: &[usize],
        request_bytes: usize,
        ttl_added: bool,
    ) -> Option<Measured> {
        if keys.is_empty() {
            return None;
        }
        let mut patterns: Vec<String> = keys
            .iter()
            .map(|&i| pattern::pattern_of(args[i], self.segments))
            .collect();
        patterns.sort();
        patterns.dedup();
        let write = spec.is_write();
        Some(Measured {
            tenant: tenant.to_string(),
            patterns,
            keys: keys.iter().map(|&i| args[i].to_vec()).collect(),
            write,
            without_ttl: write && !ttl_added && !pattern::sets_ttl(spec.name, args),
            value: (1..args.len())
                .filter(|i| !keys.contains(i))
                .map(|i| args[i].len())
                .max()
                .unwrap_or(0),
            request_bytes,
        })
    }

    /// Counts a measured command that was forwarded; returns its patterns for the reply's
    /// bytes (`answered`).
    pub(crate) fn count(&self, m: Measured) -> Sample {
        let weight = self.sample;
        let share = (m.request_bytes / m.patterns.len().max(1)) as u64;
        let period = self.period();
        let mut patterns = m.patterns;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for p in &mut patterns {
            let s = self.stats(&mut state, &m.tenant, p);
            s.commands += weight;
            s.bytes_in += share * weight;
            if m.write {
                s.writes += weight;
                s.writes_without_ttl += u64::from(m.without_ttl) * weight;
                s.sizes[pattern::size_bucket(m.value)] += weight;
            }
        }
        for key in &m.keys {
            state
                .hot
                .add(key, u32::try_from(weight).unwrap_or(u32::MAX), period);
        }
        Sample {
            tenant: m.tenant,
            patterns,
        }
    }

    /// The reply of a sampled command came back with `bytes`.
    pub(crate) fn answered(&self, sample: &Sample, bytes: usize) {
        let share = (bytes / sample.patterns.len().max(1)) as u64 * self.sample;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tenant) = state.patterns.get_mut(sample.tenant.as_str()) else {
            return;
        };
        for p in &sample.patterns {
            if let Some(s) = tenant.get_mut(p.as_str()) {
                s.bytes_out += share;
            }
        }
    }

    /// The stats of (tenant, pattern), made if there is room; else those of `(other)`, with
    /// `pattern` renamed to it so the reply's bytes find it.
    fn stats<'a>(&self, state: &'a mut State, tenant: &str, pattern: &mut String) -> &'a mut Stats {
        if !state.patterns.contains_key(tenant) {
            state.patterns.insert(tenant.to_string(), HashMap::new());
        }
        let full = state.pairs >= self.max_patterns;
        let Some(patterns) = state.patterns.get_mut(tenant) else {
            return &mut state.scratch;
        };
        if !patterns.contains_key(pattern.as_str()) {
            if full {
                *pattern = OTHER.to_string();
            } else {
                state.pairs += 1;
            }
            if !patterns.contains_key(pattern.as_str()) {
                patterns.insert(pattern.clone(), Stats::default());
            }
        }
        match patterns.get_mut(pattern.as_str()) {
            Some(s) => s,
            None => &mut state.scratch,
        }
    }

    /// The current 10-second period of the hot-key window.
    fn period(&self) -> u64 {
        self.started.elapsed().as_secs() / hot::SLICE.as_secs()
    }

    /// Each tenant's top patterns by commands, highest first.
    fn top_patterns(&self) -> Vec<(String, Vec<(String, Stats)>)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut by_tenant: HashMap<&str, Vec<(String, Stats)>> = HashMap::new();
        for (tenant, patterns) in &state.patterns {
            let rows = by_tenant.entry(tenant).or_default();
            for (pattern, stats) in patterns {
                rows.push((pattern.clone(), stats.clone()));
            }
        }
        let mut out: Vec<(String, Vec<(String, Stats)>)> = by_tenant
            .into_iter()
            .map(|(tenant, mut rows)| {
                rows.sort_by(|a, b| b.1.commands.cmp(&a.1.commands).then_with(|| a.0.cmp(&b.0)));
                rows.truncate(self.top);
                (tenant.to_string(), rows)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The report as JSON: per tenant, the top patterns with their statistics; the hot keys
    /// of the last minute.
    pub(crate) fn report(&self) -> Value {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        let tenants: serde_json::Map<String, Value> = self
            .top_patterns()
            .into_iter()
            .map(|(tenant, rows)| {
                let rows: Vec<Value> = rows
                    .into_iter()
                    .map(|(pattern, s)| {
                        let sizes: serde_json::Map<String, Value> = pattern::BUCKET_NAMES
                            .iter()
                            .zip(s.sizes)
                            .filter(|(_, n)| *n > 0)
                            .map(|(b, n)| (b.to_string(), json!(n)))
                            .collect();
                        json!({
                            "pattern": pattern,
                            "commands": s.commands,
                            "commands_per_second": s.commands as f64 / seconds,
                            "bytes_in": s.bytes_in,
                            "bytes_out": s.bytes_out,
                            "writes": s.writes,
                            "writes_without_ttl": s.writes_without_ttl,
                            "writes_without_ttl_share": match s.writes {
                                0 => 0.0,
                                w => s.writes_without_ttl as f64 / w as f64,
                            },
                            "value_sizes": sizes,
                        })
                    })
                    .collect();
                (tenant, Value::Array(rows))
            })
            .collect();
        let period = self.period();
        let hot: Vec<Value> = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state
                .hot
                .top(self.hot_keys, period)
                .into_iter()
                .map(|(key, n)| json!({"key": String::from_utf8_lossy(&key), "requests_last_minute": n}))
                .collect()
        };
        json!({
            "sample": self.sample,
            "seconds": seconds,
            "tenants": tenants,
            "hot_keys": hot,
        })
    }
}

/// Exports the top patterns per tenant at scrape time; registered once, reads the keyspace
/// statistics the server installs (`None`: nothing exported).
#[derive(Debug)]
pub(crate) struct KeyspaceCollector {
    /// Set by `server::serve` when `keyspace.sample` is on.
    pub(crate) keyspace: std::sync::Arc<arc_swap::ArcSwapOption<Keyspace>>,
}

impl std::fmt::Debug for Keyspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyspace")
            .field("sample", &self.sample)
            .finish()
    }
}

impl Collector for KeyspaceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // The families are described even while off (no series), so the metric names are
        // the same whatever the configuration, for dashboards and `tests/deploy.rs`.
        let top = self
            .keyspace
            .load_full()
            .map(|k| k.top_patterns())
            .unwrap_or_default();
        type Field = fn(&Stats) -> u64;
        let families: [(&str, &str, Field); 5] = [
            (
                "keyspace_commands",
                "Commands per key pattern (top patterns per tenant; estimated from the sample)",
                |s| s.commands,
            ),
            (
                "keyspace_received_bytes",
                "Request bytes per key pattern",
                |s| s.bytes_in,
            ),
            ("keyspace_sent_bytes", "Reply bytes per key pattern", |s| {
                s.bytes_out
            }),
            ("keyspace_writes", "Writes per key pattern", |s| s.writes),
            (
                "keyspace_writes_without_ttl",
                "Writes per key pattern that set no TTL (and got none from the policy)",
                |s| s.writes_without_ttl,
            ),
        ];
        for (name, help, field) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (tenant, rows) in &top {
                for (pattern, stats) in rows {
                    let labels = [("tenant", tenant.as_str()), ("pattern", pattern.as_str())];
                    ConstCounter::new(field(stats)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}
