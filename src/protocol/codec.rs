//! Request decoding: RESP multibulk and inline commands, with Redis's limits and error messages.
//!
//! Hand-written rather than `redis-protocol`'s decoder because the proxy needs three things a
//! general decoder does not give: limits checked on *declared* sizes before anything is
//! buffered (`$999999999999` costs nothing), argument positions as offsets into the read
//! buffer (zero allocations per command; the raw bytes are forwarded untouched), and framing
//! identical to Redis's own parser so forwarded bytes are split into commands exactly as the
//! upstream will split them.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use memchr::memchr;

/// Sizes a client may declare; see [`crate::config::Limits`] for the reasons behind each.
#[derive(Debug, Clone, Copy)]
pub struct CodecLimits {
    /// Largest bulk string (`proto-max-bulk-len`).
    pub(crate) max_bulk_len: usize,
    /// Most arguments in one multibulk.
    pub(crate) max_multibulk_len: usize,
    /// Longest inline command or header line without its terminator.
    pub(crate) max_inline_len: usize,
}

impl CodecLimits {
    /// No limit but what the format can express: for re-reading bytes a peer already
    /// accepted (a batch the primary ran), where the client's limits were applied once.
    pub(crate) const UNBOUNDED: CodecLimits = CodecLimits {
        max_bulk_len: i64::MAX as usize,
        max_multibulk_len: i32::MAX as usize,
        max_inline_len: i64::MAX as usize,
    };
}

impl Default for CodecLimits {
    fn default() -> Self {
        CodecLimits {
            max_bulk_len: 512 * 1024 * 1024,
            max_multibulk_len: 1024 * 1024,
            max_inline_len: 64 * 1024,
        }
    }
}

/// One complete request at the start of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A multibulk command of `len` bytes; its arguments were written to `args` as ranges.
    Command { len: usize },
    /// An inline command (`PING\r\n`) of `len` bytes; its arguments, unquoted.
    Inline { len: usize, args: Vec<Vec<u8>> },
    /// Something Redis skips without a reply: an empty line or `*0`/`*-1`.
    Empty { len: usize },
}

impl Decoded {
    /// Bytes of the buffer this request occupies.
    pub fn len(&self) -> usize {
        match self {
            Decoded::Command { len } | Decoded::Inline { len, .. } | Decoded::Empty { len } => *len,
        }
    }

    /// Whether the request occupies no bytes (never true for a decoded request).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A request Redis would refuse with `-ERR Protocol error: ...` and then close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("Protocol error: too big mbulk count string")]
    MultibulkCountTooLong,
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("Protocol error: too big bulk count string")]
    BulkCountTooLong,
    #[error("Protocol error: expected '$', got '{}'", char::from(*.0))]
    ExpectedBulk(u8),
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,
    #[error("Protocol error: too big inline request")]
    InlineTooLong,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// Decodes the first request in `buf`.
///
/// Returns `Ok(None)` while the request is incomplete (after checking every size declared so
/// far), so the caller reads more and calls again; `args` is cleared and refilled on each call.
pub fn decode(
    buf: &[u8],
    limits: &CodecLimits,
    args: &mut Vec<Range<usize>>,
) -> Result<Option<Decoded>, ProtocolError> {
    args.clear();
    match buf.first() {
        None => Ok(None),
        Some(b'*') => decode_multibulk(buf, limits, args),
        Some(_) => decode_inline(buf, limits),
    }
}

/// Finds the `\r\n`-terminated line starting at `start`; returns the index of `\r`.
/// Like Redis, only `\r` is searched for; the byte after it is assumed to be `\n`.
#[inline]
fn line_end(buf: &[u8], start: usize) -> Option<usize> {
    super::find::find(b'\r', &buf[start..]).map(|i| start + i)
}

/// Redis's `string2ll`: a strict base-10 `long long` (no sign but `-`, no leading zeros, no
/// spaces, at most 20 characters).
#[inline]
pub(crate) fn parse_int(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() >= 21 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        if v > i64::MAX as u64 + 1 {
            return None;
        }
        Some((v as i64).wrapping_neg())
    } else {
        i64::try_from(v).ok()
    }
}

