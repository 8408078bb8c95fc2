//! The `rules:` section of a policy file: what an operator writes, as plain data (the
//! compiled rules are `policy`'s; `policy::config` re-exports this module).
//!
//! Each rule has an `id` (it names the rule in every refusal, log line and metric), a `mode`
//! (`enforce` or `audit`), an optional `message` (the better pattern to suggest), and exactly
//! one kind. Kinds are optional fields rather than a tagged enum so that a typo is reported by
//! `deny_unknown_fields` with its line, and "no kind" or "two kinds" gets a message naming the
//! rule.

use serde::Deserialize;
use serde_saphyr::Spanned;

/// `access:` — who the clients are. Without users, every client is anonymous and the
/// upstream checks AUTH itself; with users, the proxy checks AUTH and the upstream never sees
/// client credentials.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Access {
    /// Proxy-side users, for `AUTH user pass` and `HELLO … AUTH user pass`.
    #[serde(default)]
    pub(crate) users: Vec<UserConfig>,
    /// Users a verified TLS client certificate logs in as, without a password: a client
    /// whose certificate names one of these (subject CN, or a DNS, URI or e-mail SAN) is that
    /// user from its first command, and `identities` map it to a tenant like any user.
    #[serde(default)]
    pub(crate) cert_users: Vec<String>,
    /// Which tenant a client belongs to, first match wins: by AUTH user and/or address.
    #[serde(default)]
    pub(crate) identities: Vec<IdentityConfig>,
    /// Refuse every command but AUTH/HELLO AUTH/QUIT/RESET until the client authenticates.
    #[serde(default)]
    pub(crate) require_auth: bool,
    /// Key prefix per tenant: every key the tenant names is stored under it, and commands
    /// whose key access cannot be confined to it are refused for that tenant.
    #[serde(default)]
    pub(crate) namespaces: std::collections::BTreeMap<String, String>,
    /// SHA1 digests (`sha1sum script.lua`) of the Lua scripts namespaced tenants may run with
    /// EVAL/EVALSHA; their declared keys get the prefix. Reviewing that a script touches only
    /// its declared keys is the operator's part of the bargain.
    #[serde(default)]
    pub(crate) scripts: Vec<String>,
    /// Tenants allowed the `PROXY` command family (INFO, POLICY, RELOAD, SLOWLOG): operators.
    #[serde(default)]
    pub(crate) admin_tenants: Vec<String>,
}

/// A proxy-side user.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserConfig {
    /// The AUTH username.
    pub(crate) name: String,
    /// Hex SHA-256 of the password (`printf %s 'secret' | sha256sum`): the file never holds
    /// the password itself.
    pub(crate) password_sha256: Spanned<String>,
}

/// One identity rule: clients matching every given condition belong to `tenant`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdentityConfig {
    /// The tenant's name, used by rules' `tenants:` and `except_tenants:`.
    pub(crate) tenant: Spanned<String>,
    /// Authenticated as this proxy user.
    #[serde(default)]
    pub(crate) user: Option<String>,
    /// Connecting from this network (`10.0.0.0/8`, `127.0.0.1/32`, `::1/128`).
    #[serde(default)]
    pub(crate) cidr: Option<String>,
}

