//! Request coalescing (`upstream.coalesce_reads`): a read that is byte for byte the same as
//! one already sent on the same shared connection and not answered yet is not sent again;
//! it gets a copy of that one's reply (a reference to the same bytes).
//!
//! Which reads: one command per batch, one of [`SHARED_READS`] (read-only, one key, a reply
//! that does not depend on who asks or on chance). The same connection means the same RESP
//! version and database 0 (shared connections never SELECT).
//!
//! Read-your-writes holds: a read joins only the *last* batch sent on the connection, so no
//! write, from anyone, was sent on it between the two, and whatever the reader wrote before
//! on this connection was sent before the shared read and is in its reply. A write the reader
//! made on another connection (its dedicated one: MULTI, scripts, blocking commands; the
//! other RESP version's) was answered before the read was sent (a session waits for that
//! before it changes connection), so a read joins only a batch sent after the last reply any
//! *other* connection of the process handed out: [`ANSWERED`] counts those replies, and a
//! batch remembers the count when it is sent.
//!
//! Off, the only cost is one relaxed load per answered batch ([`enabled`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Set at start when any pool coalesces, so connections count their replies.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Batches answered by every upstream connection of the process since start. Process-wide
/// rather than per pool: a write the reader made may have gone through any connection, and
/// counting too many only means fewer reads are shared.
static ANSWERED: AtomicU64 = AtomicU64::new(0);

/// The commands whose identical copies may share one reply: each reads one key, changes
/// nothing, and answers every client the same.
pub(crate) const SHARED_READS: [&str; 37] = [
    "GET",
    "GETRANGE",
    "STRLEN",
    "GETBIT",
    "BITCOUNT",
    "BITPOS",
    "EXISTS",
    "TYPE",
    "TTL",
    "PTTL",
    "HGET",
    "HMGET",
    "HGETALL",
    "HKEYS",
    "HVALS",
    "HLEN",
    "HEXISTS",
    "HSTRLEN",
    "LRANGE",
    "LINDEX",
    "LLEN",
    "SMEMBERS",
    "SISMEMBER",
    "SMISMEMBER",
    "SCARD",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZREVRANGE",
    "ZSCORE",
    "ZMSCORE",
    "ZRANK",
    "ZREVRANK",
    "ZCARD",
    "ZCOUNT",
    "XRANGE",
    "XREVRANGE",
    "XLEN",
];

/// Turns counting on (at start, when `upstream.coalesce_reads` is set).
pub(crate) fn enable() {
    ENABLED.store(true, Ordering::Release);
}

/// Whether connections count their replies.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Counts one batch answered by a connection that has handed out `own` replies itself;
/// call before the reply is handed out, so a session that sees the reply sees the count.
pub(crate) fn answered(own: &AtomicU64) {
    own.fetch_add(1, Ordering::Relaxed);
    ANSWERED.fetch_add(1, Ordering::SeqCst);
}

/// Replies handed out by the other connections, as a connection that handed out `own`
/// sees it. Its reader and writer run in one task, so it never sees its own count half
/// updated.
pub(crate) fn epoch(own: &AtomicU64) -> u64 {
    ANSWERED
        .load(Ordering::SeqCst)
        .wrapping_sub(own.load(Ordering::Relaxed))
}

/// Whether `bytes`, one batch, is exactly one command of [`SHARED_READS`] with one key.
pub(crate) fn shareable(bytes: &[u8]) -> bool {
    let Some((argc, mut rest)) = header(bytes, b'*') else {
        return false;
    };
    if !(2..=16).contains(&argc) {
        return false;
    }
    let mut name = &b""[..];
    for i in 0..argc {
        let Some((len, after)) = header(rest, b'$') else {
            return false;
        };
        if after.len() < len + 2 || &after[len..len + 2] != b"\r\n" {
            return false;
        }
        if i == 0 {
            name = &after[..len];
        }
        rest = &after[len + 2..];
    }
    // One command and nothing after it; EXISTS with one key only.
    rest.is_empty()
        && (argc == 2 || !name.eq_ignore_ascii_case(b"EXISTS"))
        && SHARED_READS
            .iter()
            .any(|c| c.as_bytes().eq_ignore_ascii_case(name))
}

/// `<marker><number>\r\n` at the start of `bytes`: the number and what follows.
fn header(bytes: &[u8], marker: u8) -> Option<(usize, &[u8])> {
    let rest = bytes.strip_prefix(&[marker])?;
    let end = memchr::memchr(b'\r', rest)?;
    if end == 0 || end > 10 || rest.get(end + 1) != Some(&b'\n') {
        return None;
    }
    let n = std::str::from_utf8(&rest[..end]).ok()?.parse().ok()?;
    Some((n, &rest[end + 2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_shared_reads_are_shareable() {
        assert!(shareable(b"*2\r\n$3\r\nGET\r\n$3\r\nhot\r\n"));
        assert!(shareable(b"*2\r\n$7\r\nhgetall\r\n$1\r\nh\r\n"));
        assert!(shareable(
            b"*4\r\n$6\r\nLRANGE\r\n$1\r\nl\r\n$1\r\n0\r\n$2\r\n10\r\n"
        ));
        // Writes, several commands, multi-key EXISTS, broken framing.
        assert!(!shareable(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"));
        assert!(!shareable(
            b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n"
        ));
        assert!(!shareable(b"*3\r\n$6\r\nEXISTS\r\n$1\r\na\r\n$1\r\nb\r\n"));
        assert!(!shareable(b"*2\r\n$3\r\nGET\r\n$9\r\nhot\r\n"));
        assert!(!shareable(b"*2\r\n$11\r\nSRANDMEMBER\r\n$1\r\ns\r\n"));
        // Every listed command is a read-only command of the table.
        for name in SHARED_READS {
            let spec = crate::commands::lookup(name.as_bytes(), None).unwrap();
            assert!(spec.is_readonly() && !spec.is_blocking(), "{name}");
        }
    }
}
