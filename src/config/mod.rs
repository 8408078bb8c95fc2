//! The YAML configuration: where to listen, which upstream to use, and the resource limits.
//!
//! Parsing is strict (`deny_unknown_fields` everywhere, so a typo is an error, not a silently
//! ignored key) and validation collects every problem before failing, each naming the file,
//! line and field, so an operator fixes a broken file in one pass.
//!
//! Here: the whole file ([`Config`]), its listeners, limits and operators' sections, and its
//! loading and validation. By part: `upstream` (`upstream:` and each of `upstreams:`),
//! `routes` and `layout` (the `routes:` section, and the routes laid out over the upstreams and
//! checked against them), `mirror` and `mirror_layout` (likewise for `mirror:`),
//! `dedicated_caps`, `namespaces`, `percent`, `rules` (the policy's rules as data), `problem`
//! (values with their place in the file, and what validation reports), `yaml` (the lenient
//! second reading `config_recovery` uses).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::Location;

mod dedicated_caps;
mod layout;
mod mirror;
mod mirror_layout;
mod namespaces;
pub(crate) mod percent;
mod problem;
pub(crate) mod recovery;
mod routes;
pub(crate) mod rules;
mod upstream;
pub(crate) mod yaml;
pub(crate) use dedicated_caps::DedicatedCapsConfig;
pub(crate) use mirror::MirrorConfig;
pub use problem::Problem;
use problem::render_problems;
pub(crate) use problem::{Located, located, without_locations};
pub(crate) use routes::{RouteConfig, RouteNode};
pub use upstream::{ClusterConfig, SentinelConfig, UnconfinedScripts, UpstreamConfig};
pub(crate) use upstream::{ReadFrom, ScriptAclMode, TlsConfig, UpstreamMode, UpstreamRole};

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address clients connect to; they cannot tell it from a Redis server.
    pub listen: Located<String>,
    /// The Redis the proxy forwards to; with `routes:`, the `default` route's: every key no
    /// route names.
    pub upstream: UpstreamConfig,
    /// More upstreams by name, for `routes:` (docs/routes.md); each is configured as
    /// `upstream:` is.
    pub(crate) upstreams: std::collections::BTreeMap<String, UpstreamConfig>,
    /// Key prefixes sent to other upstreams (or databases) than `upstream:`.
    pub(crate) routes: Vec<RouteConfig>,
    /// A second server that receives the writes (and a share of the reads, compared) during
    /// a migration; reloadable (docs/migration.md).
    pub mirror: Option<MirrorConfig>,
    /// Bounds on what one client may make the proxy hold, so no client can grow its memory
    /// without limit.
    pub limits: Limits,
    /// How long SIGTERM waits for in-flight commands before closing connections.
    pub shutdown_grace_ms: Located<u64>,
    /// Worker threads, each a current-thread runtime with its share of the clients and of the
    /// shared upstream connections (`operations::workers`): 1 (the default) runs everything
    /// on the main thread, 0 means one worker per core. A knob because the best layout depends
    /// on how many cores Redis itself needs on the same host; measurements in
    /// docs/performance.md.
    pub workers: Located<usize>,
    /// Policy rules, checked in-line for every command (see `policy/README.md`).
    pub rules: Vec<rules::RuleConfig>,
    /// Proxy-side users and the identities that map clients to tenants.
    pub(crate) access: rules::Access,
    /// The admin HTTP endpoint (metrics, health) and the diagnostics it serves.
    pub admin: AdminConfig,
    /// TLS for clients (docs/operations.md, TLS from clients): on `listen` itself or on a
    /// second port beside it; absent, clients speak plain TCP only.
    pub(crate) tls: Option<ClientTlsConfig>,
    /// The audit trail: which commands are logged with their client's identity, and where.
    pub(crate) audit: AuditConfig,
    /// The key-pattern report and hot keys (`PROXY KEYSPACE`, `/keyspace`).
    pub(crate) keyspace: KeyspaceConfig,
    /// Log filter when `RUST_LOG` is unset: a level (`info`) or `tracing` directives
    /// (`info,redis_policy_proxy::policy=debug`). In the file so deployments set it in one place.
    pub log_level: Located<String>,
    /// Identifies this version of the file in metrics and INFO: a hash of its text (`builtin`
    /// without a file). Computed, never read from the YAML.
    #[serde(skip)]
    pub(crate) version: String,
    /// The line each tenant's namespace is written on (`access.namespaces`, which the policy
    /// reads without locations), for the overlap check's messages. Computed by [`Config::parse`].
    #[serde(skip)]
    pub(crate) namespace_lines: std::collections::BTreeMap<String, u64>,
    /// What went wrong reading `password_env`, `password_file` and `username_env` (a variable
    /// not set, a file not readable), reported with the file's other problems. Computed by
    /// [`Config::parse`].
    #[serde(skip)]
    pub secret_problems: Vec<Problem>,
    /// The line of every key and list item of the file, by path (`rules[2].ttl.max`), from
    /// the lenient reading ([`yaml::Tree`]): where a problem whose value carries no location
    /// (a default, a setting inside `ttl:`) is reported. Computed by [`Config::parse`].
    #[serde(skip)]
    pub(crate) key_lines: std::collections::BTreeMap<String, u64>,
    /// The fields set from the command line or the environment (`listen`,
    /// `upstream.address`, `admin.listen`): a problem with one of them is the flag's, not the
    /// file's, so it is given no line of the file.
    #[serde(skip)]
    pub(crate) overridden: Vec<&'static str>,
}

