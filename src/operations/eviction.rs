//! Eviction awareness: at start and every `upstream.memory_check_ms`, the proxy reads the
//! upstream's `maxmemory`, `maxmemory_policy` and `used_memory` (`INFO memory`, over the
//! control connection) and checks them against what the upstream is for (`upstream.role`)
//! and what the policy's TTL rule does. What it finds is a warning in the log,
//! `rpp_eviction_findings`, lines in INFO's `# Proxy` section and a `/readyz` detail (never
//! a failure: Redis serves either way), and the text an `OOM command not allowed` reply gains
//! on its way to the client.
//!
//! The one upstream (the home node in cluster mode, the primary in Sentinel mode) is judged
//! under `upstream.role`; with routes, each route's upstream under its own `role`, the
//! reports combined on a [`Board`] (INFO lines named after the routes, findings added up).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::UpstreamRole;
use crate::config::rules::Mode;
use crate::observe::metrics::{MemoryReport, Metrics};
use crate::policy::Policy;
use crate::protocol::resp_value::{self, Value};
use crate::upstream::pool::Control;

/// What `INFO memory` says about the upstream's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Memory {
    /// `maxmemory` in bytes; 0 means no limit.
    pub(crate) maxmemory: u64,
    /// `maxmemory_policy`: `noeviction`, `allkeys-lru`, `volatile-ttl`…
    pub(crate) policy: String,
    /// `used_memory` in bytes.
    pub(crate) used: u64,
}

/// Reads the three fields out of `INFO memory`'s text; `None` when one is missing.
pub(crate) fn parse_info(text: &str) -> Option<Memory> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    Some(Memory {
        maxmemory: field("maxmemory")?.parse().ok()?,
        policy: field("maxmemory_policy")?.to_string(),
        used: field("used_memory")?.parse().ok()?,
    })
}

/// What the policy's TTL rule does to writes, as the eviction check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TtlRule {
    /// No `ttl` rule: keys are written without a TTL unless the client gives one.
    Off,
    /// A `ttl` rule in `audit` mode (id): it only reports.
    Audit(String),
    /// A `ttl` rule in `enforce` mode (id): written keys get a TTL.
    Enforce(String),
}

impl TtlRule {
    /// The policy's TTL rule: the first enforcing one, else the first auditing one.
    pub(crate) fn of(policy: &Policy) -> TtlRule {
        let mut audit = None;
        for (id, mode) in policy.ttl_rules() {
            match mode {
                Mode::Enforce => return TtlRule::Enforce(id.to_string()),
                Mode::Audit if audit.is_none() => audit = Some(id.to_string()),
                Mode::Audit => {}
            }
        }
        audit.map_or(TtlRule::Off, TtlRule::Audit)
    }

    /// In words, for the reports.
    fn describe(&self) -> String {
        match self {
            TtlRule::Off => "no TTL rule".into(),
            TtlRule::Audit(id) => format!("TTL rule `{id}` in audit"),
            TtlRule::Enforce(id) => format!("TTL rule `{id}` enforced"),
        }
    }
}

/// What is wrong with `memory` for an upstream of `role` under `ttl`, one sentence each.
pub(crate) fn findings(memory: &Memory, role: UpstreamRole, ttl: &TtlRule) -> Vec<String> {
    let mut out = Vec::new();
    let policy = memory.policy.as_str();
    let cache = role == UpstreamRole::Cache;
    if cache && memory.maxmemory == 0 {
        out.push(
            "cache upstream has maxmemory 0: nothing is evicted, memory grows until the host \
             runs out (set maxmemory and an allkeys-* policy)"
                .to_string(),
        );
    }
    if cache && policy == "noeviction" {
        out.push(
            "cache upstream has maxmemory-policy noeviction: when full, writes fail with OOM \
             instead of evicting (use allkeys-lru or allkeys-lfu)"
                .to_string(),
        );
    }
    if policy.starts_with("allkeys-") && role != UpstreamRole::Cache {
        let what = if role == UpstreamRole::Queue {
            "queue upstream"
        } else {
            "upstream holding cache and queue data (role mixed)"
        };
        out.push(format!(
            "{what} has maxmemory-policy {policy}: queued data and keys meant to persist can be \
             evicted (use noeviction for queues, or volatile-* with the TTL rule enforced)"
        ));
    }
    if policy.starts_with("volatile-") && !matches!(ttl, TtlRule::Enforce(_)) {
        out.push(format!(
            "maxmemory-policy {policy} evicts only keys with a TTL, and {}: keys written without \
             one are never evicted, so writes can fail with OOM (enforce the TTL rule)",
            ttl.describe()
        ));
    }
    out
}