fn decode_multibulk(
    buf: &[u8],
    limits: &CodecLimits,
    args: &mut Vec<Range<usize>>,
) -> Result<Option<Decoded>, ProtocolError> {
    let Some(cr) = line_end(buf, 1) else {
        if buf.len() > limits.max_inline_len {
            return Err(ProtocolError::MultibulkCountTooLong);
        }
        return Ok(None);
    };
    if cr + 2 > buf.len() {
        return Ok(None);
    }
    let count = parse_int(&buf[1..cr]).ok_or(ProtocolError::InvalidMultibulkLength)?;
    if count > limits.max_multibulk_len as i64 || count > i64::from(i32::MAX) {
        return Err(ProtocolError::InvalidMultibulkLength);
    }
    let mut pos = cr + 2;
    if count <= 0 {
        return Ok(Some(Decoded::Empty { len: pos }));
    }
    for _ in 0..count {
        let Some(&kind) = buf.get(pos) else {
            return Ok(None);
        };
        if kind != b'$' {
            return Err(ProtocolError::ExpectedBulk(kind));
        }
        let Some(cr) = line_end(buf, pos + 1) else {
            if buf.len() - pos > limits.max_inline_len {
                return Err(ProtocolError::BulkCountTooLong);
            }
            return Ok(None);
        };
        let len = parse_int(&buf[pos + 1..cr]).ok_or(ProtocolError::InvalidBulkLength)?;
        if len < 0 || len as u64 > limits.max_bulk_len as u64 {
            return Err(ProtocolError::InvalidBulkLength);
        }
        let start = cr + 2;
        // Redis skips the two bytes after the payload without looking at them; so do we, so
        // that both sides agree on where the next command starts.
        let end = start + len as usize;
        if end + 2 > buf.len() {
            return Ok(None);
        }
        args.push(start..end);
        pos = end + 2;
    }
    Ok(Some(Decoded::Command { len: pos }))
}

fn decode_inline(buf: &[u8], limits: &CodecLimits) -> Result<Option<Decoded>, ProtocolError> {
    // Redis finds the end of an inline request with strchr, which stops at a NUL byte: a line
    // with a NUL before its newline is never complete, and Redis waits for more input until
    // the inline limit. Doing the same keeps clients unable to tell the proxy from Redis, and
    // the wait is bounded by `max_inline_len` like any incomplete line.
    let searchable = &buf[..memchr(0, buf).unwrap_or(buf.len())];
    let Some(nl) = memchr(b'\n', searchable) else {
        if buf.len() > limits.max_inline_len {
            return Err(ProtocolError::InlineTooLong);
        }
        return Ok(None);
    };
    if nl > limits.max_inline_len {
        return Err(ProtocolError::InlineTooLong);
    }
    let mut line = &buf[..nl];
    if line.last() == Some(&b'\r') {
        line = &line[..line.len() - 1];
    }
    let args = split_args(line).ok_or(ProtocolError::UnbalancedQuotes)?;
    if args.is_empty() {
        return Ok(Some(Decoded::Empty { len: nl + 1 }));
    }
    Ok(Some(Decoded::Inline { len: nl + 1, args }))
}

/// C's `isspace` in the "C" locale, which Redis's `sdssplitargs` uses: Rust's
/// `is_ascii_whitespace` leaves out the vertical tab.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Splits an inline command line into arguments with the quoting rules of Redis's
/// `sdssplitargs`: `"..."` with `\n \r \t \b \a \\ \" \xHH` escapes, `'...'` with `\'`, and a
/// closing quote must be followed by a space or the end. `None` means unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    // sdssplitargs walks a C string: a NUL byte ends the line. (Treating it as a separator
    // instead would never advance past it: found by tests/hostile_input.rs.) Redis itself
    // looks for the newline with strchr, stops at the NUL and waits for more input; answering
    // the part before the NUL is the friendlier of the two and runs nothing Redis would not
    // have parsed.
    let line = match memchr(0, line) {
        Some(nul) => &line[..nul],
        None => line,
    };
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && is_c_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(out);
        }
        let mut arg = Vec::new();
        i = split_arg(line, i, &mut arg)?;
        out.push(arg);
    }
}