/// The admin endpoint and diagnostics.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// `IP:port` of the HTTP listener for `/metrics`, `/healthz` and `/readyz`, or `off`.
    /// Loopback by default: metrics name rules and tenants, which is not for everyone.
    pub(crate) listen: Located<String>,
    /// Commands slower than this (microseconds, read to reply) enter the slow log
    /// (`PROXY SLOWLOG`); Redis's `slowlog-log-slower-than` default is the same 10 ms.
    pub(crate) slowlog_threshold_us: Located<u64>,
    /// Entries the slow log keeps (Redis's `slowlog-max-len` default).
    pub(crate) slowlog_max_len: Located<usize>,
    /// Policy denials logged per second at most; the rest are counted in metrics only, so a
    /// client hammering a denied command cannot flood the log.
    pub(crate) denial_logs_per_second: Located<u32>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: located("127.0.0.1:8379".to_string()),
            slowlog_threshold_us: located(10_000),
            slowlog_max_len: located(128),
            denial_logs_per_second: located(10),
        }
    }
}

impl AdminConfig {
    /// The admin listener's address; `None` when switched off.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.value.parse().ok()
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: located("127.0.0.1:6380".to_string()),
            upstream: UpstreamConfig::default(),
            upstreams: Default::default(),
            routes: Vec::new(),
            mirror: None,
            limits: Limits::default(),
            shutdown_grace_ms: located(10_000),
            workers: located(1),
            rules: Vec::new(),
            access: Default::default(),
            admin: AdminConfig::default(),
            tls: None,
            audit: AuditConfig::default(),
            keyspace: KeyspaceConfig::default(),
            log_level: located("info".to_string()),
            version: "builtin".to_string(),
            namespace_lines: Default::default(),
            secret_problems: Vec::new(),
            key_lines: Default::default(),
            overridden: Vec::new(),
        }
    }
}

/// TLS for clients: the proxy's certificate, the CA that signs client certificates, and where
/// TLS is served.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ClientTlsConfig {
    /// PEM certificate chain the proxy presents; re-read when the file changes, so a renewed
    /// certificate needs no restart.
    pub(crate) cert_file: Located<PathBuf>,
    /// PEM private key of `cert_file`; re-read with it.
    pub(crate) key_file: Located<PathBuf>,
    /// PEM CA certificates that sign client certificates. Given, clients are asked for a
    /// certificate and one that does not verify is refused; absent, none is asked for.
    pub(crate) client_ca_file: Option<Located<PathBuf>>,
    /// With `client_ca_file`: `required` (a client without a certificate is refused) or
    /// `optional` (it may connect and authenticate with a password instead).
    pub(crate) client_certs: Located<ClientCerts>,
    /// `IP:port` of a second listener that serves TLS only, beside the plaintext `listen`;
    /// absent, `listen` itself serves TLS.
    pub(crate) listen: Option<Located<String>>,
    /// Without `tls.listen`: whether `listen` also serves plaintext clients (told apart by
    /// their first byte), for a migration where not every client has TLS yet.
    pub(crate) plaintext: Located<bool>,
    /// Bound on the TLS handshake (and, on a TLS-only listener, on the first byte): a client
    /// that starts one and never finishes is closed instead of holding a slot for ever.
    pub(crate) handshake_timeout_ms: Located<u64>,
    /// How often the certificate, key and CA files are looked at for changes (modification
    /// time and size); a change is loaded for new connections, a broken file is refused and
    /// the certificate in use stays.
    pub(crate) reload_check_ms: Located<u64>,
}

/// Whether clients must present a certificate (`tls.client_certs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ClientCerts {
    /// A client without a verified certificate is refused in the handshake.
    #[default]
    Required,
    /// A certificate is asked for, verified when sent, and not required.
    Optional,
}

impl Default for ClientTlsConfig {
    fn default() -> Self {
        ClientTlsConfig {
            cert_file: located(PathBuf::new()),
            key_file: located(PathBuf::new()),
            client_ca_file: None,
            client_certs: located(ClientCerts::Required),
            listen: None,
            plaintext: located(false),
            handshake_timeout_ms: located(5_000),
            reload_check_ms: located(5_000),
        }
    }
}

/// Which commands the audit trail records (`audit.commands`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AuditCommands {
    /// No audit trail: the data path pays one branch per command.
    #[default]
    Off,
    /// Commands that may modify data (Redis's `write` flag): who changed what.
    Writes,
    /// Administrative and dangerous commands (`admin` flag, `@dangerous`): who reconfigured it.
    Admin,
    /// Every command; reads sampled 1 in `read_sample`.
    All,
}

/// How key names appear in audit entries (`audit.keys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AuditKeys {
    /// As the client sent them (non-UTF-8 bytes replaced): the replay can judge key patterns.
    #[default]
    Names,
    /// A 64-bit FNV-1a hash per key (`#` and 16 hex digits): entries can be correlated per
    /// key without the log holding names; the replay cannot judge key-name rules.
    Hash,
}

