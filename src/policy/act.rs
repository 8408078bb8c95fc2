//! What a rule's kind does to one command line before its mode is considered, pure so
//! `check` and `explain` share it: `act` dispatches to the refusals of the rules that read
//! arguments (`violation`: deny, argument guards, sizes, key names, scripts), the stream cap
//! and the TTL rule; `refusal` writes the error reply that names the rule.

use bytes::Bytes;

use super::rewrite::Rewrite;
use super::{CommandLine, Kind, Rule, ranges, restore_size, ttl};
use crate::commands::{self, CommandSpec};
use crate::protocol::error::simple_error;

/// What a rule of `kind` (not a rate limit) does to a command, if anything.
pub(super) enum Act {
    /// Refuse with this code and reason.
    Refuse(&'static str, String),
    /// Forward as rewritten.
    Rewrite(Rewrite),
}

/// The rule's verdict on a command before its mode is considered: pure, so `check` and
/// `explain` share it. Rate limits are not here (checking one spends budget).
/// `build` says whether a rewrite's commands are needed or only its note.
pub(super) fn act<L: CommandLine + ?Sized>(
    kind: &Kind,
    spec: &'static CommandSpec,
    line: &L,
    build: ttl::Build,
) -> Option<Act> {
    match kind {
        Kind::StreamMaxLen(n) => stream_cap(spec, line, *n).map(Act::Rewrite),
        Kind::Ttl(t) => match t.apply(spec, line, build) {
            ttl::TtlAction::Keep => None,
            ttl::TtlAction::Refuse(reason) => Some(Act::Refuse("NOPERM", reason)),
            ttl::TtlAction::Rewrite(rw) => Some(Act::Rewrite(rw)),
        },
        kind => violation(kind, spec, line).map(|(code, reason)| Act::Refuse(code, reason)),
    }
}

/// The error reply refusing a command: the rule, the reason, the operator's advice.
pub(super) fn refusal(rule: &Rule, code: &'static str, reason: &str) -> Bytes {
    let text = match &rule.message {
        Some(m) => format!("policy {}: {reason}; {m}", rule.id),
        None => format!("policy {}: {reason}", rule.id),
    };
    simple_error(code, &text)
}

/// The error code and reason when `kind` refuses the command, else `None`.
fn violation<L: CommandLine + ?Sized>(
    kind: &Kind,
    spec: &'static CommandSpec,
    line: &L,
) -> Option<(&'static str, String)> {
    let upper = || spec.name.to_ascii_uppercase().replace('|', " ");
    match kind {
        Kind::Deny { unless_arg } => {
            if let Some(word) = unless_arg {
                if (1..line.argc()).any(|i| commands::grammar::keyword(line.arg(i), word)) {
                    return None;
                }
            }
            Some(("NOPERM", format!("{} is not allowed", upper())))
        }
        Kind::MaxScanCount(max) => {
            let from = if spec.name == "scan" { 2 } else { 3 };
            let count = commands::grammar::scan_options(line, from)?.count?;
            let n = crate::protocol::codec::parse_int(line.arg(count))?;
            (n > *max as i64).then(|| ("ERR", format!("{} COUNT {n} is above {max}", upper())))
        }
        Kind::UnboundedReads => match ranges::read_size(spec, line)? {
            ranges::Size::Whole => Some(("ERR", format!("{} reads a whole collection", upper()))),
            ranges::Size::AtMost(_) => None,
        },
        Kind::MaxRange(max) => match ranges::read_size(spec, line)? {
            ranges::Size::Whole => Some((
                "ERR",
                format!(
                    "{} reads a whole collection; ask for at most {max}",
                    upper()
                ),
            )),
            ranges::Size::AtMost(n) if n > *max => Some((
                "ERR",
                format!("{} asks for up to {n} elements, above {max}", upper()),
            )),
            ranges::Size::AtMost(_) => None,
        },
        Kind::MaxValueBytes(max) => {
            if let Some(reason) = restore_size::refusal(spec, line, *max) {
                return Some(("ERR", reason));
            }
            if let Some(n) = grown_value(spec, line).filter(|n| n > max) {
                return Some((
                    "ERR",
                    format!("{} would grow the value to {n} bytes, above {max}", upper()),
                ));
            }
            oversized_value(spec, line, *max).map(|largest| {
                (
                    "ERR",
                    format!("{} value of {largest} bytes is above {max}", upper()),
                )
            })
        }
        Kind::RateLimit { .. }
        | Kind::SharedRateLimit { .. }
        | Kind::Ttl(_)
        | Kind::StreamMaxLen(_) => None,
        Kind::KeyPattern(re) => bad_key_name(spec, line, re).map(|message| ("ERR", message)),
        Kind::Scripts(s) => s.refusal(spec, line).map(|r| ("NOPERM", r)),
        Kind::MaxKeys(max) => too_many_keys(spec, line, *max)
            .map(|n| ("ERR", format!("{} names {n} keys, above {max}", upper()))),
    }
}

/// The largest value argument of a write (any argument that is not the name or a key) when
/// it is above `max` bytes. Scripts that may write (EVAL, EVALSHA, FCALL) count as writes:
/// their arguments after the keys are the values a script can store; the script body or name
/// is not a value.
fn oversized_value<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    max: u64,
) -> Option<usize> {
    // Cheap exits first: most commands have no argument that long.
    if !(1..line.argc()).any(|i| line.arg(i).len() as u64 > max) {
        return None;
    }
    if !spec.may_write() {
        return None;
    }
    let scripted = spec.runs_writable_script();
    let mut keys = commands::KeyPositions::with_capacity(0);
    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    let _ = commands::keys_into(&args, &mut keys);
    let first_value = if scripted { 2 } else { 1 };
    let largest = (first_value..args.len())
        .filter(|i| !keys.indices().any(|k| k == *i))
        .map(|i| args[i].len())
        .max()?;
    (largest as u64 > max).then_some(largest)
}

