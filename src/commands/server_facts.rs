//! Which server the proxy is in front of, and what it says of its commands.
//!
//! At start, and again whenever the server behind the control connection changes (its
//! `run_id`: a restart, an upgrade, a failover), `upstream::server_probe` reads `INFO server`
//! (the server's name and version, [`parse_info`]) and `COMMAND` (every command it has), and
//! teaches the command model ([`crate::commands::learned`]) what the built-in Redis 7.0.15
//! table lacks. The [`ServerFacts`] show in the log, `INFO proxy` and `/readyz`.
//!
//! # Minimum version
//!
//! Redis 7.0 (and every Valkey): the TTL rule's hidden `PEXPIRE … NX` and the key specs the
//! command model reads are 7.0's. In front of an older server `/readyz` fails with the reason
//! and the log says it once; the proxy still serves (an operator may be mid-upgrade), but a
//! load balancer that asks `/readyz` sends it nothing.

use crate::commands::learned;
use crate::protocol::resp_value::Value;

/// The oldest server version the proxy supports: see the module documentation.
pub(crate) const MINIMUM: (u32, u32, u32) = (7, 0, 0);

/// The upstream server as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerFacts {
    /// `redis` or `valkey` (`server_name` in Valkey's INFO; Redis has none).
    pub(crate) name: String,
    /// The server's own version: `valkey_version` for Valkey (whose `redis_version` is the
    /// Redis version it is compatible with), else `redis_version`.
    pub(crate) version: String,
    /// `version` as numbers, for the minimum check.
    pub(crate) parsed: (u32, u32, u32),
    /// `run_id`: a new one means a new process, whose commands are read again.
    pub(crate) run_id: String,
    /// What the last `COMMAND` taught the command model.
    pub(crate) learned: learned::Summary,
}

impl ServerFacts {
    /// Whether the server is older than [`MINIMUM`].
    pub(crate) fn too_old(&self) -> bool {
        self.parsed < MINIMUM
    }

    /// `valkey 9.1.2`.
    pub(crate) fn label(&self) -> String {
        format!("{} {}", self.name, self.version)
    }

    /// One line for `/readyz` and the log.
    pub(crate) fn summary(&self) -> String {
        let mut s = format!(
            "upstream server {}; {} commands learned beyond the built-in Redis {} table",
            self.label(),
            self.learned.added,
            crate::commands::REDIS_VERSION
        );
        if self.learned.widened > 0 {
            s.push_str(&format!(", {} arities widened", self.learned.widened));
        }
        if !self.learned.unreadable.is_empty() {
            s.push_str(&format!(
                ", {} unreadable (refused by rules that need them: {})",
                self.learned.unreadable.len(),
                self.learned.unreadable.join(" ")
            ));
        }
        s
    }

    /// Why the proxy is not ready in front of this server, if it is too old.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.too_old().then(|| {
            format!(
                "upstream server {} is older than {}.{}.{}, the oldest the proxy supports \
                 (the TTL rule's PEXPIRE … NX and the command key specs need it); upgrade \
                 the server (docs/compatibility.md)",
                self.label(),
                MINIMUM.0,
                MINIMUM.1,
                MINIMUM.2
            )
        })
    }
}

/// The name, version and run id in an `INFO server` reply (a bulk or verbatim string of
/// `field:value` lines).
pub(crate) fn parse_info(reply: &[u8]) -> Option<ServerFacts> {
    let text = match Value::from_resp(reply).ok()? {
        Value::String(s) => s,
        _ => return None,
    };
    let text = std::str::from_utf8(&text).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let name = field("server_name").unwrap_or("redis").to_ascii_lowercase();
    let version = match name.as_str() {
        "valkey" => field("valkey_version").or_else(|| field("redis_version"))?,
        _ => field("redis_version")?,
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let parsed = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    Some(ServerFacts {
        name,
        version: version.to_string(),
        parsed,
        run_id: field("run_id").unwrap_or("").to_string(),
        learned: learned::Summary::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Vec<u8> {
        format!("${}\r\n{s}\r\n", s.len()).into_bytes()
    }

    #[test]
    fn reads_redis_and_valkey_versions() {
        let r = parse_info(&bulk("# Server\r\nredis_version:8.0.6\r\nrun_id:abc\r\n")).unwrap();
        assert_eq!((r.name.as_str(), r.version.as_str()), ("redis", "8.0.6"));
        assert!(!r.too_old());
        let v = parse_info(&bulk(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\nrun_id:x\r\n",
        ))
        .unwrap();
        assert_eq!(v.label(), "valkey 9.1.2");
        assert_eq!(v.parsed, (9, 1, 2));
        let old = parse_info(&bulk("redis_version:6.2.14\r\nrun_id:y\r\n")).unwrap();
        assert!(old.too_old());
        assert!(
            old.refusal()
                .unwrap()
                .contains("redis 6.2.14 is older than 7.0.0")
        );
    }
}
