//! `upstream:` (and each of `upstreams:`): how to reach and authenticate to a Redis, in which
//! mode (standalone, Sentinel, cluster), and the connections kept to it.

use std::path::PathBuf;

use serde::Deserialize;
use serde_saphyr::Location;

use super::dedicated_caps::DedicatedCapsConfig;
use super::problem::{Located, Problem, located};

/// How to reach and authenticate to the upstream Redis.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Whether the upstream is one Redis (`address`), a Redis Cluster (`cluster.seeds`) or a
    /// Sentinel-managed primary (`sentinel`); an explicit switch rather than guessing from the
    /// server, so a misconfigured deployment fails at start instead of answering MOVED to
    /// clients that cannot follow it, or writing to a node that is no longer the primary.
    pub(crate) mode: Located<UpstreamMode>,
    /// `host:port` of the standalone Redis.
    pub address: Located<String>,
    /// How to find and follow a Redis Cluster; required when `mode` is `cluster`, refused
    /// otherwise so a forgotten `mode` line is not silently ignored.
    pub cluster: Option<ClusterConfig>,
    /// How to find and follow a Sentinel-managed primary; required when `mode` is `sentinel`,
    /// refused otherwise, for the same reason as `cluster`.
    pub sentinel: Option<SentinelConfig>,
    /// ACL user the proxy authenticates as; `None` uses Redis's `default` user.
    pub username: Option<String>,
    /// Password for the upstream user; kept out of logs and `Debug` output of errors. Set
    /// from `password_env` or `password_file` when one of those is given instead.
    pub password: Option<String>,
    /// The environment variable holding `username` (instead of writing it in the file).
    pub(crate) username_env: Option<Located<String>>,
    /// The environment variable holding the password, so the policy file holds no secret
    /// (Kubernetes `secretKeyRef`, systemd `EnvironmentFile`). Read when the file is loaded.
    pub password_env: Option<Located<String>>,
    /// A file holding the password (a mounted Kubernetes or Docker secret); one trailing
    /// newline is removed. Read when the file is loaded.
    pub password_file: Option<Located<PathBuf>>,
    /// Shared pipelined connections per RESP version. Few connections let Redis batch many
    /// clients' commands per read, which is where a proxy can beat direct connections.
    pub connections: Located<usize>,
    /// Bound on connect + handshake so a dead host fails fast instead of hanging clients.
    pub connect_timeout_ms: Located<u64>,
    /// First reconnect delay after a failure; doubles up to `reconnect_max_ms`.
    pub reconnect_min_ms: Located<u64>,
    /// Cap on the reconnect delay, which bounds how long a recovered upstream stays unused.
    pub reconnect_max_ms: Located<u64>,
    /// Commands queued per shared connection before clients wait; bounds memory when the
    /// upstream is slower than the clients.
    pub queue_depth: Located<usize>,
    /// Longest wait for a reply on any upstream connection, shared or dedicated, before it is
    /// declared dead and its unanswered commands get an error (a stopped or cut-off Redis must
    /// not hang clients); 0 waits forever. Above Redis's own busy-script limit (5 s) so a slow
    /// script is not mistaken for a dead server. A blocking command gets its own timeout on
    /// top (none when that is 0); a subscriber's wait between messages is never timed.
    pub command_timeout_ms: Located<u64>,
    /// Most dedicated connections (blocking commands, MULTI, WATCH, subscribers, another
    /// user's AUTH) per upstream node, the warm ones included, so clients that each pin one
    /// cannot use up Redis's `maxclients` for the proxy's own shared connections.
    pub dedicated_max: Located<usize>,
    /// Dedicated connections kept connected and logged in per RESP version in use: a command
    /// that needs one is sent at once, so it reaches Redis before a command another client
    /// sends after it (dialled on demand, it would arrive a handshake later).
    pub dedicated_warm: Located<usize>,
    /// How long a command waits for a dedicated connection when `dedicated_max` are in use,
    /// before it gets an error.
    pub dedicated_wait_ms: Located<u64>,
    /// Each tenant's share of `dedicated_max` (`dedicated_caps`).
    pub(crate) dedicated_caps: DedicatedCapsConfig,
    /// Scripts (EVAL, EVALSHA, FCALL and their `_RO` forms) run on the client's dedicated
    /// connection, so a busy script holds only its own client, as in Redis (others get
    /// `-BUSY`, `SCRIPT KILL` gets through). `false` pipelines them on the shared connection:
    /// cheaper for script-heavy clients, but a script running past `busy-reply-threshold`
    /// then holds every client on that connection, and past `command_timeout_ms` fails them.
    pub(crate) scripts_on_dedicated: Located<bool>,
    /// TLS to the upstream; plain TCP when absent.
    pub(crate) tls: Option<TlsConfig>,
    /// What the upstream holds, for the eviction check (docs/operations.md, Eviction
    /// awareness): `cache` (everything may be evicted), `queue` (nothing may be) or `mixed`
    /// (both; the default). Until routes exist, one role for the one upstream.
    pub(crate) role: Located<UpstreamRole>,
    /// How often the upstream's `maxmemory`, `maxmemory-policy` and memory use are read and
    /// checked against `role` and the TTL rule (also at start and after each reload); 0 never.
    pub(crate) memory_check_ms: Located<u64>,
    /// Request coalescing: identical concurrent read-only single-key commands (GET,
    /// HGETALL… from any clients) share one upstream reply while one is in flight, so a hot
    /// key costs Redis one command per round trip instead of one per client. Off by default;
    /// standalone upstreams only (also under `upstreams:`, so one route may coalesce and
    /// another not; not yet in front of a cluster or Sentinel).
    pub(crate) coalesce_reads: Located<bool>,
    /// How scripts are kept within the deny rules (a proxy cannot read Lua, and Redis runs a
    /// script as the user of its connection): `confine` (the default) runs them on dedicated
    /// connections logged in as a user the proxy manages, its own user's rights minus the
    /// denied commands (`script_user`); `check` runs them as the proxy's user and warns (log,
    /// metric, `/readyz`) when a script could run a denied command; `apply` sets the proxy's
    /// own user's ACL to remove the denied commands (`--print-acl` prints it); `off` does
    /// nothing.
    pub(crate) script_acl: Located<ScriptAclMode>,
    /// Under `script_acl: confine`, what a script gets when it cannot run as the script user
    /// (the proxy's user may not read or set ACLs, Redis before 7, a client logged in as
    /// another upstream user): `refuse` (the default) answers an error naming why; `run` runs
    /// it as the proxy's own user, unconfined, as the start-up warning says. An explicit
    /// choice, because the second lets scripts do what the policy denies.
    pub unconfined_scripts: Located<UnconfinedScripts>,
    /// The database selected on every connection: a route's `db:`, set by
    /// [`Config::for_upstream`](super::Config::for_upstream); never read from the file, where a client's SELECT says it.
    #[serde(skip)]
    pub(crate) db: u16,
}

