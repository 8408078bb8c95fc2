//! Decoded RESP2/RESP3 replies for the control plane: the few replies the proxy reads itself
//! (cluster topology, MOVED/ASK blob errors, Sentinel answers, rate-limit script results).
//!
//! The data path never builds values (`reply::scan` only finds boundaries, replies are
//! forwarded raw); these replies are rare and need their contents, so they get a tree.
//!
//! # Bounded, then decoded
//!
//! The bytes come from the network: a hostile or broken node must get an error, never a stack
//! overflow, a panic or a huge allocation. The decoding itself is `redis-protocol`'s
//! (`decode_range`), which recurses without a depth limit. So [`decode`] first walks the
//! reply's headers without recursion ([`check`]: a stack of at most `max_depth` counters) and
//! hands `redis-protocol` only a reply that is
//! - complete: every declared length is backed by bytes already received, so no length can
//!   make it reserve more than the input could hold (an element takes at least three bytes);
//! - nested at most `max_depth` aggregates deep, so its recursion is bounded.
//!
//! The walk also picks the decoder: `redis-protocol`'s RESP3 decoder reads `$-1`/`*-1` as
//! the start of a streamed value, not as RESP2's nulls, so a reply with no RESP3-only type is
//! decoded as RESP2 and one with RESP3 types as RESP3 (a server never mixes the two).
//!
//! # Folded types
//!
//! RESP3 types no control reply needs to tell apart are folded together: sets and pushes are
//! arrays; verbatim strings (without their format), doubles and big numbers are strings;
//! attributes are dropped. Map entries keep the reply's order when their keys are strings
//! (all the maps the proxy reads); `redis-protocol` collects maps and sets into hash maps, so
//! the order is restored from the keys' offsets. A double is re-formatted from its value.

use bytes::Bytes;
use redis_protocol::resp2::types::RangeFrame as Resp2Frame;
use redis_protocol::resp3::types::RangeFrame as Resp3Frame;

use crate::protocol::codec::parse_int;
use crate::protocol::reply::ReplyError;

/// How deep [`Value::from_resp`] lets a reply nest: the rate-limit script's `{allowed, n}`
/// and Sentinel's tables of records need two levels; a little headroom.
pub(crate) const SMALL_REPLY_DEPTH: usize = 4;

/// One decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `:n`, RESP3 number.
    Integer(i64),
    /// Simple, bulk or verbatim string (without its format), double, big number.
    String(Bytes),
    /// Simple (`-`) or blob (`!`) error, without the `-`, with its code:
    /// `NOSCRIPT No matching script…`. Not UTF-8 is replaced, as the text is only compared
    /// and shown.
    Error(String),
    /// Array, set or push.
    Array(Vec<Value>),
    /// RESP3 map, as key/value pairs.
    Map(Vec<(Value, Value)>),
    /// RESP3 boolean.
    Bool(bool),
    /// RESP2 null bulk string or array, RESP3 null.
    Nil,
}

impl Value {
    /// Decodes exactly one complete reply, e.g. the raw bytes an upstream connection
    /// delivered, nested at most [`SMALL_REPLY_DEPTH`] deep. Bytes after the reply, or too
    /// few, are an error.
    pub(crate) fn from_resp(reply: &[u8]) -> Result<Value, DecodeError> {
        let (value, len) = decode(reply, SMALL_REPLY_DEPTH)?;
        if len != reply.len() {
            return Err(DecodeError::Framing(ReplyError {
                offset: len,
                what: "bytes after the reply",
            }));
        }
        Ok(value)
    }

    /// The text of a string value.
    pub(crate) fn as_str(&self) -> Option<&[u8]> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer, also when sent as digits in a string (some servers and proxies do).
    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Value::Integer(n) => Some(*n),
            Value::String(s) => parse_int(s),
            _ => None,
        }
    }

    /// The elements of an array.
    pub(crate) fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The fields of a record: a RESP3 map, or the flat `key, value, key, value…` array that
    /// RESP2 sends for the same reply. Keys that are not strings are skipped.
    pub(crate) fn fields(&self) -> Option<Vec<(&[u8], &Value)>> {
        match self {
            Value::Map(pairs) => Some(
                pairs
                    .iter()
                    .filter_map(|(k, v)| Some((k.as_str()?, v)))
                    .collect(),
            ),
            Value::Array(items) if items.len() % 2 == 0 => Some(
                items
                    .chunks_exact(2)
                    .filter_map(|kv| Some((kv[0].as_str()?, &kv[1])))
                    .collect(),
            ),
            _ => None,
        }
    }
}