/// The audit trail: JSON lines with identity, command, key names and outcome, never values.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct AuditConfig {
    /// Which commands are recorded; `off` (the default) disables the audit trail.
    pub(crate) commands: Located<AuditCommands>,
    /// With `commands: all`, one read in this many is recorded (1: every read), so a
    /// read-heavy service can keep the trail of its writes and a sample of its reads.
    pub(crate) read_sample: Located<u64>,
    /// Only these tenants' commands are recorded (empty: every tenant's).
    pub(crate) tenants: Vec<String>,
    /// Key names as sent, or hashed.
    pub(crate) keys: Located<AuditKeys>,
    /// `stdout`, or the path of the file the JSON lines are appended to.
    pub(crate) output: Located<String>,
    /// A file is rotated (renamed to `FILE.1`, older ones shifted) once it reaches this size.
    pub(crate) max_file_bytes: Located<u64>,
    /// Rotated files kept besides the current one (`FILE.1` … `FILE.N`).
    pub(crate) max_files: Located<u32>,
    /// Entries waiting for the writer; when it is full, entries are dropped and counted
    /// (`rpp_audit_entries_total{result="dropped"}`), never a client's command delayed.
    pub(crate) queue: Located<usize>,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            commands: located(AuditCommands::Off),
            read_sample: located(1),
            tenants: Vec::new(),
            keys: located(AuditKeys::Names),
            output: located("stdout".to_string()),
            max_file_bytes: located(100 * 1024 * 1024),
            max_files: located(5),
            queue: located(65_536),
        }
    }
}

impl ClientTlsConfig {
    /// Every problem with the section's own values (whether the files load is `setup`'s).
    fn problems(&self, problems: &mut Vec<Problem>) {
        let mut check = |ok: bool, loc: &Location, field: &str, message: &str| {
            if !ok {
                problems.push(Problem {
                    line: loc.line(),
                    field: field.to_string(),
                    message: message.to_string(),
                });
            }
        };
        check(
            !self.cert_file.value.as_os_str().is_empty(),
            &self.cert_file.referenced,
            "tls.cert_file",
            "is required (a PEM certificate chain)",
        );
        check(
            !self.key_file.value.as_os_str().is_empty(),
            &self.key_file.referenced,
            "tls.key_file",
            "is required (the PEM private key of tls.cert_file)",
        );
        if let Some(listen) = &self.listen {
            check(
                listen.value.parse::<SocketAddr>().is_ok(),
                &listen.referenced,
                "tls.listen",
                "must be an IP:port such as 127.0.0.1:6390",
            );
            check(
                !self.plaintext.value,
                &self.plaintext.referenced,
                "tls.plaintext",
                "only applies without tls.listen (plaintext is served on listen already)",
            );
        }
        check(
            (1..=600_000).contains(&self.handshake_timeout_ms.value),
            &self.handshake_timeout_ms.referenced,
            "tls.handshake_timeout_ms",
            "must be between 1 and 600000",
        );
        check(
            self.reload_check_ms.value >= 100,
            &self.reload_check_ms.referenced,
            "tls.reload_check_ms",
            "must be at least 100",
        );
        check(
            self.client_ca_file.is_some() || self.client_certs.referenced.line() == 0,
            &self.client_certs.referenced,
            "tls.client_certs",
            "needs tls.client_ca_file (the CA that signs client certificates)",
        );
    }
}

/// The key-pattern statistics and hot keys, sampled in-line.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct KeyspaceConfig {
    /// One keyed command in this many is counted (0, the default: off; 1: every one). The
    /// report scales counts back up, so a sample costs precision, not correctness.
    pub(crate) sample: Located<u64>,
    /// A key's pattern keeps this many `:`-separated segments (it always stops at the first
    /// run of digits): with 1, `cache:page:home` counts as `cache:*`; with 2, `cache:page:*`.
    pub(crate) segments: Located<usize>,
    /// (tenant, pattern) pairs tracked at most; later ones count under `(other)`, so memory
    /// stays bounded whatever the key names.
    pub(crate) max_patterns: Located<usize>,
    /// Patterns per tenant in the report and in the metrics (the only key-derived labels).
    pub(crate) top: Located<usize>,
    /// Hot keys listed: the most requested over the last minute.
    pub(crate) hot_keys: Located<usize>,
}

impl Default for KeyspaceConfig {
    fn default() -> Self {
        KeyspaceConfig {
            sample: located(0),
            segments: located(1),
            max_patterns: located(1000),
            top: located(10),
            hot_keys: located(10),
        }
    }
}

/// Per-client and global resource limits. Defaults follow Redis where Redis has one, so a
/// client that works against Redis works here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Concurrent client connections; beyond it a client gets Redis's "max number of clients
    /// reached" error and is closed (Redis's `maxclients`).
    pub max_clients: Located<usize>,
    /// Largest bulk string a client may send (Redis's `proto-max-bulk-len`).
    pub max_bulk_len: Located<usize>,
    /// Most arguments in one command (Redis accepts up to INT_MAX; a bound keeps a hostile
    /// `*2147483647` from costing anything).
    pub max_multibulk_len: Located<usize>,
    /// Longest inline command or header line (Redis's PROTO_INLINE_MAX_SIZE is 64 KiB).
    pub max_inline_len: Located<usize>,
    /// Bytes of one client's unanswered requests the proxy buffers (Redis's
    /// `client-query-buffer-limit`).
    pub max_query_buffer: Located<usize>,
    /// Commands of one client awaiting replies; above it the proxy stops reading that client
    /// until replies drain (backpressure, not an error).
    pub max_inflight: Located<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_clients: located(10_000),
            max_bulk_len: located(512 * 1024 * 1024),
            max_multibulk_len: located(1024 * 1024),
            max_inline_len: located(64 * 1024),
            max_query_buffer: located(1024 * 1024 * 1024),
            max_inflight: located(4096),
        }
    }
}

/// A configuration that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or has an unknown or mistyped field; saphyr's message carries
    /// line, column and a snippet.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// The YAML parsed but values are unusable; every problem is listed.
    #[error("{}", render_problems(path, problems))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
}

