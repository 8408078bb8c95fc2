//! Checks run by the fuzz targets in `fuzz/` and replayed by `tests/fuzz_regressions.rs`, so
//! both use one copy. Not part of the API: each function panics when an invariant breaks.
//!
//! See `docs/fuzzing.md` for what each target checks and how to run it.

use std::ops::Range;
use std::sync::OnceLock;

use crate::commands;
use crate::commands::classify;
use crate::policy::namespace;
use crate::policy::rewrite::{Shape, Strip};
use crate::policy::{Client, Policy, Verdict};
use crate::protocol::codec::{self, CodecLimits, Decoded};
use crate::protocol::reply;

/// Commands decoded from the front of `data` the way the session reads its buffer: decode,
/// advance by the request's length, until the decoder wants more bytes or fails. Inline
/// commands are returned as their arguments; empty requests are skipped.
fn commands_of(data: &[u8], limits: &CodecLimits) -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut ranges = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let buf = &data[pos..];
        match codec::decode(buf, limits, &mut ranges) {
            Ok(Some(d)) => {
                match &d {
                    Decoded::Command { .. } => {
                        out.push(ranges.iter().map(|r| buf[r.clone()].to_vec()).collect())
                    }
                    Decoded::Inline { args, .. } => out.push(args.clone()),
                    Decoded::Empty { .. } => {}
                }
                pos += d.len();
            }
            Ok(None) | Err(_) => break,
        }
    }
    out
}

/// Limits small enough for the fuzzer to reach every limit check.
const SMALL_LIMITS: CodecLimits = CodecLimits {
    max_bulk_len: 16,
    max_multibulk_len: 4,
    max_inline_len: 32,
};

/// `decode` target: the request decoder over arbitrary bytes, as the session drives it.
///
/// - A decoded request occupies at least one byte and at most the buffer.
/// - A multibulk command's argument ranges are ascending, disjoint and inside its frame,
///   within `max_bulk_len`; at least one, at most `max_multibulk_len`.
/// - Every strict prefix of a decoded request is "incomplete" (`Ok(None)`), never an error or
///   another request: the decoder gives the same answer however the bytes arrive.
/// - An inline command re-encoded as RESP (as the session does) decodes back to the same
///   arguments, and so does a multibulk command re-encoded by `codec::encode`.
pub fn check_decode(data: &[u8]) {
    check_decode_with(data, &CodecLimits::default());
    check_decode_with(data, &SMALL_LIMITS);
}

fn check_decode_with(data: &[u8], limits: &CodecLimits) {
    let mut ranges: Vec<Range<usize>> = Vec::new();
    let mut pos = 0;
    // Bounded so that a decoder that makes no progress is reported, not looped on.
    for _ in 0..=data.len() {
        let buf = &data[pos..];
        let decoded = match codec::decode(buf, limits, &mut ranges) {
            Ok(Some(d)) => d,
            Ok(None) | Err(_) => return,
        };
        let len = decoded.len();
        assert!(len > 0, "decoded a request of 0 bytes: {decoded:?}");
        assert!(len <= buf.len(), "request of {len} bytes in {}", buf.len());
        match &decoded {
            Decoded::Command { .. } => {
                assert_eq!(buf[0], b'*');
                assert!(!ranges.is_empty(), "command without arguments");
                assert!(ranges.len() <= limits.max_multibulk_len);
                let mut last_end = 0;
                for r in &ranges {
                    assert!(r.start <= r.end && r.end <= len, "{r:?} outside 0..{len}");
                    assert!(r.start >= last_end, "overlapping arguments");
                    assert!(r.end - r.start <= limits.max_bulk_len);
                    last_end = r.end;
                }
                let args: Vec<&[u8]> = ranges.iter().map(|r| &buf[r.clone()]).collect();
                assert_reencodes(&args);
            }
            Decoded::Inline { args, .. } => {
                assert!(!args.is_empty(), "inline command without arguments");
                assert!(len <= limits.max_inline_len + 1);
                let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                assert_reencodes(&refs);
            }
            Decoded::Empty { .. } => assert!(ranges.is_empty()),
        }
        assert_prefixes_incomplete(&buf[..len], limits);
        pos += len;
    }
    panic!("decoder made no progress");
}

