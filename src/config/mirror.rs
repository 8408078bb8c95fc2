//! `mirror:`: a second server that receives every write the primary acknowledged, and
//! optionally a share of the reads to compare its answers (docs/migration.md).

use serde::Deserialize;
use serde_saphyr::Location;

use super::{Config, Located, Problem, UpstreamConfig, UpstreamMode, located, percent};

/// The second server of a migration and how much of the traffic it sees.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MirrorConfig {
    /// The mirror, configured as `upstream:` is (address, login, TLS, timeouts): a
    /// standalone server or a Sentinel-managed primary (followed through its failovers). It always uses one connection per RESP version (so one
    /// client's writes stay in order) and no dedicated ones: `connections` and the
    /// `dedicated_*` settings do not apply.
    pub upstream: UpstreamConfig,
    /// Bytes of answered batches waiting for the mirror, at most; past it, batches are
    /// dropped and counted rather than held, so a slow or dead mirror never grows the proxy's
    /// memory nor delays a client.
    pub max_queue_bytes: Located<u64>,
    /// Shadow reads: a share of the reads is also sent to the mirror and its answers compared
    /// with the primary's. Absent: writes only.
    pub compare: Option<CompareConfig>,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            upstream: UpstreamConfig::default(),
            max_queue_bytes: located(64 << 20),
            compare: None,
        }
    }
}

/// Which reads are compared, and how divergences are reported.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompareConfig {
    /// The share of reads compared (`1%`, `100%`).
    pub share: Located<String>,
    /// Divergences logged per minute at most (command and key name, never values); the
    /// rest are counted only.
    pub log_per_minute: Located<u32>,
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
    pub fn hundredths(&self) -> u64 {
        percent::parse(&self.share.value).unwrap_or(0)
    }
}

impl MirrorConfig {
    /// The whole file as the mirror's pool reads it: `upstream:` replaced by the mirror's.
    pub fn as_upstream_of(&self, config: &Config) -> Config {
        Config {
            upstream: self.upstream.clone(),
            upstreams: Default::default(),
            routes: Vec::new(),
            mirror: None,
            ..config.clone()
        }
    }

    /// The settings as a comparable text (values only, no file positions): a reload that
    /// leaves it unchanged keeps the running mirror and its connections.
    pub fn fingerprint(&self) -> String {
        super::without_locations(&format!("{self:?}"))
    }

    /// The phase it puts the migration in, for the log, INFO and metrics.
    pub fn phase(&self) -> &'static str {
        match &self.compare {
            Some(_) => "compare",
            None => "writes",
        }
    }
}

impl Config {
    /// Problems of `mirror:`.
    pub(super) fn mirror_problems(&self, problems: &mut Vec<Problem>) {
        let Some(mirror) = &self.mirror else {
            return;
        };
        let alone = Config {
            upstream: mirror.upstream.clone(),
            ..Config::default()
        };
        problems.extend(alone.problems().into_iter().filter_map(|p| {
            let field = format!("mirror.upstream.{}", p.field.strip_prefix("upstream.")?);
            Some(Problem { field, ..p })
        }));
        let mut push = |loc: &Location, field: &str, message: String| {
            problems.push(Problem {
                line: loc.line(),
                field: field.to_string(),
                message,
            });
        };
        if self.upstream.mode.value == UpstreamMode::Cluster {
            push(
                &self.upstream.mode.referenced,
                "mirror",
                "mirroring works in front of a standalone or Sentinel upstream; in front of a \
                 cluster it is not built yet (docs/migration.md)"
                    .into(),
            );
        }
        if !self.routes.is_empty() {
            push(
                &mirror.upstream.address.referenced,
                "mirror",
                "mirroring with `routes:` (a mirror per route) is not built yet; mirror without \
                 routes (docs/migration.md)"
                    .into(),
            );
        }
        if mirror.upstream.address.value == self.upstream.address.value
            && self.upstream.mode.value == UpstreamMode::Standalone
            && mirror.upstream.mode.value == UpstreamMode::Standalone
        {
            push(
                &mirror.upstream.address.referenced,
                "mirror.upstream.address",
                format!(
                    "`{}` is the primary itself: every write would run twice there",
                    mirror.upstream.address.value
                ),
            );
        }
        if mirror.max_queue_bytes.value < 1 << 16 {
            push(
                &mirror.max_queue_bytes.referenced,
                "mirror.max_queue_bytes",
                "must be at least 65536 (one large batch must fit)".into(),
            );
        }
        if let Some(compare) = &mirror.compare
            && let Err(why) = percent::parse(&compare.share.value)
        {
            push(&compare.share.referenced, "mirror.compare.share", why);
        }
    }
}
