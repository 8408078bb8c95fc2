//! A small RESP2/RESP3 decoder for the few replies the proxy reads itself (cluster topology).
//!
//! The proxy's hot path never builds values (`reply::scan` only finds boundaries); topology
//! replies are rare and need their contents, so they get this tree decoder. It borrows from
//! the input and checks framing with `reply::scan` first. Recursion is bounded by
//! [`MAX_DEPTH`] because these bytes come from the network: a hostile or broken node must get
//! an error, never a stack overflow, a panic or a huge allocation.

use crate::codec::parse_int;
use crate::reply;

/// Deepest nesting accepted. Topology replies nest at most five levels (CLUSTER SHARDS:
/// shards → shard → nodes → node → value); a little headroom tolerates attributes.
const MAX_DEPTH: usize = 16;

/// One decoded reply. RESP3 types that topology parsing never needs to tell apart are folded
/// together (sets and pushes are arrays; verbatim strings, doubles and big numbers are text).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value<'a> {
    /// Simple string, bulk string, verbatim string (without its format), double, big number.
    Str(&'a [u8]),
    /// Integer.
    Int(i64),
    /// RESP2 null bulk/array, RESP3 null.
    Null,
    /// RESP3 boolean.
    Bool(bool),
    /// Simple or blob error, without the leading `-`.
    Error(&'a [u8]),
    /// Array, set or push.
    Array(Vec<Value<'a>>),
    /// RESP3 map, as key/value pairs in reply order.
    Map(Vec<(Value<'a>, Value<'a>)>),
}

impl<'a> Value<'a> {
    /// The text of a string value.
    pub(crate) fn as_str(&self) -> Option<&'a [u8]> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An integer, also when sent as digits in a string (some servers and proxies do).
    pub(crate) fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            Value::Str(s) => parse_int(s),
            _ => None,
        }
    }

    /// The elements of an array.
    pub(crate) fn as_array(&self) -> Option<&[Value<'a>]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The fields of a record: a RESP3 map, or the flat `key, value, key, value…` array that
    /// RESP2 sends for the same reply. Keys that are not strings are skipped.
    pub(crate) fn fields(&self) -> Option<Vec<(&'a [u8], &Value<'a>)>> {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not RESP.
    #[error(transparent)]
    Framing(#[from] reply::ReplyError),
    /// The bytes end before the reply does.
    #[error("incomplete reply")]
    Incomplete,
    /// Nested deeper than any reply the proxy decodes.
    #[error("reply nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// Decodes the first reply in `buf`; returns it and its length in bytes.
pub(crate) fn decode(buf: &[u8]) -> Result<(Value<'_>, usize), DecodeError> {
    let len = reply::scan(buf)?.ok_or(DecodeError::Incomplete)?;
    let mut d = Decoder {
        buf: &buf[..len],
        pos: 0,
    };
    let value = d.value(0)?;
    Ok((value, len))
}

struct Decoder<'a> {
    /// Exactly one reply, already known to be well framed.
    buf: &'a [u8],
    /// Next byte to read.
    pos: usize,
}

impl<'a> Decoder<'a> {
    /// The rest of the current line after the type byte, and advances past its CRLF.
    fn line(&mut self) -> Result<&'a [u8], DecodeError> {
        let start = self.pos + 1;
        let rest = self.buf.get(start..).ok_or(DecodeError::Incomplete)?;
        let cr = memchr::memchr(b'\r', rest).ok_or(DecodeError::Incomplete)?;
        self.pos = start + cr + 2;
        if self.pos > self.buf.len() {
            return Err(DecodeError::Incomplete);
        }
        Ok(&rest[..cr])
    }

    /// A length or integer line.
    fn int(&mut self) -> Result<i64, DecodeError> {
        let at = self.pos;
        parse_int(self.line()?).ok_or(DecodeError::Framing(reply::ReplyError {
            offset: at,
            what: "bad integer",
        }))
    }

    /// The payload of a blob type, or `None` for a null blob.
    fn blob(&mut self) -> Result<Option<&'a [u8]>, DecodeError> {
        let len = self.int()?;
        if len < 0 {
            return Ok(None);
        }
        let start = self.pos;
        let end = start
            .checked_add(len as usize)
            .ok_or(DecodeError::Incomplete)?;
        let data = self.buf.get(start..end).ok_or(DecodeError::Incomplete)?;
        self.pos = end + 2;
        Ok(Some(data))
    }

    /// Room for at most `n` elements, but never more than the bytes left could hold (each
    /// element takes at least three bytes), so a lying length cannot reserve memory.
    fn capacity(&self, n: i64) -> usize {
        let left = self.buf.len().saturating_sub(self.pos) / 3;
        usize::try_from(n).unwrap_or(0).min(left)
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        loop {
            let kind = *self.buf.get(self.pos).ok_or(DecodeError::Incomplete)?;
            return Ok(match kind {
                b'+' | b',' | b'(' => Value::Str(self.line()?),
                b'-' => Value::Error(self.line()?),
                b':' => Value::Int(self.int()?),
                b'_' => {
                    self.line()?;
                    Value::Null
                }
                b'#' => Value::Bool(self.line()? == b"t"),
                b'$' => self.blob()?.map_or(Value::Null, Value::Str),
                b'!' => self.blob()?.map_or(Value::Null, Value::Error),
                // Verbatim string: a three-letter format and a colon precede the text.
                b'=' => self
                    .blob()?
                    .map_or(Value::Null, |s| Value::Str(s.get(4..).unwrap_or(&[]))),
                b'*' | b'~' | b'>' => {
                    let n = self.int()?;
                    if n < 0 {
                        Value::Null
                    } else {
                        let mut items = Vec::with_capacity(self.capacity(n));
                        for _ in 0..n {
                            items.push(self.value(depth + 1)?);
                        }
                        Value::Array(items)
                    }
                }
                b'%' => {
                    let n = self.int()?;
                    let mut pairs = Vec::with_capacity(self.capacity(n.saturating_mul(2)) / 2);
                    for _ in 0..n.max(0) {
                        let k = self.value(depth + 1)?;
                        let v = self.value(depth + 1)?;
                        pairs.push((k, v));
                    }
                    Value::Map(pairs)
                }
                b'|' => {
                    // Attributes annotate the reply that follows; topology parsing has no use
                    // for them, so they are read and dropped.
                    let n = self.int()?;
                    for _ in 0..n.max(0).saturating_mul(2) {
                        self.value(depth + 1)?;
                    }
                    continue;
                }
                _ => {
                    return Err(DecodeError::Framing(reply::ReplyError {
                        offset: self.pos,
                        what: "unknown type byte",
                    }));
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_type() {
        let first: &[u8] = b"*9\r\n+ok\r\n:-3\r\n$3\r\nabc\r\n$-1\r\n_\r\n#t\r\n=8\r\ntxt:abcd\r\n%1\r\n+k\r\n~1\r\n,1.5\r\n|1\r\n+a\r\n+b\r\n!3\r\nbad\r\n";
        let input = [first, b"+next\r\n"].concat();
        let (v, len) = decode(&input).unwrap();
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Str(b"ok"),
                Value::Int(-3),
                Value::Str(b"abc"),
                Value::Null,
                Value::Null,
                Value::Bool(true),
                Value::Str(b"abcd"),
                Value::Map(vec![(
                    Value::Str(b"k"),
                    Value::Array(vec![Value::Str(b"1.5")])
                )]),
                Value::Error(b"bad"),
            ])
        );
        // Only the first reply is decoded, and its length says where the next one starts.
        assert_eq!(len, first.len());
    }

    #[test]
    fn fields_of_both_record_shapes() {
        let (resp2, _) = decode(b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:2\r\n").unwrap();
        let (resp3, _) = decode(b"%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n:2\r\n").unwrap();
        for v in [resp2, resp3] {
            let f = v.fields().unwrap();
            assert_eq!(f.len(), 2);
            assert_eq!((f[1].0, f[1].1.as_int()), (&b"b"[..], Some(2)));
        }
        let (odd, _) = decode(b"*1\r\n:1\r\n").unwrap();
        assert!(odd.fields().is_none());
    }

    #[test]
    fn hostile_input_is_an_error() {
        assert_eq!(decode(b"*2\r\n:1\r\n"), Err(DecodeError::Incomplete));
        assert!(decode(b"?\r\n").is_err());
        assert!(decode(b"$5\r\nab\r\n").is_err());
        let mut deep = Vec::new();
        for _ in 0..1000 {
            deep.extend_from_slice(b"*1\r\n");
        }
        deep.extend_from_slice(b":1\r\n");
        assert_eq!(decode(&deep), Err(DecodeError::TooDeep));
        // A huge announced length with few bytes behind it is incomplete, not an allocation.
        assert_eq!(decode(b"*1000000000000\r\n"), Err(DecodeError::Incomplete));
    }
}
