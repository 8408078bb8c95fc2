//! Reply framing: where each RESP2/RESP3 reply ends, without building it.
//!
//! The proxy forwards replies as the raw bytes the upstream sent; it only needs each reply's
//! length to hand the right bytes to the right client. A counter of "elements still to read"
//! replaces recursion, so nesting depth costs nothing and cannot overflow the stack.

use bytes::Bytes;
use memchr::memchr;

use crate::protocol::codec::parse_int;

/// The upstream sent bytes that are not RESP; the connection cannot be trusted any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid reply from upstream at byte {offset}: {what}")]
pub struct ReplyError {
    /// Offset in the scanned buffer where the problem is.
    pub(crate) offset: usize,
    /// What was wrong.
    pub(crate) what: &'static str,
}

/// Length of the first complete reply in `buf`, or `None` if more bytes are needed.
pub fn scan(buf: &[u8]) -> Result<Option<usize>, ReplyError> {
    let mut pos = 0usize;
    // Elements still to read before the reply is complete.
    let mut pending: u64 = 1;
    while pending > 0 {
        let Some(&kind) = buf.get(pos) else {
            return Ok(None);
        };
        let Some(cr) = super::find::find(b'\r', &buf[pos + 1..]).map(|i| pos + 1 + i) else {
            return Ok(None);
        };
        if cr + 2 > buf.len() {
            return Ok(None);
        }
        let line = &buf[pos + 1..cr];
        pending -= 1;
        pos = cr + 2;
        match kind {
            b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => {}
            b'$' | b'!' | b'=' => {
                let len = parse_int(line).ok_or(ReplyError {
                    offset: pos,
                    what: "bad bulk length",
                })?;
                if len >= 0 {
                    let end = pos + len as usize + 2;
                    if end > buf.len() {
                        return Ok(None);
                    }
                    pos = end;
                } else if len != -1 {
                    return Err(ReplyError {
                        offset: pos,
                        what: "negative bulk length",
                    });
                }
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let n = parse_int(line).ok_or(ReplyError {
                    offset: pos,
                    what: "bad aggregate length",
                })?;
                if n > 0 {
                    let n = n as u64;
                    pending += match kind {
                        b'%' => 2 * n,
                        // An attribute map is followed by the reply it annotates.
                        b'|' => 2 * n + 1,
                        _ => n,
                    };
                } else if n == 0 && kind == b'|' {
                    pending += 1;
                } else if n < -1 || (n == -1 && kind != b'*') {
                    return Err(ReplyError {
                        offset: pos,
                        what: "negative aggregate length",
                    });
                }
            }
            _ => {
                return Err(ReplyError {
                    offset: pos,
                    what: "unknown type byte",
                });
            }
        }
    }
    Ok(Some(pos))
}

/// The whole replies at the head of `data`, one after another; ends at the first incomplete
/// or malformed one. Borrowed slices: walking a batch's replies allocates nothing.
pub(crate) fn frames(data: &[u8]) -> Frames<'_> {
    Frames { rest: data }
}

/// Iterator of `frames`.
pub(crate) struct Frames<'a> {
    /// The bytes not walked yet.
    rest: &'a [u8],
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let len = scan(self.rest).ok()??;
        let (frame, rest) = self.rest.split_at(len);
        self.rest = rest;
        Some(frame)
    }
}

/// The whole replies of `data` as slices sharing its buffer (see `frames`).
pub(crate) fn split(data: &Bytes) -> Vec<Bytes> {
    frames(data).map(|f| data.slice_ref(f)).collect()
}

/// The elements of an array reply, each a whole frame; `None` when `reply` is not an array
/// or holds fewer elements than its header counts.
pub(crate) fn array_elements(reply: &Bytes) -> Option<Vec<Bytes>> {
    if reply.first() != Some(&b'*') {
        return None;
    }
    let cr = memchr(b'\r', reply)?;
    let n = usize::try_from(parse_int(&reply[1..cr])?).ok()?;
    let out: Vec<Bytes> = frames(reply.get(cr + 2..)?)
        .take(n)
        .map(|f| reply.slice_ref(f))
        .collect();
    (out.len() == n).then_some(out)
}

/// An array or push frame's element count and where its first element starts.
fn aggregate_header(frame: &[u8]) -> Option<(i64, usize)> {
    if !matches!(frame.first(), Some(b'*' | b'>')) {
        return None;
    }
    let cr = memchr(b'\r', frame)?;
    Some((parse_int(&frame[1..cr])?, cr + 2))
}

