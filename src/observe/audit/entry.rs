//! One audit entry: what the JSON line holds, written by the proxy and read back by
//! `replay`. One type for both, so the replay reads exactly what the proxy writes.
//!
//! Values are never recorded. Each argument after the command name is either a key name
//! (or its hash) at its position, or the argument's size in bytes: enough for the replay to
//! judge the rules that read only names, counts and sizes (see docs/operations.md, "What-if").

use serde::{Deserialize, Serialize};

/// One argument as the audit log records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Arg {
    /// A key argument: its name (or `#` and its hash, with `audit.keys: hash`).
    Key(String),
    /// Any other argument: its length in bytes, never its content.
    Size(u64),
}

/// What happened to the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Sent upstream as the client wrote it, and answered.
    Forwarded,
    /// Sent upstream as the policy rewrote it (TTL added, stream capped), and answered.
    Rewritten,
    /// Answered with an error by the proxy: a rule (`rule` names it), or a state error
    /// (NOAUTH, a command in a transaction that never opened).
    Refused,
    /// Answered by the proxy itself (HELLO, CLIENT ID, PROXY …).
    Local,
    /// Sent upstream, and the upstream failed before answering (connection lost, timeout):
    /// it may have been applied.
    Error,
}

/// One audited command, one JSON line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When the proxy decided the command: Unix time in seconds with microseconds, as
    /// MONITOR prints it, so one parser reads both.
    pub ts: f64,
    /// The client's address (`IP:port` in the JSON), who sent it; formatted by the writer
    /// thread, not on the data path.
    pub client: std::net::SocketAddr,
    /// The proxy's id of the client connection (`CLIENT ID`), to tell apart the connections
    /// of one address and to replay per-connection rate limits.
    pub id: u64,
    /// The proxy user the client authenticated as, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user: Option<String>,
    /// The client's tenant under the policy in force.
    pub tenant: String,
    /// Where it went: `shared`, `dedicated` (the client's own upstream connection), `proxy`
    /// (answered by the proxy); with the node index after a `:` in cluster mode.
    pub route: String,
    /// The command name, upper case; a subcommand after a space (`CLIENT KILL`).
    pub cmd: String,
    /// The arguments after the name (and subcommand), keys by name and the rest by size.
    pub args: Vec<Arg>,
    /// Arguments the client sent, the name included; more than `args` holds when the entry
    /// was cut at `MAX_ARGS`.
    pub argc: usize,
    /// What happened to it.
    pub outcome: Outcome,
    /// The rule that refused it (refused by a rule only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Microseconds from reading the command to its reply being ready (forwarded commands;
    /// the batch it went in shares one figure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<u64>,
}

/// Arguments recorded per entry at most: a 100,000-key MSET does not make a megabyte line.
pub(crate) const MAX_ARGS: usize = 256;

impl Entry {
    #[cfg(test)]
    /// Whether every argument is in `args` (not cut at `MAX_ARGS`).
    pub(crate) fn complete(&self) -> bool {
        self.args.len() + self.name_words() == self.argc
    }

    #[cfg(test)]
    /// How many of `argc` the name takes: 2 for a subcommand.
    pub(crate) fn name_words(&self) -> usize {
        1 + usize::from(self.cmd.contains(' '))
    }
}

/// The rule a refusal names: `-CODE policy <rule>: …` as `policy::refusal` writes it.
pub(crate) fn rule_of(refusal: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(refusal).ok()?;
    let after = text.split_once(" policy ")?.1;
    let (rule, _) = after.split_once(':')?;
    (!rule.is_empty() && !rule.contains(' ')).then(|| rule.to_string())
}

/// `#` and the 64-bit FNV-1a hash of `key` in hex: stable across runs and versions (unlike
/// std's hasher), so two logs can be correlated; not a secret (short names can be guessed).
pub fn key_hash(key: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("#{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_one_json_line() {
        let e = Entry {
            ts: 1_700_000_000.123_456,
            client: "127.0.0.1:5000".parse().unwrap(),
            id: 7,
            user: None,
            tenant: "default".into(),
            route: "shared".into(),
            cmd: "SET".into(),
            args: vec![Arg::Key("user:1".into()), Arg::Size(5)],
            argc: 3,
            outcome: Outcome::Forwarded,
            rule: None,
            latency_us: Some(120),
        };
        let line = serde_json::to_string(&e).unwrap();
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""args":["user:1",5]"#), "{line}");
        let back: Entry = serde_json::from_str(&line).unwrap();
        assert_eq!(back, e);
        assert!(back.complete());
    }

    #[test]
    fn reads_the_rule_from_a_refusal() {
        assert_eq!(
            rule_of(b"-NOPERM policy deny-keys: KEYS is not allowed; use SCAN\r\n").as_deref(),
            Some("deny-keys")
        );
        assert_eq!(rule_of(b"-NOAUTH Authentication required.\r\n"), None);
    }

    #[test]
    fn hashes_are_fnv1a() {
        // FNV-1a 64 of "a", a published test vector.
        assert_eq!(key_hash(b"a"), "#af63dc4c8601ec8c");
    }
}