impl ConfigError {
    /// `Ok` when `problems` is empty, else every one of them as the error for `path`.
    pub(crate) fn unless_none(path: &Path, problems: Vec<Problem>) -> Result<(), ConfigError> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                problems,
            })
        }
    }
}

/// First 12 hex digits of the SHA-256 of a policy file's text.
fn version_of(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Config {
    #[cfg(test)]
    /// Parses and validates YAML text (its own values; `setup::from_yaml` checks the TLS
    /// files and the rules too); `path` is only used in messages.
    pub(crate) fn from_yaml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config = Config::parse(text, path)?;
        config.validate(path)?;
        Ok(config)
    }

    /// Reads and parses a configuration file, not yet validated; its version is the file's
    /// digest.
    pub(crate) fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Config::parse(&text, path)?;
        config.version = version_of(&text);
        Ok(config)
    }

    /// Parses YAML text, not yet validated; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::parse_yaml(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// [`Config::parse`] with the parser's own error, for `config_recovery` to put in words.
    pub(crate) fn parse_yaml(text: &str) -> Result<Config, serde_saphyr::Error> {
        // An empty file means "all defaults", which saphyr would otherwise reject as no document.
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        let mut config: Config = serde_saphyr::from_str(text)?;
        config.key_lines = yaml::Tree::parse(text)
            .map(|t| t.lines())
            .unwrap_or_default();
        config.namespace_lines = namespaces::lines(text);
        config.secret_problems = config.upstream.resolve_secrets("upstream");
        for (name, upstream) in &mut config.upstreams {
            let problems = upstream.resolve_secrets(&format!("upstreams.{name}"));
            config.secret_problems.extend(problems);
        }
        if let Some(mirror) = &mut config.mirror {
            let problems = mirror.upstream.resolve_secrets("mirror.upstream");
            config.secret_problems.extend(problems);
        }
        Ok(config)
    }

    #[cfg(test)]
    /// Checks this file's own values and reports all problems at once. The checks that need
    /// other modules (the TLS files load, the rules compile) are `setup::validate`'s.
    pub(crate) fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        ConfigError::unless_none(path, self.problems())
    }

    /// Every problem with this file's own values, in file order.
    pub(crate) fn problems(&self) -> Vec<Problem> {
        let mut problems = self.secret_problems.clone();
        self.upstream.dedicated_caps.problems(&mut problems);
        let mut check = |ok: bool, loc: &Location, field: &str, message: &str| {
            if !ok {
                problems.push(Problem {
                    line: loc.line(),
                    field: field.to_string(),
                    message: message.to_string(),
                });
            }
        };
        check(
            self.listen.value.parse::<SocketAddr>().is_ok(),
            &self.listen.referenced,
            "listen",
            &format!(
                "must be an IP:port such as 127.0.0.1:6380 (an IP address, not a host name), \
                 not `{}`",
                self.listen.value
            ),
        );
        check(
            self.admin.listen.value == "off"
                || self.admin.listen.value.parse::<SocketAddr>().is_ok(),
            &self.admin.listen.referenced,
            "admin.listen",
            &format!(
                "must be an IP:port such as 127.0.0.1:8379 (an IP address, not a host name), \
                 or off, not `{}`",
                self.admin.listen.value
            ),
        );
        check(
            tracing_subscriber::EnvFilter::try_new(&self.log_level.value).is_ok(),
            &self.log_level.referenced,
            "log_level",
            "must be a level (error, warn, info, debug, trace) or tracing directives",
        );
        let keyspace = &self.keyspace;
        check(
            (1..=100_000).contains(&keyspace.max_patterns.value),
            &keyspace.max_patterns.referenced,
            "keyspace.max_patterns",
            "must be between 1 and 100000",
        );
        check(
            keyspace.top.value <= 100,
            &keyspace.top.referenced,
            "keyspace.top",
            "must be at most 100 (each is a metric series per tenant)",
        );
        check(
            keyspace.hot_keys.value <= 1000,
            &keyspace.hot_keys.referenced,
            "keyspace.hot_keys",
            "must be at most 1000",
        );
        let audit = &self.audit;
        check(
            audit.read_sample.value >= 1,
            &audit.read_sample.referenced,
            "audit.read_sample",
            "must be at least 1 (1 records every read)",
        );
        check(
            (1..=10_000_000).contains(&audit.queue.value),
            &audit.queue.referenced,
            "audit.queue",
            "must be between 1 and 10000000",
        );
        check(
            audit.max_file_bytes.value >= 4096,
            &audit.max_file_bytes.referenced,
            "audit.max_file_bytes",
            "must be at least 4096",
        );
        check(
            !audit.output.value.is_empty(),
            &audit.output.referenced,
            "audit.output",
            "must be stdout or a file path",
        );
        check(
            self.admin.slowlog_max_len.value <= 100_000,
            &self.admin.slowlog_max_len.referenced,
            "admin.slowlog_max_len",
            "must be at most 100000",
        );
        check(
            self.upstream.mode.value != UpstreamMode::Standalone
                || valid_host_port(&self.upstream.address.value),
            &self.upstream.address.referenced,
            "upstream.address",
            &format!(
                "must be host:port such as 127.0.0.1:6379 or redis.internal:6379, not `{}`",
                self.upstream.address.value
            ),
        );
        if let Some(tls) = &self.tls {
            tls.problems(&mut problems);
        }
        problems.extend(namespaces::overlaps(
            &self.access.namespaces,
            &self.namespace_lines,
        ));
        self.route_problems(&mut problems);
        self.mirror_problems(&mut problems);
        let u = &self.upstream;
        self.validate_cluster(&mut problems);
        self.validate_sentinel(&mut problems);
        let mut check = |ok: bool, loc: &Location, field: &str, message: &str| {
            if !ok {
                problems.push(Problem {
                    line: loc.line(),
                    field: field.to_string(),
                    message: message.to_string(),
                });
            }
        };
        check(
            (1..=64).contains(&u.connections.value),
            &u.connections.referenced,
            "upstream.connections",
            "must be between 1 and 64",
        );
        check(
            u.connect_timeout_ms.value > 0,
            &u.connect_timeout_ms.referenced,
            "upstream.connect_timeout_ms",
            "must be above 0",
        );
        check(
            u.reconnect_min_ms.value > 0,
            &u.reconnect_min_ms.referenced,
            "upstream.reconnect_min_ms",
            "must be above 0",
        );
        check(
            u.reconnect_max_ms.value >= u.reconnect_min_ms.value,
            &u.reconnect_max_ms.referenced,
            "upstream.reconnect_max_ms",
            "must be at least upstream.reconnect_min_ms",
        );
        check(
            u.queue_depth.value > 0,
            &u.queue_depth.referenced,
            "upstream.queue_depth",
            "must be above 0",
        );
        check(
            u.dedicated_max.value > 0,
            &u.dedicated_max.referenced,
            "upstream.dedicated_max",
            "must be above 0",
        );
        check(
            u.dedicated_warm.value <= u.dedicated_max.value.min(64),
            &u.dedicated_warm.referenced,
            "upstream.dedicated_warm",
            "must be at most 64 and at most upstream.dedicated_max",
        );
        check(
            u.scripts_on_dedicated.value || u.script_acl.value != ScriptAclMode::Confine,
            &u.scripts_on_dedicated.referenced,
            "upstream.scripts_on_dedicated",
            "false runs scripts on shared connections, as the proxy's own user, which \
             `script_acl: confine` (the default) cannot do: keep it true, or set \
             upstream.script_acl to check, apply or off",
        );
        check(
            u.password.is_some()
                || u.password_env.is_some()
                || u.password_file.is_some()
                || (u.username.is_none() && u.username_env.is_none()),
            &Location::UNKNOWN,
            "upstream.username",
            "needs upstream.password as well",
        );
        let l = &self.limits;
        for (v, loc, field) in [
            (
                l.max_clients.value,
                &l.max_clients.referenced,
                "limits.max_clients",
            ),
            (
                l.max_bulk_len.value,
                &l.max_bulk_len.referenced,
                "limits.max_bulk_len",
            ),
            (
                l.max_multibulk_len.value,
                &l.max_multibulk_len.referenced,
                "limits.max_multibulk_len",
            ),
            (
                l.max_inflight.value,
                &l.max_inflight.referenced,
                "limits.max_inflight",
            ),
        ] {
            check(v > 0, loc, field, "must be above 0");
        }
        check(
            l.max_inline_len.value >= 64,
            &l.max_inline_len.referenced,
            "limits.max_inline_len",
            "must be at least 64",
        );
        check(
            l.max_query_buffer.value >= l.max_inline_len.value,
            &l.max_query_buffer.referenced,
            "limits.max_query_buffer",
            "must be at least limits.max_inline_len",
        );
        problems
    }

    /// Checks `upstream.mode` against `upstream.cluster` and the cluster settings.
    fn validate_cluster(&self, problems: &mut Vec<Problem>) {
        let u = &self.upstream;
        let mut problem = |loc: &Location, field: String, message: &str| {
            problems.push(Problem {
                line: loc.line(),
                field,
                message: message.to_string(),
            });
        };
        match (u.mode.value, &u.cluster) {
            (UpstreamMode::Standalone | UpstreamMode::Sentinel, None) => {}
            (UpstreamMode::Standalone | UpstreamMode::Sentinel, Some(c)) => problem(
                c.seeds
                    .first()
                    .map_or(&c.refresh_interval_ms.referenced, |s| &s.referenced),
                "upstream.cluster".to_string(),
                "is only used when upstream.mode is cluster; set `mode: cluster` or remove it",
            ),
            (UpstreamMode::Cluster, None) => problem(
                &u.mode.referenced,
                "upstream.cluster.seeds".to_string(),
                "must list at least one host:port when upstream.mode is cluster",
            ),
            (UpstreamMode::Cluster, Some(c)) => {
                if c.seeds.is_empty() {
                    problem(
                        &u.mode.referenced,
                        "upstream.cluster.seeds".to_string(),
                        "must list at least one host:port when upstream.mode is cluster",
                    );
                }
                for (i, seed) in c.seeds.iter().enumerate() {
                    if !valid_host_port(&seed.value) {
                        problem(
                            &seed.referenced,
                            format!("upstream.cluster.seeds[{i}]"),
                            "must be host:port such as 127.0.0.1:7000",
                        );
                    }
                }
                if c.refresh_interval_ms.value < 100 {
                    problem(
                        &c.refresh_interval_ms.referenced,
                        "upstream.cluster.refresh_interval_ms".to_string(),
                        "must be at least 100",
                    );
                }
                if !(1..=16).contains(&c.max_redirects.value) {
                    problem(
                        &c.max_redirects.referenced,
                        "upstream.cluster.max_redirects".to_string(),
                        "must be between 1 and 16",
                    );
                }
                if ReadFrom::parse(&c.read_from.value).is_none() {
                    problem(
                        &c.read_from.referenced,
                        "upstream.cluster.read_from".to_string(),
                        "must be primary, replica or nearest",
                    );
                }
                if !(100..=3_600_000).contains(&c.resubscribe_timeout_ms.value) {
                    problem(
                        &c.resubscribe_timeout_ms.referenced,
                        "upstream.cluster.resubscribe_timeout_ms".to_string(),
                        "must be between 100 and 3600000 (one hour)",
                    );
                }
                // Written in the file, or given by `--upstream` (which has no line).
                if u.address.referenced.line() > 0
                    || u.address.value != UpstreamConfig::default().address.value
                {
                    problem(
                        &u.address.referenced,
                        "upstream.address".to_string(),
                        "is not used when upstream.mode is cluster; list the nodes in \
                         upstream.cluster.seeds",
                    );
                }
                // A brace in a prefix would become (or shift) the hash tag of every key of the
                // tenant: see docs/cluster.md, Namespacing.
                for (tenant, prefix) in &self.access.namespaces {
                    if prefix.contains('{') || prefix.contains('}') {
                        problem(
                            &Location::UNKNOWN,
                            format!("access.namespaces.{tenant}"),
                            "must not contain `{` or `}` when upstream.mode is cluster: it \
                             would change the hash slot of every key of the tenant",
                        );
                    }
                }
            }
        }
    }

    /// Checks `upstream.mode` against `upstream.sentinel` and the sentinel settings.
    fn validate_sentinel(&self, problems: &mut Vec<Problem>) {
        let u = &self.upstream;
        let mut problem = |loc: &Location, field: &str, message: &str| {
            problems.push(Problem {
                line: loc.line(),
                field: field.to_string(),
                message: message.to_string(),
            });
        };
        let Some(s) = &u.sentinel else {
            if u.mode.value == UpstreamMode::Sentinel {
                problem(
                    &u.mode.referenced,
                    "upstream.sentinel",
                    "must give `sentinels` (host:port list) and `master_name` when \
                     upstream.mode is sentinel",
                );
            }
            return;
        };
        let first_line = s
            .sentinels
            .first()
            .map(|x| &x.referenced)
            .or(s.master_name.as_ref().map(|n| &n.referenced))
            .unwrap_or(&s.timeout_ms.referenced);
        if u.mode.value != UpstreamMode::Sentinel {
            problem(
                first_line,
                "upstream.sentinel",
                "is only used when upstream.mode is sentinel; set `mode: sentinel` or remove it",
            );
            return;
        }
        if s.sentinels.is_empty() {
            problem(
                &u.mode.referenced,
                "upstream.sentinel.sentinels",
                "must list at least one host:port when upstream.mode is sentinel",
            );
        }
        for (i, sentinel) in s.sentinels.iter().enumerate() {
            if !valid_host_port(&sentinel.value) {
                problem(
                    &sentinel.referenced,
                    &format!("upstream.sentinel.sentinels[{i}]"),
                    "must be host:port such as 127.0.0.1:26379",
                );
            }
        }
        match &s.master_name {
            None => problem(
                &u.mode.referenced,
                "upstream.sentinel.master_name",
                "is required when upstream.mode is sentinel: the name the sentinels monitor \
                 the primary under",
            ),
            Some(name) if name.value.is_empty() || name.value.contains(char::is_whitespace) => {
                problem(
                    &name.referenced,
                    "upstream.sentinel.master_name",
                    "must be a non-empty name without spaces",
                )
            }
            Some(_) => {}
        }
        if !(1..=60_000).contains(&s.timeout_ms.value) {
            problem(
                &s.timeout_ms.referenced,
                "upstream.sentinel.timeout_ms",
                "must be between 1 and 60000",
            );
        }
        match ReadFrom::parse(&s.read_from.value) {
            Some(ReadFrom::Primary | ReadFrom::Replica) => {}
            Some(ReadFrom::Nearest) => problem(
                &s.read_from.referenced,
                "upstream.sentinel.read_from",
                "nearest is not supported in sentinel mode (no round trips are measured to \
                 sentinel replicas); use primary or replica",
            ),
            None => problem(
                &s.read_from.referenced,
                "upstream.sentinel.read_from",
                "must be primary or replica",
            ),
        }
        if u.address.referenced.line() > 0
            || u.address.value != UpstreamConfig::default().address.value
        {
            problem(
                &u.address.referenced,
                "upstream.address",
                "is not used when upstream.mode is sentinel; the sentinels name the primary",
            );
        }
        // The primary moves between hosts, so no host of the file can be the name its
        // certificate is checked against: it has to be given.
        if let Some(tls) = &u.tls {
            if tls.server_name.is_none() {
                problem(
                    &tls.ca_file.referenced,
                    "upstream.tls.server_name",
                    "is required when upstream.mode is sentinel (the primary's host changes \
                     on failover)",
                );
            }
        }
    }

    /// The cluster seeds in cluster mode, the sentinels in sentinel mode, else
    /// `upstream.address` alone.
    pub(crate) fn upstream_nodes(&self) -> Vec<String> {
        let u = &self.upstream;
        match (&u.mode.value, &u.cluster, &u.sentinel) {
            (UpstreamMode::Cluster, Some(c), _) => {
                c.seeds.iter().map(|s| s.value.clone()).collect()
            }
            (UpstreamMode::Sentinel, _, Some(s)) => {
                s.sentinels.iter().map(|s| s.value.clone()).collect()
            }
            _ => vec![u.address.value.clone()],
        }
    }

    /// The host TLS certificates are checked against by default: the first upstream node's.
    pub(crate) fn tls_host(&self) -> String {
        let nodes = self.upstream_nodes();
        let first = nodes.first().map_or("", String::as_str);
        first.rsplit_once(':').map_or("", |(h, _)| h).to_string()
    }

    /// Sets a value that came from the command line, which has no line in the file.
    pub fn set_listen(&mut self, listen: String) {
        self.listen = located(listen);
        self.overridden.push("listen");
    }

    /// Sets the upstream address from the command line.
    pub fn set_upstream(&mut self, address: String) {
        self.upstream.address = located(address);
        self.overridden.push("upstream.address");
    }

    /// Sets the admin endpoint's address (or `off`) from the command line.
    pub fn set_admin(&mut self, listen: String) {
        self.admin.listen = located(listen);
        self.overridden.push("admin.listen");
    }

    /// The settings that differ between `self` (the file the proxy started with) and `new` (the
    /// file now) and are read only at start, so a reload cannot apply them: `listen`, `tls`,
    /// `upstream`, `upstreams`, `routes` (and with routes the namespaces), `limits`, `admin`
    /// (all but `denial_logs_per_second`), `workers`, `shutdown_grace_ms`, `log_level`,
    /// `audit`, `keyspace`. Compared by value: moving a line changes nothing.
    /// `upstream` without what a reload applies live: a standalone upstream's address (a
    /// cutover, `mirror::cutover`).
    fn upstream_but_switchable(&self) -> UpstreamConfig {
        let mut upstream = self.upstream.clone();
        if upstream.mode.value == UpstreamMode::Standalone && !self.has_routes() {
            upstream.address = located(String::new());
        }
        upstream
    }

    pub fn restart_needed(&self, new: &Config) -> Vec<&'static str> {
        let differs = |a: &dyn fmt::Debug, b: &dyn fmt::Debug| {
            without_locations(&format!("{a:?}")) != without_locations(&format!("{b:?}"))
        };
        let admin = |a: &AdminConfig| {
            (
                a.listen.value.clone(),
                a.slowlog_threshold_us.value,
                a.slowlog_max_len.value,
            )
        };
        [
            ("listen", differs(&self.listen.value, &new.listen.value)),
            ("tls", differs(&self.tls, &new.tls)),
            (
                "upstream",
                differs(
                    &self.upstream_but_switchable(),
                    &new.upstream_but_switchable(),
                ),
            ),
            ("upstreams", differs(&self.upstreams, &new.upstreams)),
            ("routes", differs(&self.routes, &new.routes)),
            // The route table enters each route's prefixes behind every namespace.
            (
                "access.namespaces (with routes)",
                self.has_routes() && differs(&self.access.namespaces, &new.access.namespaces),
            ),
            ("limits", differs(&self.limits, &new.limits)),
            ("admin", admin(&self.admin) != admin(&new.admin)),
            ("workers", self.workers.value != new.workers.value),
            (
                "shutdown_grace_ms",
                self.shutdown_grace_ms.value != new.shutdown_grace_ms.value,
            ),
            ("log_level", self.log_level.value != new.log_level.value),
            ("audit", differs(&self.audit, &new.audit)),
            ("keyspace", differs(&self.keyspace, &new.keyspace)),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }
}