/// The `index`-th element of an array or push frame, when it is a bulk or simple string.
/// Used only on pub/sub frames, which are flat arrays of strings and integers.
pub(crate) fn element(frame: &[u8], index: usize) -> Option<&[u8]> {
    let (n, pos) = aggregate_header(frame)?;
    nth_flat(frame, pos, n, index)
}

/// The protocol a HELLO reply says its connection speaks from now on: Redis's and Valkey's
/// `server`, `…`, `version`, `…`, `proto`, N, … as a map (RESP3) or a flat array (RESP2).
/// `None` for any other frame.
pub(crate) fn hello_proto(frame: &[u8]) -> Option<u8> {
    // Asked of every reply on a held connection: anything but a map or an array returns at
    // its first byte.
    let (proto, pairs, digit): (u8, i64, &[u8]) = match frame.first()? {
        b'%' => (3, 2, b"3"),
        b'*' => (2, 1, b"2"),
        _ => return None,
    };
    let cr = memchr(b'\r', frame)?;
    let elements = parse_int(frame.get(1..cr)?)?.checked_mul(pairs)?;
    let at = |i: usize| nth_flat(frame, cr + 2, elements, i);
    (at(0)? == b"server" && at(4)? == b"proto" && at(5)? == digit).then_some(proto)
}

/// The `index`-th of the `n` flat string or integer elements starting at `pos`.
fn nth_flat(frame: &[u8], mut pos: usize, n: i64, index: usize) -> Option<&[u8]> {
    if index as i64 >= n {
        return None;
    }
    for i in 0..=index {
        let kind = *frame.get(pos)?;
        let cr = pos + 1 + memchr(b'\r', frame.get(pos + 1..)?)?;
        let line = &frame[pos + 1..cr];
        let (value, next) = match kind {
            b'$' => {
                let len = parse_int(line)?;
                if len < 0 {
                    (&frame[0..0], cr + 2)
                } else {
                    let start = cr + 2;
                    let end = start + len as usize;
                    (frame.get(start..end)?, end + 2)
                }
            }
            b'+' | b':' => (line, cr + 2),
            _ => return None,
        };
        if i == index {
            return Some(value);
        }
        pos = next;
    }
    None
}

/// What a pub/sub-shaped frame is, by its first element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PubSubFrame {
    /// `message`, `pmessage`, `smessage`: a delivery, never a reply to a command.
    Message,
    /// `invalidate`: a client-side-caching invalidation (RESP3 push).
    Invalidate,
    /// A (un)subscribe confirmation of the given kind; `subscribe` says which direction.
    Confirmation { kind: SubKind, subscribe: bool },
    /// Anything else.
    Other,
}

/// The three independent subscription namespaces of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubKind {
    Channel,
    Pattern,
    Shard,
}

