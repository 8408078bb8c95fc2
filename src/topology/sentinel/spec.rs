//! What Sentinel needs from `upstream.sentinel`: where the sentinels are and what they watch.

use std::time::Duration;

/// Where the sentinels are and what they watch.
#[derive(Debug, Clone)]
pub struct SentinelSpec {
    /// `host:port` of each sentinel, tried in order.
    pub sentinels: Vec<String>,
    /// The monitored primary's name (`sentinel monitor <name> …`).
    pub master_name: String,
    /// Bound on connecting and on each reply, so a dead sentinel costs at most this.
    pub timeout: Duration,
}

impl SentinelSpec {
    /// What `follow_primary` needs from `upstream.sentinel` (the config is validated: the
    /// name is present). Here rather than in `config`, which knows nothing of the modules
    /// reading it.
    pub(crate) fn of(config: &crate::config::SentinelConfig) -> SentinelSpec {
        SentinelSpec {
            sentinels: config.sentinels.iter().map(|s| s.value.clone()).collect(),
            master_name: config
                .master_name
                .as_ref()
                .map(|n| n.value.clone())
                .unwrap_or_default(),
            timeout: Duration::from_millis(config.timeout_ms.value),
        }
    }
}