/// `encode(args)` decodes as exactly one command with these arguments.
fn assert_reencodes(args: &[&[u8]]) {
    let encoded = codec::encode(args);
    let mut ranges = Vec::new();
    let decoded = codec::decode(&encoded, &CodecLimits::default(), &mut ranges);
    assert_eq!(
        decoded,
        Ok(Some(Decoded::Command { len: encoded.len() })),
        "re-encoded command does not decode as one command"
    );
    let back: Vec<&[u8]> = ranges.iter().map(|r| &encoded[r.clone()]).collect();
    assert_eq!(back, args, "re-encoded command decodes to other arguments");
}

/// Every strict prefix of one complete request decodes as incomplete.
fn assert_prefixes_incomplete(frame: &[u8], limits: &CodecLimits) {
    let mut ranges = Vec::new();
    // Every cut of a short frame; a sample of a long one (the cost is quadratic).
    let step = (frame.len() / 256).max(1);
    for cut in (0..frame.len()).step_by(step) {
        let got = codec::decode(&frame[..cut], limits, &mut ranges);
        assert_eq!(
            got,
            Ok(None),
            "prefix of {cut} bytes of a {}-byte request",
            frame.len()
        );
    }
}

/// `inline` target: `split_args` over an arbitrary line.
///
/// - Parsing terminates (a NUL once made it loop forever).
/// - Arguments round-trip: quoting each one with `\xHH` escapes and joining them with spaces
///   parses back to the same arguments.
/// - A NUL ends the line, like the C string Redis parses.
pub fn check_inline(data: &[u8]) {
    let Some(args) = codec::split_args(data) else {
        return;
    };
    assert!(args.len() <= data.len(), "more arguments than bytes");
    let mut line = Vec::new();
    for a in &args {
        if !line.is_empty() {
            line.push(b' ');
        }
        line.push(b'"');
        for &b in a {
            if b.is_ascii_alphanumeric() {
                line.push(b);
            } else {
                line.extend_from_slice(format!("\\x{b:02x}").as_bytes());
            }
        }
        line.push(b'"');
    }
    assert_eq!(
        codec::split_args(&line).as_ref(),
        Some(&args),
        "quoted arguments do not parse back"
    );
    if let Some(nul) = memchr::memchr(0, data) {
        assert_eq!(codec::split_args(&data[..nul]).as_ref(), Some(&args));
    }
}

/// `classify_keys` target: every decoded command through classification, command lookup and
/// key extraction.
///
/// - `keys` agrees with `lookup`: it finds keys only for a command the table knows, whose
///   arity accepts the command line.
/// - Key indexes and SORT pattern indexes are arguments (`1..argc`), keys without duplicates
///   unless Redis's own procedure reports one twice.
pub fn check_classify_keys(data: &[u8]) {
    for args in commands_of(data, &CodecLimits::default()) {
        let argc = args.len();
        let kind = classify::classify(&args[0]);
        if kind == classify::Kind::Client && argc > 1 {
            let _ = classify::classify_client(&args[1]);
        }
        let _ = classify::stream_read_blocks(args.iter().map(Vec::as_slice));
        let spec = commands::lookup(&args[0], args.get(1).map(Vec::as_slice));
        assert_eq!(
            spec.map(|s| s as *const _),
            commands::lookup_args(&args).map(|s| s as *const _)
        );
        if let Some(spec) = spec {
            // The full name finds the same entry.
            let by_name = commands::lookup_name(spec.name.as_bytes());
            assert!(std::ptr::eq(by_name.expect("named entry"), spec));
        }
        let mut out = commands::KeyPositions::default();
        match commands::keys_into(&args, &mut out) {
            Ok(found) => {
                let spec = spec.expect("keys found for a command lookup does not know");
                assert!(std::ptr::eq(found, spec), "keys_into and lookup disagree");
                assert!(spec.arity_accepts(argc));
                for k in out.keys() {
                    assert!(
                        k.index >= 1 && k.index < argc,
                        "key index {} outside 1..{argc} for {}",
                        k.index,
                        spec.name
                    );
                }
                for &p in out.key_patterns() {
                    assert!(p >= 2 && p < argc, "pattern index {p} outside 2..{argc}");
                }
                assert!(out.keys().is_empty() || spec.may_have_keys());
                // The allocating form gives the same answer.
                assert_eq!(commands::keys(&args).as_ref(), Ok(&out));
            }
            Err(e) => assert!(out.is_empty() || e == commands::KeyError::InvalidArguments),
        }
    }
}