/// The report of one check in the forms its readers need.
pub(crate) fn report(
    addr: &str,
    memory: &Memory,
    role: UpstreamRole,
    ttl: &TtlRule,
    findings: &[String],
) -> MemoryReport {
    let limit = match memory.maxmemory {
        0 => "no maxmemory".to_string(),
        n => format!("maxmemory {n}"),
    };
    let state = format!(
        "upstream {addr} (role {}): used_memory {} of {limit}, maxmemory-policy {}; {}",
        role.as_str(),
        memory.used,
        memory.policy,
        ttl.describe()
    );
    let summary = match findings.len() {
        0 => format!("eviction: {state}; no findings"),
        n => format!("eviction: {state}; {n} finding(s): {}", findings.join("; ")),
    };
    let mut info = String::new();
    let _ = write!(
        info,
        "proxy_upstream_role:{}\r\nproxy_upstream_maxmemory:{}\r\nproxy_upstream_maxmemory_policy:{}\r\nproxy_upstream_used_memory:{}\r\nproxy_eviction_findings:{}\r\n",
        role.as_str(),
        memory.maxmemory,
        memory.policy,
        memory.used,
        findings.len()
    );
    for (i, f) in findings.iter().enumerate() {
        let _ = write!(info, "proxy_eviction_finding_{i}:{f}\r\n");
    }
    MemoryReport {
        oom_note: format!("(proxy: at the last check {state})"),
        info,
        summary,
    }
}

/// The latest report of every upstream checked, combined into the one report its readers
/// (INFO, `/readyz`, OOM replies, the findings gauge) use.
pub(crate) struct Board {
    /// Per upstream checked: the routes it serves (`None`: the only upstream, whose report
    /// is published as it is).
    labels: Vec<Option<String>>,
    /// Per upstream: its latest findings and report, `None` before its first check.
    latest: Mutex<Vec<Option<(usize, MemoryReport)>>>,
}

impl Board {
    /// A board for upstreams named `labels` (one `None` for a proxy without routes).
    pub(crate) fn new(labels: Vec<Option<String>>) -> Arc<Board> {
        let latest = Mutex::new(vec![None; labels.len()]);
        Arc::new(Board { labels, latest })
    }

    /// Records upstream `index`'s check and publishes the combined report.
    fn publish(&self, index: usize, findings: usize, report: MemoryReport, metrics: &Metrics) {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest[index] = Some((findings, report));
        let mut total = 0;
        let mut combined = MemoryReport {
            oom_note: String::new(),
            info: String::new(),
            summary: String::new(),
        };
        for (label, entry) in self.labels.iter().zip(latest.iter()) {
            let Some((n, report)) = entry else { continue };
            total += n;
            let Some(label) = label else {
                combined = report.clone();
                continue;
            };
            let sep = |s: &String| if s.is_empty() { "" } else { "; " };
            combined.summary = format!(
                "{}{}route {label}: {}",
                combined.summary,
                sep(&combined.summary),
                report.summary
            );
            combined.oom_note = format!(
                "{}{}{}",
                combined.oom_note,
                sep(&combined.oom_note),
                report.oom_note
            );
            for line in report.info.split_terminator("\r\n") {
                if line.starts_with("proxy_eviction_findings:") {
                    continue;
                }
                let named = line.replacen("proxy_", &format!("proxy_route_{label}_"), 1);
                let _ = write!(combined.info, "{named}\r\n");
            }
        }
        if self.labels.len() > 1 {
            let _ = write!(combined.info, "proxy_eviction_findings:{total}\r\n");
        }
        metrics.eviction_findings.set(total as i64);
        metrics.memory_report.store(Some(Arc::new(combined)));
    }
}

/// One upstream the eviction check reads: how to ask it, what to call it, what it is for,
/// and where on the [`Board`] its report goes.
pub(crate) struct Watched {
    /// The upstream's control connection, for `INFO memory`.
    pub(crate) control: Control,
    /// Its address, in the report.
    pub(crate) addr: String,
    /// What it holds (`upstream.role`, or its route upstream's).
    pub(crate) role: UpstreamRole,
    /// Its place on the board.
    pub(crate) index: usize,
}