/// Why a reply could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not RESP.
    #[error(transparent)]
    Framing(#[from] ReplyError),
    /// The bytes end before the reply does.
    #[error("incomplete reply")]
    Incomplete,
    /// Nested deeper than the caller accepts.
    #[error("reply nested deeper than {0} levels")]
    TooDeep(usize),
    /// Well framed, but `redis-protocol` refused a value in it (an integer that is not one,
    /// a boolean other than `t`/`f`, an unknown verbatim format…).
    #[error("invalid reply: {0}")]
    Invalid(String),
}

/// Decodes the first reply in `buf`, nested at most `max_depth` aggregates deep; returns it
/// and its length in bytes.
pub(crate) fn decode(buf: &[u8], max_depth: usize) -> Result<(Value, usize), DecodeError> {
    let shape = check(buf, max_depth)?;
    // One copy of the reply; every string in the value is a slice of it.
    let bytes = Bytes::copy_from_slice(&buf[..shape.len]);
    let invalid =
        |e: redis_protocol::error::RedisProtocolError| DecodeError::Invalid(e.to_string());
    let (value, used) = if shape.resp3 {
        let (frame, used) = redis_protocol::resp3::decode::complete::decode_range(&bytes)
            .map_err(invalid)?
            .ok_or(DecodeError::Incomplete)?;
        (from_resp3(&bytes, frame)?, used)
    } else {
        let (frame, used) = redis_protocol::resp2::decode::decode_range(&bytes)
            .map_err(invalid)?
            .ok_or(DecodeError::Incomplete)?;
        (from_resp2(&bytes, frame), used)
    };
    if used != shape.len {
        // The two readings of the framing disagree: trust neither.
        return Err(DecodeError::Framing(ReplyError {
            offset: used.min(shape.len),
            what: "inconsistent framing",
        }));
    }
    Ok((value, shape.len))
}

/// What [`check`] learned about a reply.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    /// Length of the reply in bytes.
    len: usize,
    /// Whether it uses a RESP3-only type, which picks `redis-protocol`'s RESP3 decoder.
    resp3: bool,
}

/// Walks the first reply in `buf` header by header, without recursion, and checks what
/// `redis-protocol` does not: that it is complete (so no declared length is larger than the
/// bytes behind it) and nested at most `max_depth` aggregates deep. A value inside more than
/// `max_depth` aggregates is [`DecodeError::TooDeep`]. Allocates at most `max_depth + 1`
/// counters.
fn check(buf: &[u8], max_depth: usize) -> Result<Shape, DecodeError> {
    let bad = |offset, what| DecodeError::Framing(ReplyError { offset, what });
    // Elements still to read in each open aggregate, innermost last; the bottom entry is
    // the reply itself.
    let mut open: Vec<u64> = vec![1];
    let (mut pos, mut resp3, mut resp2_null) = (0usize, false, false);
    while let Some(left) = open.last_mut() {
        if *left == 0 {
            open.pop();
            continue;
        }
        *left -= 1;
        // Depth of this value: the aggregates around it.
        if open.len() - 1 > max_depth {
            return Err(DecodeError::TooDeep(max_depth));
        }
        let kind = *buf.get(pos).ok_or(DecodeError::Incomplete)?;
        let rest = &buf[pos + 1..];
        let cr = memchr::memchr(b'\r', rest).ok_or(DecodeError::Incomplete)?;
        match rest.get(cr + 1) {
            None => return Err(DecodeError::Incomplete),
            Some(b'\n') => {}
            Some(_) => return Err(bad(pos + 1 + cr, "line without CRLF")),
        }
        let line = &rest[..cr];
        let at = pos;
        pos += 1 + cr + 2;
        let int = || parse_int(line).ok_or_else(|| bad(at, "bad length"));
        match kind {
            b'+' | b'-' | b':' => {}
            b'_' | b'#' | b',' | b'(' => resp3 = true,
            b'$' | b'!' | b'=' => {
                resp3 |= kind != b'$';
                let len = int()?;
                if len == -1 && kind == b'$' {
                    resp2_null = true;
                    continue;
                }
                let len = usize::try_from(len).map_err(|_| bad(at, "negative length"))?;
                let end = pos.checked_add(len).ok_or(DecodeError::Incomplete)?;
                let after = end.checked_add(2).ok_or(DecodeError::Incomplete)?;
                match buf.get(end..after) {
                    None => return Err(DecodeError::Incomplete),
                    Some(b"\r\n") => pos = after,
                    Some(_) => return Err(bad(end, "blob without CRLF")),
                }
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                resp3 |= kind != b'*';
                let n = int()?;
                if n == -1 && kind == b'*' {
                    resp2_null = true;
                    continue;
                }
                let n = u64::try_from(n).map_err(|_| bad(at, "negative length"))?;
                let elements = match kind {
                    b'%' | b'|' => n.saturating_mul(2),
                    _ => n,
                };
                if kind == b'|' {
                    // An attribute annotates the value after it, which takes the slot this
                    // header took; its own entries are one level deeper.
                    if let Some(left) = open.last_mut() {
                        *left += 1;
                    }
                }
                open.push(elements);
            }
            _ => return Err(bad(at, "unknown type byte")),
        }
    }
    if resp3 && resp2_null {
        return Err(bad(0, "RESP2 null inside a RESP3 reply"));
    }
    Ok(Shape { len: pos, resp3 })
}

