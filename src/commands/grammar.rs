//! One reading of a command's arguments, as Redis's own parsers read them.
//!
//! Redis compares option keywords with C's `strcasecmp` on the argument's bytes, so the
//! comparison stops at the first NUL byte: `EX\0junk`, `persist\0` and `COUNT\0` are the
//! keywords `EX`, `PERSIST` and `COUNT` to Redis. Its parsers walk options positionally from a
//! fixed start, each option consuming its own values, and most let a repeated option's last
//! occurrence win. A rule that compares bytes exactly, or searches for a keyword from the end,
//! disagrees with Redis on some spelling, and every disagreement is a way around the rule.
//! Every rule, the router and the session read options through this module.

/// C's `strcasecmp(arg, keyword) == 0` on a Redis argument: the argument ends at its first NUL
/// byte, as Redis's own parsing sees it.
pub fn keyword(arg: &[u8], keyword: &[u8]) -> bool {
    let end = arg.iter().position(|&b| b == 0).unwrap_or(arg.len());
    arg[..end].eq_ignore_ascii_case(keyword)
}

/// C's `atoi` as glibc implements it, `(int) strtol(s, NULL, 10)`: leading white space, an
/// optional sign, digits up to the first non-digit, saturating at the `long` range, then
/// truncated to `int`. Redis's procedures parse numkeys with it.
pub fn c_atoi(s: &[u8]) -> i32 {
    let mut i = 0;
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        i += 1;
    }
    let mut negative = false;
    if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
        negative = s[i] == b'-';
        i += 1;
    }
    let mut v: i128 = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        if v <= i128::from(i64::MAX) + 1 {
            v = v * 10 + i128::from(s[i] - b'0');
        }
        i += 1;
    }
    let v = if negative { -v } else { v };
    let long = v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
    long as i32
}
