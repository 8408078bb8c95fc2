//! What the proxy says when it starts: one summary line with everything an operator checks
//! first (which build, where it listens, what it fronts, which policy is in force), and a
//! warning when no policy file was given, since such a proxy forwards every command unchanged
//! and would otherwise look exactly like a working one.

use std::net::SocketAddr;
use std::path::Path;

use crate::config::{Config, UpstreamMode};
use crate::policy::Policy;

/// The facts the summary line reports, gathered once both listeners are bound.
pub struct Started<'a> {
    /// The client listener's bound address (the port is real even for `:0`).
    pub listen: SocketAddr,
    /// The admin endpoint's bound address; `None` when switched off.
    pub admin: Option<SocketAddr>,
    /// Upstream mode and nodes, worker count.
    pub config: &'a Config,
    /// The policy file; `None` when the proxy runs on built-in defaults.
    pub policy_file: Option<&'a Path>,
    /// The compiled policy: its version and rules.
    pub policy: &'a Policy,
}

/// What the summary says in place of a file name when there is none.
pub(crate) const NO_POLICY: &str = "none (NO POLICY IN FORCE)";

/// Logs the warning for a proxy without a policy file (if so), then the summary line.
pub fn log(s: &Started<'_>) {
    if s.policy_file.is_none() {
        tracing::warn!(
            "no policy in force: started without --config (or RPP_CONFIG), so every command \
             is forwarded unchanged; start with --config policy/default.yaml for the \
             best-practice rules"
        );
    }
    let (enforce, audit) = s.policy.mode_counts();
    let policy_file = s
        .policy_file
        .map_or_else(|| NO_POLICY.to_string(), |p| p.display().to_string());
    let admin = s.admin.map_or_else(|| "off".to_string(), |a| a.to_string());
    // Where clients can speak TLS (docs/operations.md, TLS from clients).
    let tls = match &s.config.tls {
        None => "off".to_string(),
        Some(t) => match (&t.listen, t.plaintext.value) {
            (Some(at), _) => at.value.clone(),
            (None, true) => "listen, plaintext too".to_string(),
            (None, false) => "listen only".to_string(),
        },
    };
    tracing::info!(
        version = crate::LONG_VERSION,
        listen = %s.listen,
        upstream_mode = mode_name(s.config.upstream.mode.value),
        upstream = %s.config.upstream_nodes().join(","),
        admin = %admin,
        tls = %tls,
        policy_file = %policy_file,
        policy_version = s.policy.version(),
        rules = enforce + audit,
        enforce,
        audit,
        rule_modes = %s.policy.rules_summary(),
        workers = s.config.workers.value,
        "redis-policy-proxy started"
    );
}

/// The mode as written in the file.
fn mode_name(mode: UpstreamMode) -> &'static str {
    match mode {
        UpstreamMode::Standalone => "standalone",
        UpstreamMode::Cluster => "cluster",
        UpstreamMode::Sentinel => "sentinel",
    }
}