/// The bytes of a range `redis-protocol` found.
fn slice(buf: &Bytes, (start, end): (usize, usize)) -> Bytes {
    buf.slice(start..end)
}

fn lossy(buf: &Bytes, range: (usize, usize)) -> String {
    String::from_utf8_lossy(&buf[range.0..range.1]).into_owned()
}

fn from_resp2(buf: &Bytes, frame: Resp2Frame) -> Value {
    match frame {
        Resp2Frame::SimpleString(r) | Resp2Frame::BulkString(r) => Value::String(slice(buf, r)),
        Resp2Frame::Error(r) => Value::Error(lossy(buf, r)),
        Resp2Frame::Integer(n) => Value::Integer(n),
        Resp2Frame::Array(items) => {
            Value::Array(items.into_iter().map(|f| from_resp2(buf, f)).collect())
        }
        Resp2Frame::Null => Value::Nil,
    }
}

/// Where a frame starts in the reply, for the frames that say; others sort last.
fn offset(frame: &Resp3Frame) -> usize {
    match frame {
        Resp3Frame::BlobString { data, .. }
        | Resp3Frame::SimpleString { data, .. }
        | Resp3Frame::BlobError { data, .. }
        | Resp3Frame::SimpleError { data, .. }
        | Resp3Frame::BigNumber { data, .. }
        | Resp3Frame::VerbatimString { data, .. } => data.0,
        _ => usize::MAX,
    }
}