/// Tenants of the fuzzed policy; see [`policy`].
const TENANT_PREFIXES: [(&str, &str); 2] = [("t1", "t1:"), ("t2", "a*b?[c]\\:")];

/// `policy/default.yaml` plus two namespaced tenants (one with glob characters in its prefix)
/// and one allowed script (`return 1`), compiled once.
fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let mut yaml = include_str!("../../policy/default.yaml").to_string();
        yaml.push_str(
            "\naccess:\n  identities:\n    - {tenant: t1, cidr: 10.0.0.0/8}\n    \
             - {tenant: t2, cidr: 10.1.0.0/16}\n  namespaces:\n    t1: 't1:'\n    \
             t2: 'a*b?[c]\\:'\n  scripts: [e0e1f9fabfc9d4800c877a703b823ac0578ff8db]\n",
        );
        let config = crate::operations::setup::from_yaml(&yaml, std::path::Path::new("fuzz.yaml"))
            .expect("fuzz policy parses");
        let policy = crate::operations::setup::policy(&config).expect("fuzz policy compiles");
        for (name, prefix) in TENANT_PREFIXES {
            let t = policy.access.tenant_index(name).expect("tenant");
            assert_eq!(policy.access.namespace(t), Some(prefix.as_bytes()));
        }
        policy
    })
}

/// `policy_rewrite` target: the first byte picks the client (default tenant, one of the two
/// namespaced tenants, or an unknown tenant index), the rest is decoded into commands, each
/// checked by the policy.
///
/// - A refusal is one RESP error line.
/// - A rewrite never sets both `command` and `append`; the command it forwards (materialized)
///   and every hidden command after it decode as exactly one RESP command each.
/// - For a namespaced tenant, every key of every command forwarded (per `commands::keys`)
///   starts with the tenant's prefix; a command forwarded unchanged has no keys; a reply to
///   strip is stripped of that same prefix.
pub fn check_policy_rewrite(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let policy = policy();
    let tenant = match selector % 4 {
        0 => 0,
        1 => policy.access.tenant_index("t1").expect("t1"),
        2 => policy.access.tenant_index("t2").expect("t2"),
        _ => 0x7fff,
    };
    let client = Client {
        id: u64::from(selector),
        addr: std::net::IpAddr::from([10, 0, 0, selector]),
        tenant,
        user: 0,
        again: false,
    };
    let prefix = policy.access.namespace(tenant);
    for owned in commands_of(rest, &CodecLimits::default()) {
        let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        match policy.check(&client, &args[..]) {
            Verdict::Allow => {
                if prefix.is_some() {
                    let keys = commands::keys(&args).unwrap_or_default();
                    assert!(keys.is_empty(), "keyed command allowed unchanged: {args:?}");
                }
            }
            Verdict::Refuse(error) => {
                assert!(error.starts_with(b"-"), "refusal is not an error");
                assert_eq!(reply::scan(&error), Ok(Some(error.len())));
                assert_eq!(memchr::memchr(b'\r', &error), Some(error.len() - 2));
            }
            Verdict::Rewrite(rw) => {
                assert!(
                    rw.command.is_none() || rw.append.is_none(),
                    "rewrite with both command and append"
                );
                let rw = rw.materialize(&args[..]);
                assert!(rw.append.is_none());
                let forwarded: Vec<Vec<u8>> = match &rw.command {
                    Some(c) => decode_one(c),
                    None => owned.clone(),
                };
                let mut hidden = Vec::new();
                for c in rw.before().iter().chain(&rw.after) {
                    hidden.push(decode_one(c));
                }
                if let Some(prefix) = prefix {
                    let refs: Vec<&[u8]> = forwarded.iter().map(Vec::as_slice).collect();
                    assert_keys_prefixed(prefix, &refs, "rewritten");
                    for h in &hidden {
                        let refs: Vec<&[u8]> = h.iter().map(Vec::as_slice).collect();
                        assert_keys_prefixed(prefix, &refs, "added");
                    }
                    if let Some(strip) = &rw.strip {
                        assert_eq!(&strip.prefix[..], prefix);
                    }
                } else {
                    assert!(rw.strip.is_none(), "strip without a namespace");
                }
            }
        }
    }
}