/// Reads the argument that starts at `i` (not a space) into `arg` and returns the index just
/// past it. Quotes may open in the middle of an unquoted argument (`a"b c"` is `ab c`), as in
/// sdssplitargs, and a closing quote ends the argument. `None` means unbalanced quotes.
fn split_arg(line: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Option<usize> {
    while let Some(&c) = line.get(i) {
        match c {
            // sdssplitargs ends an unquoted argument at these four (and the NUL), not at every
            // `isspace` byte: a vertical tab or form feed stays inside the argument.
            b' ' | b'\n' | b'\r' | b'\t' | 0 => break,
            b'"' => return double_quoted(line, i + 1, arg),
            b'\'' => return single_quoted(line, i + 1, arg),
            c => arg.push(c),
        }
        i += 1;
    }
    Some(i)
}

/// Reads a `"..."` part from `i` (just past the opening quote) into `arg`, with its escapes,
/// and returns the index just past the closing quote. `None` when the line ends inside the
/// quotes or the closing quote is followed by anything but a space.
fn double_quoted(line: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Option<usize> {
    loop {
        match line.get(i..)? {
            [b'\\', b'x', h, l, ..] if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                arg.push(hex(*h) * 16 + hex(*l));
                i += 4;
            }
            [b'\\', c, ..] => {
                arg.push(unescape(*c));
                i += 2;
            }
            [b'"', rest @ ..] => return closing_quote(rest, i),
            [c, ..] => {
                arg.push(*c);
                i += 1;
            }
            [] => return None,
        }
    }
}

/// Reads a `'...'` part from `i` (just past the opening quote) into `arg`, where the only
/// escape is `\'`, and returns the index just past the closing quote. `None` as for
/// [`double_quoted`].
fn single_quoted(line: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Option<usize> {
    loop {
        match line.get(i..)? {
            [b'\\', b'\'', ..] => {
                arg.push(b'\'');
                i += 2;
            }
            [b'\'', rest @ ..] => return closing_quote(rest, i),
            [c, ..] => {
                arg.push(*c);
                i += 1;
            }
            [] => return None,
        }
    }
}

/// The index past a closing quote at `at`, followed by `rest`: sdssplitargs wants a space or
/// the end of the line after it, so that `"a"b` is an error rather than two arguments.
fn closing_quote(rest: &[u8], at: usize) -> Option<usize> {
    match rest.first() {
        Some(&next) if !is_c_space(next) => None,
        _ => Some(at + 1),
    }
}

/// The byte a backslash escape inside double quotes stands for: `\n \r \t \b \a`, and any
/// other byte for itself (`\\`, `\"`).
fn unescape(c: u8) -> u8 {
    match c {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    }
}

fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => c - b'A' + 10,
    }
}

/// Encodes a command as a RESP multibulk: the proxy's one encoder, for inline commands (the
/// upstream then runs exactly the arguments the proxy classified), handshakes, control
/// commands and policy rewrites.
pub(crate) fn encode(args: &[&[u8]]) -> Bytes {
    let len: usize = args.iter().map(|a| a.len() + 16).sum();
    let mut out = BytesMut::with_capacity(len + 16);
    put_len(&mut out, b'*', args.len());
    for a in args {
        put_bulk(&mut out, a);
    }
    out.freeze()
}

/// Writes one bulk string.
pub(crate) fn put_bulk(out: &mut BytesMut, arg: &[u8]) {
    put_len(out, b'$', arg.len());
    out.put_slice(arg);
    out.put_slice(b"\r\n");
}

/// Writes `<kind><n>\r\n` without going through `format!`.
pub(crate) fn put_len(out: &mut BytesMut, kind: u8, n: usize) {
    out.put_u8(kind);
    out.put_slice(itoa_buf(n as u64).as_bytes());
    out.put_slice(b"\r\n");
}

/// Decimal digits of a number on the stack.
pub(crate) struct Digits {
    /// Room for the longest `u64`, filled from the end.
    buf: [u8; 20],
    /// Where the digits start in `buf`.
    start: usize,
}