fn from_resp3(buf: &Bytes, frame: Resp3Frame) -> Result<Value, DecodeError> {
    let all = |items: Vec<Resp3Frame>| {
        items
            .into_iter()
            .map(|f| from_resp3(buf, f))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match frame {
        Resp3Frame::BlobString { data, .. }
        | Resp3Frame::SimpleString { data, .. }
        | Resp3Frame::BigNumber { data, .. }
        | Resp3Frame::VerbatimString { data, .. } => Value::String(slice(buf, data)),
        Resp3Frame::BlobError { data, .. } | Resp3Frame::SimpleError { data, .. } => {
            Value::Error(lossy(buf, data))
        }
        Resp3Frame::Number { data, .. } => Value::Integer(data),
        Resp3Frame::Double { data, .. } => Value::String(Bytes::from(data.to_string())),
        Resp3Frame::Boolean { data, .. } => Value::Bool(data),
        Resp3Frame::Null => Value::Nil,
        Resp3Frame::Array { data, .. } | Resp3Frame::Push { data, .. } => Value::Array(all(data)?),
        Resp3Frame::Set { data, .. } => {
            let mut items: Vec<_> = data.into_iter().collect();
            items.sort_by_key(offset);
            Value::Array(all(items)?)
        }
        Resp3Frame::Map { data, .. } => {
            let mut pairs: Vec<_> = data.into_iter().collect();
            pairs.sort_by_key(|(k, _)| offset(k));
            Value::Map(
                pairs
                    .into_iter()
                    .map(|(k, v)| Ok((from_resp3(buf, k)?, from_resp3(buf, v)?)))
                    .collect::<Result<_, DecodeError>>()?,
            )
        }
        // `check` lets neither through (`H` and `$?`/`;` are not type bytes there).
        Resp3Frame::Hello { .. } | Resp3Frame::ChunkedString(_) => {
            return Err(DecodeError::Invalid("unexpected frame".into()));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &'static [u8]) -> Value {
        Value::String(Bytes::from_static(text))
    }

    #[test]
    fn decodes_every_resp3_type() {
        let first: &[u8] = b"*9\r\n+ok\r\n:-3\r\n$3\r\nabc\r\n_\r\n_\r\n#t\r\n=8\r\ntxt:abcd\r\n%1\r\n+k\r\n~1\r\n,1.5\r\n|1\r\n+a\r\n+b\r\n!3\r\nbad\r\n";
        let input = [first, b"+next\r\n"].concat();
        let (v, len) = decode(&input, 16).unwrap();
        assert_eq!(
            v,
            Value::Array(vec![
                s(b"ok"),
                Value::Integer(-3),
                s(b"abc"),
                Value::Nil,
                Value::Nil,
                Value::Bool(true),
                s(b"abcd"),
                Value::Map(vec![(s(b"k"), Value::Array(vec![s(b"1.5")]))]),
                Value::Error("bad".into()),
            ])
        );
        // Only the first reply is decoded, and its length says where the next one starts.
        assert_eq!(len, first.len());
    }

    #[test]
    fn decodes_resp2_nulls_and_big_numbers() {
        let (v, _) = decode(b"*4\r\n$-1\r\n*-1\r\n-ERR x\r\n:7\r\n", 16).unwrap();
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Nil,
                Value::Nil,
                Value::Error("ERR x".into()),
                Value::Integer(7)
            ])
        );
        let (v, _) = decode(b"(12345678901234567890\r\n", 0).unwrap();
        assert_eq!(v, s(b"12345678901234567890"));
    }

    #[test]
    fn maps_keep_the_reply_order() {
        let mut reply = b"%20\r\n".to_vec();
        for i in 0..20 {
            reply
                .extend_from_slice(format!("$2\r\nk{}\r\n:{i}\r\n", (b'a' + i) as char).as_bytes());
        }
        let (v, _) = decode(&reply, 16).unwrap();
        let ints: Vec<i64> = v
            .fields()
            .unwrap()
            .iter()
            .map(|(_, v)| v.as_int().unwrap())
            .collect();
        assert_eq!(ints, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn fields_of_both_record_shapes() {
        let (resp2, _) = decode(b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:2\r\n", 16).unwrap();
        let (resp3, _) = decode(b"%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:2\r\n", 16).unwrap();
        for v in [resp2, resp3] {
            let f = v.fields().unwrap();
            assert_eq!(f.len(), 2);
            assert_eq!((f[1].0, f[1].1.as_int()), (&b"b"[..], Some(2)));
        }
        let (odd, _) = decode(b"*1\r\n:1\r\n", 16).unwrap();
        assert!(odd.fields().is_none());
    }

    #[test]
    fn from_resp_takes_exactly_one_small_reply() {
        let f = |b: &[u8]| Value::from_resp(b).unwrap();
        assert_eq!(
            f(b"*2\r\n:1\r\n:41\r\n"),
            Value::Array(vec![Value::Integer(1), Value::Integer(41)])
        );
        assert_eq!(
            f(b"-NOSCRIPT No matching script.\r\n"),
            Value::Error("NOSCRIPT No matching script.".into())
        );
        assert_eq!(f(b"!9\r\nERR oops!\r\n"), Value::Error("ERR oops!".into()));
        assert_eq!(f(b"+OK\r\n"), s(b"OK"));
        assert_eq!(f(b"*-1\r\n"), Value::Nil);
        assert_eq!(
            f(b"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n")
                .as_array()
                .unwrap()
                .len(),
            1
        );
        for bad in [
            &b""[..],
            b":1\r\n:2\r\n",
            b"*2\r\n:1\r\n",
            b"$3\r\nab\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"*1000000\r\n",
            b":1\rx",
            b":x\r\n",
            b"#x\r\n",
        ] {
            assert!(Value::from_resp(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hostile_input_is_an_error() {
        assert_eq!(decode(b"*2\r\n:1\r\n", 16), Err(DecodeError::Incomplete));
        assert!(decode(b"?\r\n", 16).is_err());
        assert!(decode(b"H\r\n", 16).is_err());
        assert!(decode(b"$?\r\n;3\r\nabc\r\n;0\r\n", 16).is_err());
        assert!(decode(b"$5\r\nab\r\n", 16).is_err());
        assert!(decode(b"$2\r\nabXY", 16).is_err());
        assert!(decode(b"*-2\r\n", 16).is_err());
        assert!(decode(b"*2\r\n_\r\n$-1\r\n", 16).is_err());
        // Far deeper than any stack could recurse: refused by the walk, not by a crash.
        for open in [
            &b"*1\r\n"[..],
            b"%1\r\n+k\r\n",
            b">1\r\n",
            b"|1\r\n+a\r\n+b\r\n*1\r\n",
        ] {
            let mut deep = open.repeat(1_000_000);
            deep.extend_from_slice(b":1\r\n");
            assert_eq!(decode(&deep, 16), Err(DecodeError::TooDeep(16)), "{open:?}");
        }
        let mut at_limit = b"*1\r\n".repeat(16);
        at_limit.extend_from_slice(b":1\r\n");
        assert!(decode(&at_limit, 16).is_ok());
        // Huge announced lengths with few bytes behind them are incomplete, not allocations.
        for huge in [
            &b"*1000000000000\r\n"[..],
            b"%9223372036854775807\r\n",
            b"~4611686018427387904\r\n:1\r\n",
            b"$9223372036854775807\r\nab\r\n",
        ] {
            assert_eq!(decode(huge, 16), Err(DecodeError::Incomplete), "{huge:?}");
        }
    }
}