/// Checks at start and every `every`, and again at once when the policy changes (its TTL
/// rule may have), until the proxy stops. Logs a warning when the findings change.
pub(crate) async fn watch(
    upstream: Watched,
    board: Arc<Board>,
    every: Duration,
    policy: Arc<ArcSwap<Policy>>,
    metrics: Arc<Metrics>,
) {
    let Watched {
        control,
        addr,
        role,
        index,
    } = upstream;
    let mut last: Option<Vec<String>> = None;
    let mut checked_policy: Option<Arc<Policy>> = None;
    let mut next = tokio::time::Instant::now();
    // Policy changes are noticed within a second; the upstream is asked every `every`.
    let mut tick = tokio::time::interval(Duration::from_secs(1).min(every));
    loop {
        tick.tick().await;
        let current = policy.load_full();
        let changed = checked_policy
            .as_ref()
            .is_none_or(|p| !Arc::ptr_eq(p, &current));
        if !changed && tokio::time::Instant::now() < next {
            continue;
        }
        let memory = match ask(&control).await {
            Ok(m) => m,
            Err(why) => {
                if last.is_some() || checked_policy.is_none() {
                    tracing::debug!(error = %why, "eviction check: upstream memory not read");
                }
                next = tokio::time::Instant::now() + every.min(Duration::from_secs(5));
                continue;
            }
        };
        checked_policy = Some(current.clone());
        next = tokio::time::Instant::now() + every;
        let ttl = TtlRule::of(&current);
        let found = findings(&memory, role, &ttl);
        let report = report(&addr, &memory, role, &ttl, &found);
        if last.as_ref() != Some(&found) {
            if found.is_empty() {
                tracing::info!(status = %report.summary, "eviction check");
            } else {
                tracing::warn!(status = %report.summary, "eviction check: the upstream's eviction does not fit its role or the policy");
            }
        }
        board.publish(index, found.len(), report, &metrics);
        last = Some(found);
    }
}

/// `INFO memory` over the control connection.
async fn ask(control: &Control) -> Result<Memory, String> {
    let reply = control
        .request(&[b"INFO", b"memory"])
        .await
        .map_err(|e| e.to_string())?;
    let text = match resp_value::decode(&reply, 4).map_err(|e| e.to_string())?.0 {
        Value::String(s) => String::from_utf8_lossy(&s).into_owned(),
        Value::Error(e) => return Err(format!("INFO memory refused: {e}")),
        other => return Err(format!("INFO memory answered {other:?}")),
    };
    parse_info(&text).ok_or_else(|| "INFO memory lacks maxmemory fields".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(maxmemory: u64, policy: &str) -> Memory {
        Memory {
            maxmemory,
            policy: policy.into(),
            used: 1000,
        }
    }

    #[test]
    fn reads_info_memory() {
        let text = "# Memory\r\nused_memory:874512\r\nused_memory_human:854.02K\r\nmaxmemory:1048576\r\nmaxmemory_human:1.00M\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(
            parse_info(text),
            Some(Memory {
                maxmemory: 1048576,
                policy: "allkeys-lru".into(),
                used: 874512
            })
        );
        assert_eq!(parse_info("# Memory\r\n"), None);
    }

    #[test]
    fn judges_each_role() {
        let enforce = TtlRule::Enforce("ttl".into());
        let audit = TtlRule::Audit("ttl".into());
        let cache = UpstreamRole::Cache;
        assert_eq!(findings(&mem(0, "noeviction"), cache, &enforce).len(), 2);
        assert!(findings(&mem(1 << 20, "allkeys-lru"), cache, &TtlRule::Off).is_empty());
        let queue = findings(&mem(1 << 20, "allkeys-lfu"), UpstreamRole::Queue, &enforce);
        assert!(queue[0].starts_with("queue upstream"), "{queue:?}");
        assert!(findings(&mem(0, "noeviction"), UpstreamRole::Queue, &TtlRule::Off).is_empty());
        let volatile = findings(&mem(1 << 20, "volatile-lru"), UpstreamRole::Mixed, &audit);
        assert!(volatile[0].contains("in audit"), "{volatile:?}");
        assert!(findings(&mem(1 << 20, "volatile-ttl"), UpstreamRole::Mixed, &enforce).is_empty());
    }
}