/// How scripts are kept within the deny rules (see [`UpstreamConfig::script_acl`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ScriptAclMode {
    /// Scripts run as a user the proxy manages: its own user's rights minus the denied
    /// commands (`script_user`).
    #[default]
    Confine,
    /// Scripts run as the proxy's user; ask Redis (`ACL DRYRUN`) whether it may run each
    /// denied command, and warn if so.
    Check,
    /// Remove the denied commands from the proxy's own user (`ACL SETUSER`, removals only),
    /// then check.
    Apply,
    /// Neither: for a Redis without ACLs or a user that may not run ACL DRYRUN.
    Off,
}

/// What a script that cannot run confined gets (see [`UpstreamConfig::unconfined_scripts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnconfinedScripts {
    /// An error saying why.
    #[default]
    Refuse,
    /// Runs as the proxy's own user, beyond the deny rules.
    Run,
}

/// What the upstream's data is for (`upstream.role`), which decides which eviction policies
/// fit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum UpstreamRole {
    /// Data that can be rebuilt: should evict (`allkeys-*`) under a `maxmemory`.
    Cache,
    /// Data that must not vanish (queues, streams, sessions of record): `noeviction`.
    Queue,
    /// Both in one Redis: only keys with a TTL should go (`volatile-*` with the TTL rule
    /// enforced).
    #[default]
    Mixed,
}

impl UpstreamRole {
    /// The name used in the file, INFO and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            UpstreamRole::Cache => "cache",
            UpstreamRole::Queue => "queue",
            UpstreamRole::Mixed => "mixed",
        }
    }
}

/// What kind of upstream the proxy fronts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum UpstreamMode {
    /// One Redis server at `upstream.address`.
    #[default]
    Standalone,
    /// A Redis Cluster: commands are routed by key slot to the owning primary.
    Cluster,
    /// A primary monitored by Redis Sentinel: the sentinels say where it is, failovers are
    /// followed.
    Sentinel,
}