impl SubKind {
    /// Index into per-kind tables.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Classifies an array or push frame by its first element and its length: a message has 3
/// elements (4 for `pmessage`), a confirmation 3, an invalidation 2, as Redis sends them.
/// The length is part of the shape, so fewer ordinary replies (a list that starts with
/// `message`) pass for one; a reply of the right shape still can (a script's), which is why
/// callers also ask whether a pub/sub frame can come at all where they found it.
pub fn classify_pubsub(frame: &[u8]) -> PubSubFrame {
    let Some(first) = element(frame, 0) else {
        return PubSubFrame::Other;
    };
    let Some((len, _)) = aggregate_header(frame) else {
        return PubSubFrame::Other;
    };
    let lower = |s: &[u8]| first.eq_ignore_ascii_case(s);
    if (lower(b"message") || lower(b"smessage")) && len == 3 || lower(b"pmessage") && len == 4 {
        PubSubFrame::Message
    } else if lower(b"invalidate") && len == 2 {
        PubSubFrame::Invalidate
    } else if len != 3 {
        PubSubFrame::Other
    } else {
        let (kind, subscribe) = if lower(b"subscribe") {
            (SubKind::Channel, true)
        } else if lower(b"unsubscribe") {
            (SubKind::Channel, false)
        } else if lower(b"psubscribe") {
            (SubKind::Pattern, true)
        } else if lower(b"punsubscribe") {
            (SubKind::Pattern, false)
        } else if lower(b"ssubscribe") {
            (SubKind::Shard, true)
        } else if lower(b"sunsubscribe") {
            (SubKind::Shard, false)
        } else {
            return PubSubFrame::Other;
        };
        PubSubFrame::Confirmation { kind, subscribe }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(frame: &[u8]) {
        assert_eq!(
            scan(frame),
            Ok(Some(frame.len())),
            "{:?}",
            String::from_utf8_lossy(frame)
        );
        for cut in 0..frame.len() {
            assert_eq!(scan(&frame[..cut]), Ok(None), "cut {cut}");
        }
    }

    #[test]
    fn hello_replies_say_the_protocol() {
        let resp3 = b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n\
$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:4\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n\
$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n";
        assert_eq!(hello_proto(resp3), Some(3));
        let resp2 = b"*14\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$7\r\nversion\r\n$5\r\n9.1.2\r\n\
$5\r\nproto\r\n:2\r\n$2\r\nid\r\n:4\r\n";
        assert_eq!(hello_proto(resp2), Some(2));
        // A map claiming RESP2, a message, a short array: not a HELLO reply.
        let mixed =
            b"%3\r\n$6\r\nserver\r\n$1\r\nx\r\n$7\r\nversion\r\n$1\r\n1\r\n$5\r\nproto\r\n:2\r\n";
        assert_eq!(hello_proto(mixed), None);
        assert_eq!(
            hello_proto(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nx\r\n"),
            None
        );
        assert_eq!(hello_proto(b"*1\r\n$6\r\nserver\r\n"), None);
        assert_eq!(hello_proto(b"+OK\r\n"), None);
    }

    #[test]
    fn scans_every_type() {
        for f in [
            &b"+OK\r\n"[..],
            b"-ERR x\r\n",
            b":12\r\n",
            b"$3\r\nfoo\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*2\r\n$1\r\na\r\n:1\r\n",
            b"_\r\n",
            b"#t\r\n",
            b",1.5\r\n",
            b"(123\r\n",
            b"!3\r\nerr\r\n",
            b"=7\r\ntxt:abc\r\n",
            b"%1\r\n+a\r\n*1\r\n:1\r\n",
            b"~2\r\n+a\r\n+b\r\n",
            b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
            b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n",
            b"$4\r\na\r\nb\r\n",
        ] {
            complete(f);
        }
    }

    #[test]
    fn first_of_several() {
        assert_eq!(scan(b"+OK\r\n:1\r\n"), Ok(Some(5)));
    }

    #[test]
    fn deep_nesting_does_not_recurse() {
        let mut f = Vec::new();
        for _ in 0..100_000 {
            f.extend_from_slice(b"*1\r\n");
        }
        f.extend_from_slice(b":1\r\n");
        assert_eq!(scan(&f), Ok(Some(f.len())));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(scan(b"?x\r\n").is_err());
        assert!(scan(b"$-2\r\n").is_err());
        assert!(scan(b"*a\r\n").is_err());
    }

    #[test]
    fn classifies_pubsub_frames() {
        let m = b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n";
        assert_eq!(classify_pubsub(m), PubSubFrame::Message);
        assert_eq!(element(m, 1), Some(&b"ch"[..]));
        let s = b">3\r\n$10\r\nssubscribe\r\n$2\r\nch\r\n:1\r\n";
        assert_eq!(
            classify_pubsub(s),
            PubSubFrame::Confirmation {
                kind: SubKind::Shard,
                subscribe: true
            }
        );
        assert_eq!(element(s, 2), Some(&b"1"[..]));
        assert_eq!(
            classify_pubsub(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"),
            PubSubFrame::Other
        );
        assert_eq!(classify_pubsub(b"+OK\r\n"), PubSubFrame::Other);
    }

    /// Only Redis's shapes: `COMMAND LIST`'s reply starts with `subscribe` in some servers'
    /// orders, and was taken for a confirmation (the reply sweep's reset, docs/fuzzing.md).
    #[test]
    fn a_reply_that_only_starts_like_a_pubsub_frame_is_not_one() {
        let cases: [(&[u8], PubSubFrame); 6] = [
            (
                b"*4\r\n$9\r\nsubscribe\r\n$9\r\nreplicaof\r\n$3\r\nget\r\n$3\r\nset\r\n",
                PubSubFrame::Other,
            ),
            (b"*2\r\n$7\r\nmessage\r\n$2\r\nch\r\n", PubSubFrame::Other),
            (
                b"*3\r\n$8\r\npmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n",
                PubSubFrame::Other,
            ),
            (
                b">4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$2\r\nch\r\n$2\r\nhi\r\n",
                PubSubFrame::Message,
            ),
            (b">2\r\n$10\r\ninvalidate\r\n_\r\n", PubSubFrame::Invalidate),
            (
                b"*3\r\n$10\r\ninvalidate\r\n$1\r\na\r\n$1\r\nb\r\n",
                PubSubFrame::Other,
            ),
        ];
        for (frame, kind) in cases {
            assert_eq!(
                classify_pubsub(frame),
                kind,
                "{}",
                String::from_utf8_lossy(frame)
            );
        }
    }
}
