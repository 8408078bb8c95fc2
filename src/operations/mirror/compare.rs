//! Whether the mirror answered a read as the primary did. Byte for byte where Redis defines
//! the reply exactly; as a multiset where it does not define the order (SMEMBERS, HGETALL:
//! the two servers may lay the same set out differently); within a tolerance for the time a
//! key has left (the mirror got the write, and the read, a little later).

use crate::protocol::resp_value::{self, Value};

/// How a read's two replies are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    /// The same bytes (two errors: the same error code).
    Exact,
    /// The same elements in any order, at every level.
    Unordered,
    /// Integers at most this far apart, or the same negative answer (-1 no expiry, -2 no key).
    Near(i64),
}

/// How deep a compared reply may nest before it is compared byte for byte instead.
const MAX_DEPTH: usize = 16;

/// Whether `mirror` answers as `primary` did.
pub(super) fn same(how: How, primary: &[u8], mirror: &[u8]) -> bool {
    if primary == mirror {
        return true;
    }
    if primary.first() == Some(&b'-') && mirror.first() == Some(&b'-') {
        return error_code(primary) == error_code(mirror);
    }
    match how {
        How::Exact => false,
        How::Unordered => match (decoded(primary), decoded(mirror)) {
            (Some(a), Some(b)) => canonical(a) == canonical(b),
            _ => false,
        },
        How::Near(tolerance) => match (decoded(primary), decoded(mirror)) {
            (Some(Value::Integer(a)), Some(Value::Integer(b))) => {
                a >= 0 && b >= 0 && a.abs_diff(b) <= tolerance.unsigned_abs()
            }
            _ => false,
        },
    }
}

/// The code of an error reply: its first word (`WRONGTYPE`, `ERR`), which two servers of
/// different versions share even where their texts differ.
fn error_code(reply: &[u8]) -> &[u8] {
    let text = reply.get(1..).unwrap_or_default();
    let end = text
        .iter()
        .position(|&b| b == b' ' || b == b'\r')
        .unwrap_or(text.len());
    &text[..end]
}

fn decoded(reply: &[u8]) -> Option<Value> {
    match resp_value::decode(reply, MAX_DEPTH) {
        Ok((value, len)) if len == reply.len() => Some(value),
        _ => None,
    }
}

/// The value with every array's elements and every map's pairs sorted, so two layouts of the
/// same set compare equal.
fn canonical(value: Value) -> Value {
    match value {
        Value::Array(items) => {
            let mut items: Vec<Value> = items.into_iter().map(canonical).collect();
            items.sort_by_key(sort_key);
            Value::Array(items)
        }
        Value::Map(pairs) => {
            let mut pairs: Vec<(Value, Value)> = pairs
                .into_iter()
                .map(|(k, v)| (canonical(k), canonical(v)))
                .collect();
            pairs.sort_by_key(|pair| sort_key(&pair.0));
            Value::Map(pairs)
        }
        other => other,
    }
}

/// A total order on values for sorting (their debug text: only equality matters here).
fn sort_key(value: &Value) -> String {
    format!("{value:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_replies_must_match_byte_for_byte() {
        assert!(same(How::Exact, b"$1\r\na\r\n", b"$1\r\na\r\n"));
        assert!(!same(How::Exact, b"$1\r\na\r\n", b"$1\r\nb\r\n"));
        assert!(!same(How::Exact, b"$1\r\na\r\n", b"$-1\r\n"));
        assert!(!same(
            How::Exact,
            b"*2\r\n:1\r\n:2\r\n",
            b"*2\r\n:2\r\n:1\r\n"
        ));
    }

    #[test]
    fn errors_compare_by_code() {
        assert!(same(
            How::Exact,
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            b"-WRONGTYPE Operation against a key of the wrong type\r\n"
        ));
        assert!(!same(How::Exact, b"-WRONGTYPE x\r\n", b"-ERR x\r\n"));
        assert!(!same(How::Exact, b"-ERR x\r\n", b"$1\r\nx\r\n"));
    }

    #[test]
    fn unordered_replies_match_in_any_order_but_not_with_other_elements() {
        let a = b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n";
        let b = b"*3\r\n$1\r\nc\r\n$1\r\na\r\n$1\r\nb\r\n";
        let c = b"*3\r\n$1\r\nc\r\n$1\r\na\r\n$1\r\nd\r\n";
        assert!(same(How::Unordered, a, b));
        assert!(!same(How::Unordered, a, c));
        let m1 = b"%2\r\n$1\r\nf\r\n$1\r\n1\r\n$1\r\ng\r\n$1\r\n2\r\n";
        let m2 = b"%2\r\n$1\r\ng\r\n$1\r\n2\r\n$1\r\nf\r\n$1\r\n1\r\n";
        let m3 = b"%2\r\n$1\r\ng\r\n$1\r\n1\r\n$1\r\nf\r\n$1\r\n2\r\n";
        assert!(same(How::Unordered, m1, m2));
        assert!(!same(How::Unordered, m1, m3));
    }

    #[test]
    fn times_left_match_within_the_tolerance_and_negatives_exactly() {
        assert!(same(How::Near(2_000), b":100000\r\n", b":99000\r\n"));
        assert!(!same(How::Near(2_000), b":100000\r\n", b":90000\r\n"));
        assert!(!same(How::Near(2_000), b":-1\r\n", b":1000\r\n"));
        assert!(!same(How::Near(2), b":-2\r\n", b":-1\r\n"));
        assert!(same(How::Near(2), b":-2\r\n", b":-2\r\n"));
    }
}
