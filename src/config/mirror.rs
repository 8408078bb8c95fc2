//! `mirror:`: a second server that receives every write the primary acknowledged, and
//! optionally a share of the reads to compare its answers (docs/migration.md).

use serde::Deserialize;

use super::{Located, UpstreamConfig, located, percent, without_locations};

/// The second server of a migration and how much of the traffic it sees.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MirrorConfig {
    /// The mirror, configured as `upstream:` is (address, login, TLS, timeouts): a
    /// standalone server, a Sentinel-managed primary (followed through its failovers) or a
    /// Redis Cluster. It always uses one connection per RESP version (per node of a cluster),
    /// so one client's writes stay in order, and no dedicated ones: `connections` and the
    /// `dedicated_*` settings do not apply.
    pub(crate) upstream: UpstreamConfig,
    /// Bytes of answered batches waiting for the mirror, at most; past it, batches are
    /// dropped and counted rather than held, so a slow or dead mirror never grows the proxy's
    /// memory nor delays a client.
    pub(crate) max_queue_bytes: Located<u64>,
    /// Shadow reads: a share of the reads is also sent to the mirror and its answers compared
    /// with the primary's. Absent: writes only.
    pub(crate) compare: Option<CompareConfig>,
    /// With `routes:`, the route whose server the mirror copies (its upstream and database):
    /// a migration moves one server at a time, and only the writes that went to that server
    /// belong on its replacement. Required with routes, refused without.
    pub route: Option<Located<String>>,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            upstream: UpstreamConfig::default(),
            max_queue_bytes: located(64 << 20),
            compare: None,
            route: None,
        }
    }
}

/// Which reads are compared, and how divergences are reported.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct CompareConfig {
    /// The share of reads compared (`1%`, `100%`).
    pub(crate) share: Located<String>,
    /// Divergences logged per minute at most (command and key name, never values); the
    /// rest are counted only.
    pub(crate) log_per_minute: Located<u32>,
}

impl Default for CompareConfig {
    fn default() -> Self {
        CompareConfig {
            share: located("1%".to_string()),
            log_per_minute: located(10),
        }
    }
}

impl CompareConfig {
    /// The share in hundredths of a percent (validated at load; 0 if it does not parse).
    pub(crate) fn hundredths(&self) -> u64 {
        percent::parse(&self.share.value).unwrap_or(0)
    }
}

impl MirrorConfig {
    /// The settings as a comparable text (values only, no file positions): a reload that
    /// leaves it unchanged keeps the running mirror and its connections.
    pub(crate) fn fingerprint(&self) -> String {
        without_locations(&format!("{self:?}"))
    }

    /// The phase it puts the migration in, for the log, INFO and metrics.
    pub(crate) fn phase(&self) -> &'static str {
        match &self.compare {
            Some(_) => "compare",
            None => "writes",
        }
    }
}