/// The length in bytes a string value reaches at least after a write that extends it at an
/// offset the arguments give: SETRANGE (offset + length of the value; an empty value extends
/// nothing), SETBIT (the byte of the bit) and BITFIELD's SET and INCRBY (the last byte of the
/// field). APPEND is not here: what it reaches depends on the value already stored.
fn grown_value<L: CommandLine + ?Sized>(spec: &'static CommandSpec, line: &L) -> Option<u64> {
    let number = |i: usize| {
        (i < line.argc())
            .then(|| crate::protocol::codec::parse_int(line.arg(i)))
            .flatten()
            .and_then(|n| u64::try_from(n).ok())
    };
    match spec.name {
        "setrange" if line.argc() == 4 && !line.arg(3).is_empty() => {
            Some(number(2)?.saturating_add(line.arg(3).len() as u64))
        }
        "setbit" => Some(number(2)? / 8 + 1),
        "bitfield" => commands::grammar::bitfield_reach(line),
        // Redis 8's `VADD key [REDUCE dim] VALUES n v1 … vn element`: a vector of n floats
        // (4 bytes each), whatever the arguments that follow hold; a count far beyond them
        // made Redis 8.0.6 abort allocating it.
        "vadd" => (1..line.argc().saturating_sub(1))
            .find(|&i| commands::grammar::keyword(line.arg(i), b"VALUES"))
            .and_then(|i| number(i + 1))
            .map(|n| n.saturating_mul(4)),
        _ => None,
    }
}

/// The refusal for the first key that does not match the naming pattern `re`.
fn bad_key_name<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    re: &regex::bytes::Regex,
) -> Option<String> {
    if !spec.may_have_keys() {
        return None;
    }
    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    let keys = match commands::keys(&args) {
        Ok(keys) => keys,
        Err(commands::KeyError::Unmirrored) => {
            return Some(format!(
                "{} finds its keys in a way the proxy cannot follow, so their names cannot \
                 be checked",
                spec.name.to_ascii_uppercase()
            ));
        }
        Err(_) => return None,
    };
    let bad = keys.indices().map(|i| args[i]).find(|k| !re.is_match(k))?;
    Some(format!(
        "key '{}' does not match the naming pattern {}",
        String::from_utf8_lossy(bad),
        re.as_str()
    ))
}

/// How many keys the command names, when above `max`.
fn too_many_keys<L: CommandLine + ?Sized>(
    spec: &'static CommandSpec,
    line: &L,
    max: u64,
) -> Option<usize> {
    // A command cannot name more keys than it has arguments.
    if !spec.may_have_keys() || (line.argc() as u64).saturating_sub(1) <= max {
        return None;
    }
    let args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    match commands::keys(&args) {
        Ok(keys) => (keys.len() as u64 > max).then_some(keys.len()),
        // Keys only the server can find: every argument may be one (fail closed).
        Err(commands::KeyError::Unmirrored) => Some(line.argc() - 1),
        Err(_) => None,
    }
}

/// XADD without MAXLEN/MINID, rewritten with `MAXLEN ~ n` right after the key (Redis reads
/// XADD's options up to the entry id, in any order).
fn stream_cap<L: CommandLine + ?Sized>(spec: &CommandSpec, line: &L, n: u64) -> Option<Rewrite> {
    if spec.name != "xadd" || line.argc() < 3 {
        return None;
    }
    // Already capped as Redis reads it (`MAXLEN\0` is MAXLEN); options Redis refuses are
    // left to Redis. The cap goes first, so an option the client gives wins as its last.
    if commands::grammar::xadd_trims(line)? {
        return None;
    }
    let n = n.to_string();
    let mut args: Vec<&[u8]> = (0..line.argc()).map(|i| line.arg(i)).collect();
    args.splice(2..2, [&b"MAXLEN"[..], b"~", n.as_bytes()]);
    Some(Rewrite {
        command: Some(crate::protocol::codec::encode(&args)),
        note: "XADD gets MAXLEN ~ <n>".into(),
        ..Rewrite::default()
    })
}