impl Digits {
    /// The digits, as bytes: callers write them into RESP, and a `&str` view cost a UTF-8
    /// check per number (it showed in profiles of the commands the policy builds).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

pub(crate) fn itoa_buf(mut n: u64) -> Digits {
    let mut d = Digits {
        buf: [0; 20],
        start: 20,
    };
    loop {
        d.start -= 1;
        d.buf[d.start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return d;
        }
    }
}

/// The arguments of one whole command (multibulk or inline), copied; `None` for bytes that
/// are not exactly one command. For the few places that read a command kept from earlier
/// (the mirror's queued transactions, tests), not the data path.
pub(crate) fn split_args_of(command: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut ranges = Vec::new();
    match decode(command, &CodecLimits::UNBOUNDED, &mut ranges).ok()?? {
        Decoded::Command { len } if len == command.len() => {
            Some(ranges.iter().map(|r| command[r.clone()].to_vec()).collect())
        }
        Decoded::Inline { len, args } if len == command.len() => Some(args),
        _ => None,
    }
}

/// Commands of a batch as sent, as slices of its bytes (empty lines left out; a client's
/// inline command, forwarded as it came, counts like any other). Stops at bytes that are not
/// a whole command, which a batch the proxy built never holds.
pub(crate) fn split_commands(bytes: &Bytes, limits: &CodecLimits) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        match decode(&bytes[pos..], limits, &mut ranges) {
            Ok(Some(Decoded::Empty { len })) => pos += len,
            Ok(Some(decoded)) => {
                out.push(bytes.slice(pos..pos + decoded.len()));
                pos += decoded.len();
            }
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(buf: &[u8]) -> Result<Option<Decoded>, ProtocolError> {
        let mut args = Vec::new();
        decode(buf, &CodecLimits::default(), &mut args)
    }

    fn args_of(buf: &[u8]) -> Vec<Vec<u8>> {
        split_args_of(buf).unwrap()
    }

    #[test]
    fn multibulk_complete_and_partial() {
        let req = b"*2\r\n$3\r\nGET\r\n$3\r\nfoo\r\n";
        assert_eq!(dec(req), Ok(Some(Decoded::Command { len: req.len() })));
        assert_eq!(args_of(req), vec![b"GET".to_vec(), b"foo".to_vec()]);
        for cut in 0..req.len() {
            assert_eq!(dec(&req[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn binary_payload_with_crlf_inside() {
        let req = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n";
        assert_eq!(args_of(req)[2], b"a\r\nb".to_vec());
    }

    #[test]
    fn huge_declarations_fail_before_buffering() {
        assert_eq!(
            dec(b"*1\r\n$999999999999\r\n"),
            Err(ProtocolError::InvalidBulkLength)
        );
        assert_eq!(
            dec(b"*99999999999\r\n"),
            Err(ProtocolError::InvalidMultibulkLength)
        );
        assert_eq!(dec(b"*1\r\n$-5\r\n"), Err(ProtocolError::InvalidBulkLength));
        assert_eq!(dec(b"*x\r\n"), Err(ProtocolError::InvalidMultibulkLength));
        assert_eq!(
            dec(b"*1\r\n+foo\r\n"),
            Err(ProtocolError::ExpectedBulk(b'+'))
        );
        assert_eq!(
            ProtocolError::ExpectedBulk(b'+').to_string(),
            "Protocol error: expected '$', got '+'"
        );
    }

    #[test]
    fn header_without_terminator_is_bounded() {
        let mut buf = b"*".to_vec();
        buf.extend(std::iter::repeat_n(b'1', 70_000));
        assert_eq!(dec(&buf), Err(ProtocolError::MultibulkCountTooLong));
        let inline = vec![b'a'; 70_000];
        assert_eq!(dec(&inline), Err(ProtocolError::InlineTooLong));
    }

    #[test]
    fn empty_multibulk_and_lines_are_skipped() {
        assert_eq!(dec(b"*0\r\n"), Ok(Some(Decoded::Empty { len: 4 })));
        assert_eq!(dec(b"*-1\r\n"), Ok(Some(Decoded::Empty { len: 5 })));
        assert_eq!(dec(b"\r\n"), Ok(Some(Decoded::Empty { len: 2 })));
    }

    #[test]
    fn inline_commands_with_quotes() {
        assert_eq!(
            dec(b"PING\r\n"),
            Ok(Some(Decoded::Inline {
                len: 6,
                args: vec![b"PING".to_vec()]
            }))
        );
        assert_eq!(
            split_args(br#"set "a b" 'c\'d' "\x41\n""#).unwrap(),
            vec![
                b"set".to_vec(),
                b"a b".to_vec(),
                b"c'd".to_vec(),
                b"A\n".to_vec()
            ]
        );
        assert_eq!(split_args(br#"set "a"#), None);
        assert_eq!(split_args(br#"set "a"b"#), None);
        assert_eq!(dec(b"set \"a\r\n"), Err(ProtocolError::UnbalancedQuotes));
        // A NUL ends the line, as in Redis's sdssplitargs (this once looped forever).
        assert_eq!(
            split_args(b"GET a\x00b c").unwrap(),
            vec![b"GET".to_vec(), b"a".to_vec()]
        );
        assert_eq!(split_args(b"\x00GET").unwrap(), Vec::<Vec<u8>>::new());
        // In a request, a NUL before the newline leaves the line incomplete, as in Redis,
        // until the inline limit.
        assert_eq!(dec(b"PI\x00NG\r\n"), Ok(None));
        let mut long = b"PI\x00NG\r\n".to_vec();
        long.extend(vec![b'a'; 70 * 1024]);
        assert_eq!(dec(&long), Err(ProtocolError::InlineTooLong));
        assert!(matches!(
            dec(b"PING\r\n\x00"),
            Ok(Some(Decoded::Inline { len: 6, .. }))
        ));
    }

    #[test]
    fn ints_follow_redis_string2ll() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-1"), Some(-1));
        assert_eq!(parse_int(b"01"), None);
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b""), None);
        assert_eq!(parse_int(b"99999999999999999999"), None);
    }

    #[test]
    fn encode_inline_as_resp() {
        assert_eq!(&encode(&[b"PING"])[..], b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(
            &encode(&[b"SET", b"k", b"v", b"PX", b"10"])[..],
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$2\r\n10\r\n"
        );
    }
}