/// `bytes` decoded as exactly one multibulk command: its arguments.
fn decode_one(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut ranges = Vec::new();
    let decoded = codec::decode(bytes, &CodecLimits::default(), &mut ranges);
    assert_eq!(
        decoded,
        Ok(Some(Decoded::Command { len: bytes.len() })),
        "rewritten command is not one RESP command: {:?}",
        String::from_utf8_lossy(bytes)
    );
    ranges.iter().map(|r| bytes[r.clone()].to_vec()).collect()
}

/// Every key of `args` starts with `prefix` (a command whose keys cannot be found has none
/// Redis would run it with).
fn assert_keys_prefixed(prefix: &[u8], args: &[&[u8]], what: &str) {
    let Ok(keys) = commands::keys(args) else {
        return;
    };
    for i in keys.indices() {
        assert!(
            args[i].starts_with(prefix),
            "{what} command {:?}: key {:?} lacks the prefix {:?}",
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>(),
            String::from_utf8_lossy(args[i]),
            String::from_utf8_lossy(prefix)
        );
    }
}

/// `reply_rewrite` target: the first byte picks a namespace prefix and a [`Shape`], the rest
/// is a stream of upstream replies (RESP2 or RESP3).
///
/// - `scan` finds a complete reply inside the buffer, finds the same length in the reply
///   alone, and calls every strict prefix of it incomplete.
/// - `element` returns slices of the frame; `classify_pubsub` does not panic.
/// - A [`Strip`] of any shape turns one complete reply into one complete reply.
/// - `strip_pubsub` over the whole stream keeps complete frames complete and passes the
///   incomplete tail unchanged.
pub fn check_reply_rewrite(data: &[u8]) {
    let Some((&selector, buf)) = data.split_first() else {
        return;
    };
    let prefix: &[u8] = match selector >> 6 {
        0 => b"t1:",
        1 => b"",
        2 => b"a*b?[c]\\:",
        _ => b"$",
    };
    let shape = match selector % 7 {
        0 => Shape::Names,
        1 => Shape::Scan,
        2 => Shape::FirstElement,
        3 => Shape::Streams,
        4 => Shape::PubSub,
        5 => Shape::Quoted,
        _ => Shape::ChannelCounts,
    };
    let strip = Strip {
        prefix: bytes::Bytes::copy_from_slice(prefix),
        shape,
    };
    let mut pos = 0;
    while let Ok(Some(n)) = reply::scan(&buf[pos..]) {
        assert!(n > 0 && pos + n <= buf.len(), "reply of {n} bytes");
        let frame = &buf[pos..pos + n];
        assert_eq!(reply::scan(frame), Ok(Some(n)));
        let step = (n / 256).max(1);
        for cut in (0..n).step_by(step) {
            assert_eq!(reply::scan(&frame[..cut]), Ok(None), "cut at {cut} of {n}");
        }
        let range = frame.as_ptr_range();
        for i in 0..4 {
            if let Some(e) = reply::element(frame, i) {
                let r = e.as_ptr_range();
                assert!(range.start <= r.start && r.end <= range.end);
            }
        }
        let _ = reply::classify_pubsub(frame);
        let stripped = strip.apply(frame);
        if shape == Shape::PubSub {
            assert_frames(&stripped, "stripped pub/sub frame");
        } else {
            assert_eq!(
                reply::scan(&stripped),
                Ok(Some(stripped.len())),
                "{shape:?} strip of {:?} gave {:?}",
                String::from_utf8_lossy(frame),
                String::from_utf8_lossy(&stripped)
            );
        }
        pos += n;
    }
    let whole = bytes::Bytes::copy_from_slice(buf);
    let out = namespace::strip_pubsub(prefix, &whole);
    let tail = &buf[pos..];
    assert!(out.ends_with(tail), "incomplete tail changed");
    assert_frames(&out[..out.len() - tail.len()], "strip_pubsub output");
}

/// `bytes` is a sequence of complete replies, nothing more.
fn assert_frames(bytes: &[u8], what: &str) {
    let mut pos = 0;
    while pos < bytes.len() {
        match reply::scan(&bytes[pos..]) {
            Ok(Some(n)) => pos += n,
            other => panic!(
                "{what}: {other:?} at byte {pos} of {:?}",
                String::from_utf8_lossy(bytes)
            ),
        }
    }
}