/// One rule as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Names the rule in refusals (`-NOPERM policy <id>: …`), logs and metrics.
    pub id: Spanned<String>,
    /// `enforce` refuses; `audit` only logs and counts, so a policy can be rolled out safely.
    #[serde(default)]
    pub mode: Mode,
    /// With `mode: enforce`: enforce for this share of clients only (`10%`), audit for the
    /// rest, so a rule goes out to 1%, 10%, 100%. Clients are chosen by `share_by`.
    #[serde(default)]
    pub(crate) share: Option<Spanned<String>>,
    /// Which identity `share` picks by: `address` (default: each client IP), `tenant` or
    /// `user`.
    #[serde(default)]
    pub(crate) share_by: Option<Spanned<ShareBy>>,
    /// The better pattern, shown to the client in the refusal.
    #[serde(default)]
    pub message: Option<String>,
    /// Apply only to clients of these tenants.
    #[serde(default)]
    pub(crate) tenants: Option<Vec<String>>,
    /// Apply to every tenant but these (e.g. `[admin]`).
    #[serde(default)]
    pub(crate) except_tenants: Option<Vec<String>>,
    /// Apply only to commands with a key in these routes (`routes:` of the config), or
    /// without keys.
    #[serde(default)]
    pub(crate) routes: Option<Vec<String>>,
    /// Deny these commands (`KEYS`, `config|set`) and categories (`@dangerous`); each with
    /// its line, so a misspelt one in a long block list is reported where it is written.
    #[serde(default)]
    pub(crate) deny: Option<Spanned<Vec<Spanned<String>>>>,
    /// Deny commands newer than the built-in Redis 7.0 table (learned from the server at
    /// connect) that the server puts in any of these categories (`[@admin, @dangerous]`).
    #[serde(default)]
    pub(crate) deny_newer_in: Option<Spanned<Vec<String>>>,
    /// With `deny_newer_in`: newer commands allowed by name (`commandlog|get`).
    #[serde(default)]
    pub(crate) allow_newer: Option<Spanned<Vec<String>>>,
    /// With `deny`: the command is allowed when one of its arguments is this word
    /// (`FLUSHALL ASYNC`).
    #[serde(default)]
    pub(crate) unless_arg: Option<String>,
    /// Refuse SCAN/SSCAN/HSCAN/ZSCAN with a `COUNT` above this.
    #[serde(default)]
    pub(crate) max_scan_count: Option<Spanned<u64>>,
    /// Refuse reads whose arguments do not bound what they return (`LRANGE k 0 -1`, `ZRANGE k
    /// 0 -1`, BYSCORE/BYLEX without LIMIT, XRANGE without COUNT, HGETALL, SMEMBERS…).
    #[serde(default)]
    pub(crate) deny_unbounded_reads: Option<Spanned<bool>>,
    /// Refuse reads that can return more elements than this (`LRANGE k 0 999999999`,
    /// `SRANDMEMBER k -1000000`), and the unbounded ones too: one bound for every range read.
    #[serde(default)]
    pub(crate) max_range: Option<Spanned<u64>>,
    /// Refuse a write whose value argument is larger than this many bytes.
    #[serde(default)]
    pub(crate) max_value_bytes: Option<Spanned<u64>>,
    /// Refuse a command naming more keys than this.
    #[serde(default)]
    pub(crate) max_keys: Option<Spanned<u64>>,
    /// Sliding-window rate limit per client.
    #[serde(default)]
    pub(crate) rate_limit: Option<Spanned<RateLimitConfig>>,
    /// Every key gets a TTL: default by key prefix, a maximum, PERSIST refused.
    #[serde(default)]
    pub ttl: Option<Spanned<TtlConfig>>,
    /// XADD without MAXLEN/MINID gets `MAXLEN ~ <n>`: streams stay capped.
    #[serde(default)]
    pub stream_maxlen: Option<Spanned<u64>>,
    /// Every key must match this regular expression (e.g. `^[a-z]+(:[A-Za-z0-9_-]+)+$`).
    #[serde(default)]
    pub(crate) key_pattern: Option<Spanned<String>>,
    /// Which Lua scripts and functions may run: all, only listed ones, or none.
    #[serde(default)]
    pub(crate) scripts: Option<Spanned<ScriptsConfig>>,
}

/// `scripts:` — which scripts (EVAL/EVALSHA, by the SHA1 of the body) and functions (FCALL,
/// by name) the rule's tenants may run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptsConfig {
    /// `all`, `listed` (only `sha1` and `functions`) or `none`.
    pub(crate) allow: ScriptsAllow,
    /// SHA1 digests of the reviewed scripts (`sha1sum script.lua`, or what SCRIPT LOAD says).
    #[serde(default)]
    pub(crate) sha1: Vec<String>,
    /// Names of the reviewed functions (`redis.register_function('name', …)`).
    #[serde(default)]
    pub(crate) functions: Vec<String>,
}

/// What a `scripts` rule lets run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ScriptsAllow {
    /// Every script and function.
    All,
    /// Only the listed SHA1s and function names; registering code is refused.
    Listed,
    /// No scripting at all.
    None,
}