/// Settings of a Sentinel-managed upstream. Login, TLS, connection counts, timeouts and queue
/// depths come from `upstream` and apply to the primary; the sentinels themselves are asked
/// over plain TCP without a password.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SentinelConfig {
    /// `host:port` of the sentinels, asked in order; several, so one dead sentinel does not
    /// stop the proxy from finding the primary.
    pub(crate) sentinels: Vec<Located<String>>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> …`).
    /// Optional in the type only so that a missing name is reported with the other problems.
    pub(crate) master_name: Option<Located<String>>,
    /// Bound on connecting to one sentinel and on each of its replies, so a dead or
    /// partitioned sentinel delays finding the primary by at most this.
    pub(crate) timeout_ms: Located<u64>,
    /// Where read-only commands go: `primary` (default: no replica is ever contacted) or
    /// `replica` (the replicas the sentinels list, docs/sentinel.md). A string, checked in
    /// `validate`, for a file/line/field message; `nearest` is refused there (no probing of
    /// sentinel replicas is built).
    pub read_from: Located<String>,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        SentinelConfig {
            sentinels: Vec::new(),
            master_name: None,
            timeout_ms: located(1_000),
            read_from: located("primary".to_string()),
        }
    }
}

impl SentinelConfig {
    /// `read_from` as validated (`primary` for a value `validate` would have refused).
    pub(crate) fn read_from(&self) -> ReadFrom {
        match ReadFrom::parse(&self.read_from.value) {
            Some(ReadFrom::Replica) => ReadFrom::Replica,
            _ => ReadFrom::Primary,
        }
    }
}

/// Settings of a Redis Cluster upstream. Login, TLS, connection counts, timeouts and queue
/// depths come from `upstream` and apply to every node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Nodes asked for the topology at start (any node of the cluster will do; several so one
    /// dead seed does not stop the proxy). Later refreshes ask the known nodes first.
    pub(crate) seeds: Vec<Located<String>>,
    /// How often the slot map is refreshed when nothing prompts it; MOVED replies and failed
    /// nodes trigger a refresh sooner, so this only bounds how stale an idle proxy gets.
    pub(crate) refresh_interval_ms: Located<u64>,
    /// Redirections (MOVED/ASK) followed for one command before the client gets an error,
    /// which ends loops between nodes that disagree while the cluster settles.
    pub max_redirects: Located<u32>,
    /// Where read-only commands go: `primary` (default), `replica` or `nearest` (see
    /// [`ReadFrom`]). A string here, checked in `validate`, so a bad value is reported with
    /// file, line and field like every other problem instead of as a parse error.
    pub(crate) read_from: Located<String>,
    /// How long the proxy keeps trying to subscribe a shard channel again after its node
    /// dropped it (slot moved, node failed) before telling the client the channel is gone:
    /// long enough for a failover, which takes Redis's `cluster-node-timeout` (15 s by
    /// default) and more. Retries run in the background; the session keeps serving.
    pub(crate) resubscribe_timeout_ms: Located<u64>,
}

/// Where read-only commands go (`upstream.cluster.read_from`, and `upstream.sentinel.read_from`
/// without `nearest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ReadFrom {
    /// Every command to the slot's primary: consistent reads, no replica connections.
    #[default]
    Primary,
    /// Read-only commands outside transactions to a replica of the slot's shard (one per
    /// client), the primary when the shard has no replica up: spreads reads, which may be
    /// stale.
    Replica,
    /// Read-only commands to whichever copy of the shard, primary or replica, answered the
    /// proxy's latest probe fastest; stale like `replica` whenever a replica is chosen.
    Nearest,
}

impl ReadFrom {
    /// The value as written in the file; `None` for anything else.
    pub(crate) fn parse(s: &str) -> Option<ReadFrom> {
        match s {
            "primary" => Some(ReadFrom::Primary),
            "replica" => Some(ReadFrom::Replica),
            "nearest" => Some(ReadFrom::Nearest),
            _ => None,
        }
    }

    /// The name used in the file, INFO and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReadFrom::Primary => "primary",
            ReadFrom::Replica => "replica",
            ReadFrom::Nearest => "nearest",
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            seeds: Vec::new(),
            refresh_interval_ms: located(10_000),
            max_redirects: located(5),
            read_from: located("primary".to_string()),
            resubscribe_timeout_ms: located(30_000),
        }
    }
}

impl ClusterConfig {
    /// `read_from` as validated (`primary` for a value `validate` would have refused).
    pub(crate) fn read_from(&self) -> ReadFrom {
        ReadFrom::parse(&self.read_from.value).unwrap_or_default()
    }
}

