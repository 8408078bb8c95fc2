//! The `-OOM command not allowed …` error a client gets carries what the proxy knows about
//! the upstream's memory (the eviction check's note, `eviction`), so the person reading it
//! learns the policy in force and the memory use without logging in to Redis. Rare, so it
//! costs nothing until an OOM reply arrives: the connection notices the `-OOM ` prefix where
//! it already counts error replies, and only that batch's replies are copied.

use bytes::{Bytes, BytesMut};

use crate::protocol::reply;

/// Whether one reply frame is Redis's OOM error.
pub(crate) fn is_oom(frame: &[u8]) -> bool {
    frame.starts_with(b"-OOM ")
}

/// `data` (one batch's complete replies) with `note` appended to the text of every
/// top-level OOM error; the other replies are copied unchanged.
pub(crate) fn annotate(data: Bytes, note: &str) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len() + note.len() + 2);
    let mut rest = &data[..];
    while !rest.is_empty() {
        let len = match reply::scan(rest) {
            Ok(Some(len)) => len,
            // Cannot happen for bytes the connection framed; hand them on as they are.
            _ => return data,
        };
        let frame = &rest[..len];
        if is_oom(frame) {
            out.extend_from_slice(&frame[..len - 2]);
            out.extend_from_slice(b" ");
            // A simple error holds no CR or LF.
            out.extend(note.bytes().filter(|b| *b != b'\r' && *b != b'\n'));
            out.extend_from_slice(b"\r\n");
        } else {
            out.extend_from_slice(frame);
        }
        rest = &rest[len..];
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_the_note_to_oom_errors_only() {
        let data = Bytes::from_static(
            b"+OK\r\n-OOM command not allowed when used memory > 'maxmemory'.\r\n$1\r\nx\r\n",
        );
        assert_eq!(
            &annotate(data, "(proxy: noeviction)")[..],
            b"+OK\r\n-OOM command not allowed when used memory > 'maxmemory'. (proxy: noeviction)\r\n$1\r\nx\r\n"
        );
    }
}