#[cfg(test)]
mod tests {
    use crate::policy::Verdict;
    use crate::policy::test_support::{check, policy, refused};

    #[test]
    fn guards_and_size_limits() {
        let p = policy(
            "rules:\n  - id: scan\n    max_scan_count: 1000\n  - id: reads\n    deny_unbounded_reads: true\n  - id: big\n    max_value_bytes: 10\n  - id: keys\n    max_keys: 2\n",
        );
        assert!(refused(check(&p, "SCAN 0 COUNT 5000")).contains("COUNT 5000 is above 1000"));
        assert_eq!(check(&p, "SCAN 0 COUNT 100"), Verdict::Allow);
        assert!(refused(check(&p, "HSCAN h 0 count 5000")).contains("policy scan"));
        assert!(refused(check(&p, "LRANGE l 0 -1")).contains("policy reads"));
        assert!(refused(check(&p, "ZRANGE z -inf +inf BYSCORE")).contains("policy reads"));
        assert_eq!(check(&p, "LRANGE l 0 99"), Verdict::Allow);
        let r = policy("rules:\n  - id: range\n    max_range: 1000\n");
        assert!(
            refused(check(&r, "LRANGE l 0 999999999"))
                .contains("LRANGE asks for up to 1000000000 elements, above 1000")
        );
        assert!(refused(check(&r, "SRANDMEMBER s -5000")).contains("up to 5000 elements"));
        assert!(refused(check(&r, "ZREVRANGE z 0 -1")).contains("reads a whole collection"));
        assert_eq!(check(&r, "ZRANGE z 0 999"), Verdict::Allow);
        assert_eq!(check(&r, "HRANDFIELD h 10"), Verdict::Allow);
        assert!(refused(check(&p, "SET k 12345678901")).contains("policy big"));
        // A long key name is not a value.
        assert_eq!(check(&p, "SET kkkkkkkkkkkkkkkk v"), Verdict::Allow);
        assert_eq!(check(&p, "GET kkkkkkkkkkkkkkkkkkkk"), Verdict::Allow);
        // Writes at an offset: the size they reach is known from the arguments.
        assert!(refused(check(&p, "SETRANGE k 8 abc")).contains("grow the value to 11 bytes"));
        assert_eq!(check(&p, "SETRANGE k 7 abc"), Verdict::Allow);
        assert_eq!(check(&p, "SETRANGE k 99 "), Verdict::Allow);
        assert!(refused(check(&p, "SETBIT k 80 1")).contains("to 11 bytes"));
        assert_eq!(check(&p, "SETBIT k 79 1"), Verdict::Allow);
        assert!(refused(check(&p, "BITFIELD k GET u8 0 SET u8 #10 1")).contains("to 11 bytes"));
        assert_eq!(
            check(&p, "BITFIELD k INCRBY i16 64 1 GET u8 #99"),
            Verdict::Allow
        );
        // A script's values are its arguments after the keys; the body is not one.
        assert!(refused(check(&p, "EVAL s 1 k 12345678901")).contains("policy big"));
        assert_eq!(check(&p, "EVAL return_a_long_body 1 k v"), Verdict::Allow);
        assert_eq!(check(&p, "EVAL_RO s 1 k 12345678901"), Verdict::Allow);
        assert!(refused(check(&p, "MGET a b c")).contains("names 3 keys"));
        assert_eq!(check(&p, "MGET a b"), Verdict::Allow);
    }

    #[test]
    fn streams_are_capped_and_key_names_checked() {
        let p = policy(
            "rules:\n  - id: cap\n    stream_maxlen: 1000\n  - id: names\n    key_pattern: '^[a-z]+(:[A-Za-z0-9_-]+)+$'\n",
        );
        match check(&p, "XADD events:1 * f v") {
            Verdict::Rewrite(rw) => assert_eq!(
                rw.command.unwrap(),
                crate::protocol::codec::encode(&[
                    b"XADD",
                    b"events:1",
                    b"MAXLEN",
                    b"~",
                    b"1000",
                    b"*",
                    b"f",
                    b"v"
                ])
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(check(&p, "XADD events:1 MAXLEN 10 * f v"), Verdict::Allow);
        assert_eq!(
            check(&p, "XADD events:1 NOMKSTREAM MINID 5 * f v"),
            Verdict::Allow
        );
        assert!(refused(check(&p, "GET Bad_Key")).contains("key 'Bad_Key' does not match"));
        assert_eq!(check(&p, "GET user:42"), Verdict::Allow);
        assert_eq!(check(&p, "PING"), Verdict::Allow);
    }
}