/// TLS settings for upstream connections.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsConfig {
    /// PEM file of the CA certificates that sign the upstream's certificate. Required: the
    /// proxy never connects to an upstream it cannot verify.
    pub(crate) ca_file: Located<PathBuf>,
    /// Name the upstream certificate must carry; defaults to the host of `upstream.address`.
    #[serde(default)]
    pub(crate) server_name: Option<String>,
    /// Client certificate chain (PEM) for upstreams that require mutual TLS.
    #[serde(default)]
    pub(crate) cert_file: Option<PathBuf>,
    /// Private key (PEM) for `cert_file`.
    #[serde(default)]
    pub(crate) key_file: Option<PathBuf>,
}

impl UpstreamConfig {
    /// Reads `username_env`, `password_env` and `password_file` into `username` and
    /// `password`; what cannot be read (a variable not set or empty, a file missing,
    /// unreadable or empty) or is given twice is a problem at the field's line. `at` is the
    /// section's dotted name (`upstream`, `upstreams.cache`).
    pub(super) fn resolve_secrets(&mut self, at: &str) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut problem = |loc: &Location, field: &str, message: String| {
            problems.push(Problem {
                line: loc.line(),
                field: format!("{at}.{field}"),
                message,
            })
        };
        let sources = usize::from(self.password.is_some())
            + usize::from(self.password_env.is_some())
            + usize::from(self.password_file.is_some());
        if sources > 1 {
            let loc = self
                .password_env
                .as_ref()
                .map(|v| v.referenced)
                .or(self.password_file.as_ref().map(|v| v.referenced))
                .unwrap_or(Location::UNKNOWN);
            problem(
                &loc,
                "password",
                "give one of password, password_env and password_file".into(),
            );
            return problems;
        }
        let from_env = |var: &Located<String>, what: &str| match std::env::var(&var.value) {
            Ok(v) if !v.is_empty() => Ok(v),
            Ok(_) => Err(format!(
                "the environment variable {} that should hold the upstream {what} is empty",
                var.value
            )),
            Err(std::env::VarError::NotPresent) => Err(format!(
                "the environment variable {} that should hold the upstream {what} is not set \
                 in the proxy's environment",
                var.value
            )),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!(
                "the environment variable {} that should hold the upstream {what} is not UTF-8",
                var.value
            )),
        };
        if let Some(var) = &self.username_env {
            if self.username.is_some() {
                problem(
                    &var.referenced,
                    "username_env",
                    "give username or username_env, not both".into(),
                );
            } else {
                match from_env(var, "username") {
                    Ok(v) => self.username = Some(v),
                    Err(why) => problem(&var.referenced, "username_env", why),
                }
            }
        }
        if let Some(var) = &self.password_env {
            match from_env(var, "password") {
                Ok(v) => self.password = Some(v),
                Err(why) => problem(&var.referenced, "password_env", why),
            }
        }
        if let Some(file) = &self.password_file {
            let path = file.value.display();
            match std::fs::read_to_string(&file.value) {
                Ok(text) => {
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    let text = text.strip_suffix('\r').unwrap_or(text);
                    if text.is_empty() {
                        problem(
                            &file.referenced,
                            "password_file",
                            format!("{path} is empty; it should hold the upstream password"),
                        );
                    } else {
                        self.password = Some(text.to_string());
                    }
                }
                Err(e) => problem(
                    &file.referenced,
                    "password_file",
                    format!("cannot read the upstream password from {path}: {e}"),
                ),
            }
        }
        problems
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            mode: located(UpstreamMode::Standalone),
            address: located("127.0.0.1:6379".to_string()),
            cluster: None,
            sentinel: None,
            username: None,
            password: None,
            username_env: None,
            password_env: None,
            password_file: None,
            connections: located(1),
            connect_timeout_ms: located(2_000),
            reconnect_min_ms: located(50),
            reconnect_max_ms: located(2_000),
            queue_depth: located(1024),
            command_timeout_ms: located(10_000),
            dedicated_max: located(10_000),
            dedicated_warm: located(4),
            dedicated_wait_ms: located(1_000),
            dedicated_caps: DedicatedCapsConfig::default(),
            scripts_on_dedicated: located(true),
            tls: None,
            role: located(UpstreamRole::Mixed),
            memory_check_ms: located(60_000),
            coalesce_reads: located(false),
            script_acl: located(ScriptAclMode::Confine),
            unconfined_scripts: located(UnconfinedScripts::Refuse),
            db: 0,
        }
    }
}