/// `ttl:` — durations are written `500ms`, `30s`, `15m`, `24h`, `7d`, or `none` (never forced).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtlConfig {
    /// TTL for a written key that has none and matches no prefix.
    pub(crate) default: String,
    /// TTL by key prefix, longest prefix first wins (`session:` 24h, `lock:` none…).
    #[serde(default)]
    pub(crate) prefixes: Vec<PrefixTtl>,
    /// Longer TTLs (EX/PX, EXPIRE, SETEX…) are cut to this.
    #[serde(default)]
    pub(crate) max: Option<String>,
    /// Refuse PERSIST and GETEX PERSIST, which would leave a key without a TTL.
    #[serde(default)]
    pub(crate) deny_persist: bool,
    /// Which keys get the TTL: those a write creates, or every key written without one. No
    /// default: in front of existing data the difference is whether persistent keys start to
    /// expire, which an operator must choose knowingly.
    #[serde(default)]
    pub(crate) keys: Option<TtlKeys>,
    /// Spread of forced TTLs, as a fraction (0 to 0.9): a key gets its forced TTL shortened by
    /// up to this part of it, by a hash of its name, so keys written together (a cache filled
    /// at start, a batch job) do not all expire in the same second and stampede the backend.
    #[serde(default)]
    pub(crate) jitter: Option<f64>,
}

/// Which keys a `ttl` rule gives a TTL (see policy/README.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TtlKeys {
    /// Keys a write creates; a key that existed without a TTL keeps none (detected by a
    /// hidden script before the write and one after it).
    Created,
    /// Every key a write touches that has no TTL, keys that existed before included.
    Written,
}

/// One `prefixes:` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrefixTtl {
    /// Key prefix, matched byte for byte.
    pub(crate) prefix: String,
    /// Duration or `none`.
    pub(crate) ttl: String,
}

/// Parses `500ms`, `30s`, `15m`, `24h`, `7d` into milliseconds; `none` is `Ok(None)`.
pub(crate) fn parse_duration(text: &str) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let wrong =
        || format!("expected a duration like 500ms, 30s, 15m, 24h, 7d or none, got `{text}`");
    let n: u64 = digits.parse().map_err(|_| wrong())?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(wrong()),
    };
    match n.checked_mul(ms) {
        Some(0) => Err(format!("`{text}`: a TTL must be above zero (or `none`)")),
        Some(v) => Ok(Some(v)),
        None => Err(format!("`{text}` is too long")),
    }
}

/// A duration in the file's own words: `15m`, `24h` (whole days shown as `7d`), `1500ms`.
pub(crate) fn format_duration(ms: u64) -> String {
    for (unit, per) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms % per == 0 && ms >= per {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// `rate_limit:` — at most `requests` commands per `window_ms` for each client identity.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitConfig {
    /// Commands allowed per window.
    pub(crate) requests: u32,
    /// Window length in milliseconds.
    pub(crate) window_ms: u64,
    /// Whose budget a command draws on.
    #[serde(default)]
    pub(crate) per: Per,
    /// Identities tracked at once; a new one beyond this is let through (fail open, logged),
    /// so a flood of addresses cannot grow the proxy's memory.
    #[serde(default = "default_max_clients")]
    pub(crate) max_tracked: usize,
    /// Where the counts live: in this proxy, or in the upstream Redis so that every proxy
    /// replica draws on one budget.
    #[serde(default)]
    pub(crate) backend: Backend,
}

/// Where a rate limit counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Backend {
    /// In-proxy sliding window (DashMap): no round trip.
    #[default]
    Local,
    /// `lua/sliding_window.lua` on the upstream by EVALSHA: one round trip per command,
    /// shared by every proxy using that Redis.
    Redis,
}

fn default_max_clients() -> usize {
    100_000
}

/// Which identity a rate limit counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    /// Each client connection has its own budget.
    #[default]
    Connection,
    /// All connections from one IP address share a budget.
    Address,
    /// All connections of one tenant share a budget.
    Tenant,
}

/// The identity a rule's `share` picks clients by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ShareBy {
    /// The client's IP address: every connection from one address is in or out together.
    #[default]
    Address,
    /// The client's tenant (by name, so stable when tenants are added or reordered).
    Tenant,
    /// The user the client logged in as (a proxy user, or the Redis user its AUTH named);
    /// clients without a login are one identity.
    User,
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Refuse (or rewrite) the command.
    #[default]
    Enforce,
    /// Log and count what the rule would have done; change nothing.
    Audit,
}
