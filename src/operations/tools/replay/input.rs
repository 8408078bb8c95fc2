//! What `replay` reads: audit-log lines (`crate::observe::audit::Entry`, JSON) and MONITOR lines
//! (`1764641346.123456 [0 10.1.2.3:50412] "SET" "k" "v"`), each made into a command line the
//! policy can judge, with how much of the client's command it holds.

use std::net::{IpAddr, SocketAddr};

use crate::observe::audit::{Arg, Entry};
use crate::policy::Evidence;

/// One replayed command.
pub(crate) struct Record {
    /// When it was sent, in seconds since the epoch: the rate limits' clock.
    pub(crate) ts: f64,
    /// The client's address: its tenant under the replayed policy, `per: address` limits.
    pub(crate) addr: IpAddr,
    /// Identifies the client connection for `per: connection` limits: the audit log's id,
    /// MONITOR's `IP:port`.
    pub(crate) conn: String,
    /// The proxy user it had authenticated as (audit log only).
    pub(crate) user: Option<String>,
    /// The command line: as sent (MONITOR), or names and placeholders of the recorded sizes.
    pub(crate) line: Vec<Vec<u8>>,
    /// How much of the command `line` holds.
    pub(crate) evidence: Evidence,
    /// Which arguments of `line` are placeholders of a recorded size (shown as sizes).
    pub(crate) placeholders: Vec<bool>,
}

/// Parses one input line: an audit entry or a MONITOR line. `None` for anything else
/// (MONITOR's `OK`, a blank line, commands Redis ran from a script: the policy judged the
/// EVAL that ran it).
pub(crate) fn parse(line: &str) -> Option<Record> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.starts_with('{') {
        from_audit(&serde_json::from_str::<Entry>(line).ok()?)
    } else {
        from_monitor(line)
    }
}

fn from_audit(e: &Entry) -> Option<Record> {
    let addr = e.client;
    let mut line: Vec<Vec<u8>> = e.cmd.split(' ').map(|w| w.as_bytes().to_vec()).collect();
    let mut placeholders = vec![false; line.len()];
    placeholders.extend(e.args.iter().map(|a| matches!(a, Arg::Size(_))));
    let mut hashed = false;
    for a in &e.args {
        line.push(match a {
            Arg::Key(k) => {
                hashed |= is_hash(k);
                k.as_bytes().to_vec()
            }
            // A placeholder of the recorded size: size rules see the real length.
            Arg::Size(n) => vec![b'x'; usize::try_from(*n).ok()?],
        });
    }
    Some(Record {
        ts: e.ts,
        addr: addr.ip(),
        conn: e.id.to_string(),
        user: e.user.clone(),
        line,
        evidence: if hashed {
            Evidence::Sizes
        } else {
            Evidence::Names
        },
        placeholders,
    })
}

/// `#` and 16 hex digits: a key hashed by `audit.keys: hash`.
fn is_hash(key: &str) -> bool {
    key.len() == 17 && key.starts_with('#') && key[1..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn from_monitor(line: &str) -> Option<Record> {
    let (ts, rest) = line.split_once(' ')?;
    let ts: f64 = ts.parse().ok()?;
    let rest = rest.strip_prefix('[')?;
    let (client, args) = rest.split_once("] ")?;
    let (_db, client) = client.split_once(' ')?;
    // `lua` and `unix:` clients have no address a tenant can be found by.
    let addr: SocketAddr = client.parse().ok()?;
    let line = unquote_args(args.as_bytes())?;
    if line.is_empty() {
        return None;
    }
    Some(Record {
        ts,
        addr: addr.ip(),
        conn: client.to_string(),
        user: None,
        placeholders: vec![false; line.len()],
        line,
        evidence: Evidence::Full,
    })
}

/// MONITOR's arguments: each in double quotes, with Redis's `sdscatrepr` escapes (`\\`,
/// `\"`, `\n`, `\r`, `\t`, `\a`, `\b`, `\xHH`).
fn unquote_args(mut s: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    loop {
        while let [b' ', rest @ ..] = s {
            s = rest;
        }
        let [b'"', rest @ ..] = s else {
            return s.is_empty().then_some(out);
        };
        s = rest;
        let mut arg = Vec::new();
        loop {
            match s {
                [b'"', rest @ ..] => {
                    s = rest;
                    break;
                }
                [b'\\', b'x', h, l, rest @ ..] => {
                    let hex = std::str::from_utf8(&[*h, *l]).ok().map(str::to_owned)?;
                    arg.push(u8::from_str_radix(&hex, 16).ok()?);
                    s = rest;
                }
                [b'\\', c, rest @ ..] => {
                    arg.push(match c {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'a' => 7,
                        b'b' => 8,
                        other => *other,
                    });
                    s = rest;
                }
                [c, rest @ ..] => {
                    arg.push(*c);
                    s = rest;
                }
                [] => return None,
            }
        }
        out.push(arg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_monitor_lines_with_escapes() {
        let r = parse(r#"1764641346.123456 [0 10.1.2.3:50412] "SET" "a\"b" "x\x00\n""#).unwrap();
        assert_eq!(
            r.line,
            vec![b"SET".to_vec(), b"a\"b".to_vec(), b"x\0\n".to_vec()]
        );
        assert_eq!(r.addr.to_string(), "10.1.2.3");
        assert_eq!(r.conn, "10.1.2.3:50412");
        assert_eq!(r.evidence, Evidence::Full);
        assert!((r.ts - 1_764_641_346.123_456).abs() < 1e-6);
        assert!(parse("OK").is_none());
        assert!(parse(r#"1764641346.1 [0 lua] "GET" "k""#).is_none());
    }

    #[test]
    fn reads_audit_entries_with_placeholders_of_their_sizes() {
        let line = r#"{"ts":1.5,"client":"127.0.0.1:9","id":4,"tenant":"default","route":"shared","cmd":"CLIENT KILL","args":[2,"k"],"argc":4,"outcome":"forwarded"}"#;
        let r = parse(line).unwrap();
        assert_eq!(
            r.line,
            vec![
                b"CLIENT".to_vec(),
                b"KILL".to_vec(),
                b"xx".to_vec(),
                b"k".to_vec()
            ]
        );
        assert_eq!((r.conn.as_str(), r.evidence), ("4", Evidence::Names));
        let hashed = line.replace(r#""k""#, r##""#0123456789abcdef""##);
        assert_eq!(parse(&hashed).unwrap().evidence, Evidence::Sizes);
    }
}