fn valid_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_all_defaults() {
        let c = Config::from_yaml("", Path::new("x.yaml")).unwrap();
        assert_eq!(c.listen.value, "127.0.0.1:6380");
        assert_eq!(c.upstream.address.value, "127.0.0.1:6379");
    }

    #[test]
    fn typo_names_the_field_and_line() {
        let err = Config::from_yaml(
            "listen: 127.0.0.1:1\nupstream:\n  adress: 127.0.0.1:2\n",
            Path::new("p.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("p.yaml"), "{err}");
        assert!(err.contains("adress"), "{err}");
        assert!(err.contains('3'), "line 3 expected: {err}");
    }

    #[test]
    fn every_invalid_value_is_reported() {
        let err = Config::from_yaml(
            "listen: nowhere\nupstream:\n  connections: 0\nlimits:\n  max_inflight: 0\n",
            Path::new("p.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("p.yaml:1: field `listen`"), "{err}");
        assert!(
            err.contains("p.yaml:3: field `upstream.connections`"),
            "{err}"
        );
        assert!(
            err.contains("p.yaml:5: field `limits.max_inflight`"),
            "{err}"
        );
    }

    #[test]
    fn cluster_mode_needs_seeds_and_sane_bounds() {
        let ok = Config::from_yaml(
            "upstream:\n  mode: cluster\n  cluster:\n    seeds: [127.0.0.1:7000, node2:7001]\n",
            Path::new("c.yaml"),
        )
        .unwrap();
        assert_eq!(ok.upstream.mode.value, UpstreamMode::Cluster);
        assert_eq!(ok.upstream_nodes(), ["127.0.0.1:7000", "node2:7001"]);
        let c = ok.upstream.cluster.as_ref().unwrap();
        assert_eq!(
            (c.refresh_interval_ms.value, c.max_redirects.value),
            (10_000, 5)
        );

        let err = Config::from_yaml("upstream:\n  mode: cluster\n", Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("c.yaml:2: field `upstream.cluster.seeds`: must list at least one"),
            "{err}"
        );

        let err = Config::from_yaml(
            "upstream:\n  mode: cluster\n  address: 127.0.0.1:1\n  cluster:\n    seeds:\n      - nowhere\n    refresh_interval_ms: 5\n    max_redirects: 0\n    resubscribe_timeout_ms: 0\n",
            Path::new("c.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("c.yaml:3: field `upstream.address`: is not used"),
            "{err}"
        );
        assert!(
            err.contains("c.yaml:6: field `upstream.cluster.seeds[0]`"),
            "{err}"
        );
        assert!(
            err.contains("c.yaml:7: field `upstream.cluster.refresh_interval_ms`"),
            "{err}"
        );
        assert!(
            err.contains("c.yaml:8: field `upstream.cluster.max_redirects`"),
            "{err}"
        );
        assert!(
            err.contains(
                "c.yaml:9: field `upstream.cluster.resubscribe_timeout_ms`: must be between 100"
            ),
            "{err}"
        );

        let mut from_cli = ok.clone();
        from_cli.set_upstream("10.0.0.1:6379".to_string());
        let err = from_cli
            .validate(Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("c.yaml: field `upstream.address`: is not used"),
            "{err}"
        );

        assert_eq!(c.read_from(), ReadFrom::Primary);
        for (text, want) in [
            ("replica", ReadFrom::Replica),
            ("nearest", ReadFrom::Nearest),
        ] {
            let c = Config::from_yaml(
                &format!(
                    "upstream:\n  mode: cluster\n  cluster:\n    seeds: [127.0.0.1:7000]\n    read_from: {text}\n"
                ),
                Path::new("c.yaml"),
            )
            .unwrap();
            assert_eq!(c.upstream.cluster.unwrap().read_from(), want);
        }
        let err = Config::from_yaml(
            "upstream:\n  mode: cluster\n  cluster:\n    seeds: [127.0.0.1:7000]\n    read_from: replicas\n",
            Path::new("c.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains(
                "c.yaml:5: field `upstream.cluster.read_from`: must be primary, replica or nearest"
            ),
            "{err}"
        );

        let err = Config::from_yaml(
            "upstream:\n  cluster:\n    seeds: [127.0.0.1:7000]\n",
            Path::new("c.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("c.yaml:3: field `upstream.cluster`: is only used"),
            "{err}"
        );

        let err = Config::from_yaml("upstream:\n  mode: sharded\n", Path::new("c.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sharded") && err.contains("c.yaml"), "{err}");

        let err = Config::from_yaml(
            "upstream:\n  mode: cluster\n  cluster:\n    seeds: [127.0.0.1:7000]\n    sedes: []\n",
            Path::new("c.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("sedes"), "{err}");
    }

    #[test]
    fn sentinel_mode_needs_sentinels_and_a_name() {
        let ok = Config::from_yaml(
            "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [10.0.0.1:26379, s2:26379]\n    master_name: mymaster\n",
            Path::new("s.yaml"),
        )
        .unwrap();
        let sentinel = ok.upstream.sentinel.as_ref().unwrap();
        let sentinels: Vec<&str> = sentinel
            .sentinels
            .iter()
            .map(|s| s.value.as_str())
            .collect();
        assert_eq!(sentinels, ["10.0.0.1:26379", "s2:26379"]);
        assert_eq!(sentinel.master_name.as_ref().unwrap().value, "mymaster");
        assert_eq!(sentinel.timeout_ms.value, 1000);

        let err = Config::from_yaml("upstream:\n  mode: sentinel\n", Path::new("s.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s.yaml:2: field `upstream.sentinel`: must give `sentinels`"),
            "{err}"
        );

        let err = Config::from_yaml(
            "upstream:\n  mode: sentinel\n  address: 127.0.0.1:1\n  sentinel:\n    sentinels:\n      - nowhere\n    timeout_ms: 0\n",
            Path::new("s.yaml"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "s.yaml:3: field `upstream.address`: is not used when upstream.mode is sentinel",
            "s.yaml:6: field `upstream.sentinel.sentinels[0]`",
            "s.yaml:7: field `upstream.sentinel.timeout_ms`",
            "s.yaml:2: field `upstream.sentinel.master_name`: is required",
        ] {
            assert!(err.contains(want), "missing {want:?} in {err}");
        }

        let err = Config::from_yaml(
            "upstream:\n  sentinel:\n    sentinels: [127.0.0.1:26379]\n    master_name: m\n",
            Path::new("s.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("s.yaml:3: field `upstream.sentinel`: is only used"),
            "{err}"
        );

        let err = Config::from_yaml(
            "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [127.0.0.1:26379]\n    master_nme: m\n",
            Path::new("s.yaml"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("master_nme") && err.contains('5'), "{err}");
    }

    #[test]
    fn sentinel_read_from_is_primary_or_replica() {
        let base = "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [127.0.0.1:26379]\n    master_name: m\n";
        let c = Config::from_yaml(base, Path::new("s.yaml")).unwrap();
        assert_eq!(
            c.upstream.sentinel.unwrap().read_from(),
            ReadFrom::Primary,
            "default"
        );
        let c = Config::from_yaml(
            &format!("{base}    read_from: replica\n"),
            Path::new("s.yaml"),
        )
        .unwrap();
        assert_eq!(c.upstream.sentinel.unwrap().read_from(), ReadFrom::Replica);
        for (value, want) in [
            ("nearest", "nearest is not supported in sentinel mode"),
            ("replicas", "must be primary or replica"),
        ] {
            let err = Config::from_yaml(
                &format!("{base}    read_from: {value}\n"),
                Path::new("s.yaml"),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains(&format!(
                    "s.yaml:6: field `upstream.sentinel.read_from`: {want}"
                )),
                "{err}"
            );
        }
    }
}
