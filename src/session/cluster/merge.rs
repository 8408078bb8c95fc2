//! The replies of several cluster nodes made into the client's one reply: a fan-out's
//! (`Merge`), a split command's parts (`Join`), a node's SCAN step. Pure functions over
//! reply bytes: no session, no node, nothing sent.

use super::hll;
use crate::commands::grammar::keyword;
use crate::protocol::double_text::{DoubleText, ServerDoubles};
use crate::protocol::{answers, codec};
use bytes::{Bytes, BytesMut};

/// How the replies of a command sent to every primary become one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Merge {
    /// Integer replies added up (DBSIZE).
    Sum,
    /// SLOWLOG LEN: the integer replies added up, at most the length one server keeps
    /// (`Router::slowlog_max_len`, when known). A command logged by every primary counts
    /// once per node here, where the merged SLOWLOG GET lists it once.
    SumAtMost(Option<usize>),
    /// Array replies concatenated (KEYS).
    Concat,
    /// The first error, else the first reply (FLUSHALL, FLUSHDB).
    AllOk,
    /// The first non-nil reply, starting from a node that varies (RANDOMKEY).
    FirstNonNil,
    /// WAIT/WAITAOF: the smallest count (element-wise for WAITAOF's pair): the replicas (or
    /// fsyncs) every node the client may have written to has reached.
    Min,
    /// SCRIPT EXISTS: element-wise the largest, so a script any node has cached (an EVAL
    /// runs on one node, its keys') is known, as one Redis would know it.
    Max,
    /// INFO: one node's text, with `# Keyspace` counts summed over the primaries and
    /// `cluster_enabled:0` (to its clients the proxy is one server).
    Info,
    /// SLOWLOG GET: every node's entries as one server's log (`merge_slowlog`), at most this
    /// many (`None`: all, `SLOWLOG GET -1`).
    Slowlog(Option<usize>),
    /// SCRIPT KILL, FUNCTION KILL: sent to every primary because a script runs on the node
    /// of its keys, which the killer cannot name. `+OK` when one node killed a script;
    /// otherwise the most telling refusal: a node's `UNKILLABLE` (its script wrote), any
    /// other error (a node that could not be asked may be the busy one), else `NOTBUSY`.
    Kill,
}

impl Merge {
    /// Whether a transaction can carry it: queued on the transaction's node, then sent to
    /// each other primary once EXEC ran it there, its EXEC element merged with their replies
    /// (`transaction::spread_after_exec`). Not SCRIPT KILL (a script runs while EXEC waits)
    /// nor WAIT (it counts the writes of the connection that runs it, not the others').
    pub(super) fn runs_after_exec(self) -> bool {
        !matches!(self, Merge::Kill | Merge::Min)
    }
}

/// How the replies of a multi-key command split by slot become the client's one reply.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Join {
    /// MGET: the values put back in the client's key order.
    Values,
    /// MSET: `+OK` when every part says so, else the first error.
    AllOk,
    /// DEL, UNLINK, EXISTS, TOUCH: the counts added up.
    Sum,
    /// SUNION, SINTER, SDIFF, SINTERCARD: one `SMEMBERS` per key, combined as the command
    /// would (see [`SetOp`]).
    Sets(SetOp),
    /// ZUNION, ZINTER, ZDIFF, ZINTERCARD: per key `ZRANGE key 0 -1` then `SMEMBERS` (the
    /// key is a sorted set or a set, which these commands take too), combined as the command
    /// would (see [`ZOp`]). The parts carry the ZRANGE replies at the key's positions and the
    /// SMEMBERS replies at the key's positions plus the number of keys.
    Sorted(ZOp),
    /// PFCOUNT: one `GET` per key, the HyperLogLogs merged and counted as one Redis counts
    /// several keys (see [`hll`]).
    HllCount,
    /// XREAD: one XREAD per stream; the streams that have entries, in the client's order, as
    /// one reply (none: a null).
    Streams,
}

/// What a set command across slots computes from its keys' members (a missing key is an
/// empty set, as in Redis). Members are compared as their reply frames: a node sends one
/// member as one bulk string, byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SetOp {
    /// SUNION: the members of any key.
    Union,
    /// SINTER: the members of every key.
    Inter,
    /// SDIFF: the members of the first key that no other key has.
    Diff,
    /// SINTERCARD: how many members every key has, counting no further than the limit
    /// (0: no limit).
    InterCard(u64),
}

/// Combines one reply per primary.
pub(super) fn merge(how: Merge, replies: &[Bytes], seed: u64) -> Bytes {
    if let Some(e) = replies.iter().find(|r| r.first() == Some(&b'-')) {
        // Those two look past a node's error: another node may hold what the client wants.
        if !matches!(how, Merge::FirstNonNil | Merge::Kill) {
            return e.clone();
        }
    }
    match how {
        Merge::Sum | Merge::SumAtMost(_) => {
            let mut total: i64 = 0;
            for r in replies {
                match r
                    .strip_prefix(b":")
                    .and_then(|r| r.strip_suffix(b"\r\n"))
                    .and_then(codec::parse_int)
                {
                    Some(n) => total = total.saturating_add(n),
                    None => return unexpected(r),
                }
            }
            if let Merge::SumAtMost(Some(most)) = how {
                total = total.min(i64::try_from(most).unwrap_or(i64::MAX));
            }
            answers::integer(total)
        }
        Merge::Concat => {
            let mut count: i64 = 0;
            let mut body = BytesMut::new();
            for r in replies {
                let header_end = match memchr::memchr(b'\r', r) {
                    Some(i) if matches!(r.first(), Some(b'*' | b'~')) => i,
                    _ => return unexpected(r),
                };
                let Some(n) = codec::parse_int(&r[1..header_end]) else {
                    return unexpected(r);
                };
                count += n.max(0);
                body.extend_from_slice(&r[header_end + 2..]);
            }
            let mut out = BytesMut::from(format!("*{count}\r\n").as_bytes());
            out.extend_from_slice(&body);
            out.freeze()
        }
        Merge::AllOk => replies
            .first()
            .cloned()
            .unwrap_or_else(answers::clusterdown),
        Merge::Info => super::info::merge_info(replies),
        Merge::Min => merge_ints(replies, i64::min),
        Merge::Max => merge_ints(replies, i64::max),
        Merge::Kill => merge_kill(replies),
        Merge::Slowlog(limit) => merge_slowlog(replies, limit),
        Merge::FirstNonNil => {
            let n = replies.len();
            let start = (seed as usize).wrapping_add(n / 2) % n.max(1);
            let nil =
                |r: &Bytes| r.first() == Some(&b'-') || &r[..] == b"$-1\r\n" || &r[..] == b"_\r\n";
            (0..n)
                .map(|k| &replies[(start + k) % n])
                .find(|r| !nil(r))
                .or_else(|| replies.iter().find(|r| r.first() != Some(&b'-')))
                .or(replies.first())
                .cloned()
                .unwrap_or_else(answers::clusterdown)
        }
    }
}

/// SLOWLOG GET from every node as the log of one server: newest first (Redis lists its own
/// newest first; ids are per node and times in seconds, so the time orders them, the id
/// breaks ties), `limit` at most. A command the proxy sends to every primary (`FANNED_OUT`)
/// is logged by each, where one server logs it once: of the entries with one time and the
/// same arguments from several nodes, one is kept. A `SLOWLOG RESET` clears each node's log
/// and then logs itself: one is kept, ranked oldest, as nothing in any node's log is older.
fn merge_slowlog(replies: &[Bytes], limit: Option<usize>) -> Bytes {
    // (time, id), the node's index, the arguments, the entry.
    let mut entries: Vec<((i64, i64), usize, Bytes, Bytes)> = Vec::new();
    let mut reset = None;
    for (node, reply) in replies.iter().enumerate() {
        let Some(items) = crate::protocol::reply::array_elements(reply) else {
            return unexpected(reply);
        };
        for entry in items {
            let head = crate::protocol::reply::array_elements(&entry).and_then(|fields| {
                let int = |f: &Bytes| {
                    f.strip_prefix(b":")
                        .and_then(|r| codec::parse_int(r.strip_suffix(b"\r\n")?))
                };
                Some((
                    (int(fields.get(1)?)?, int(fields.first()?)?),
                    fields.get(3)?.clone(),
                ))
            });
            let Some((order, args)) = head else {
                return unexpected(&entry);
            };
            if logs_reset(&args) {
                reset.get_or_insert(entry);
                continue;
            }
            let twin = fanned_out(&args)
                && entries
                    .iter()
                    .any(|(o, n, a, _)| o.0 == order.0 && *n != node && *a == args);
            if !twin {
                entries.push((order, node, args, entry));
            }
        }
    }
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    let kept = entries.into_iter().map(|e| e.3).chain(reset);
    let kept: Vec<Bytes> = kept.take(limit.unwrap_or(usize::MAX)).collect();
    let mut out = BytesMut::from(format!("*{}\r\n", kept.len()).as_bytes());
    for entry in kept {
        out.extend_from_slice(&entry);
    }
    out.freeze()
}

/// Commands (by name) the proxy sends to every primary in cluster mode (`fanout_merge`), as
/// a slow log entry's arguments name them.
const FANNED_OUT: [&[u8]; 10] = [
    b"slowlog",
    b"config",
    b"flushall",
    b"flushdb",
    b"script",
    b"function",
    b"info",
    b"dbsize",
    b"acl",
    b"keys",
];

/// Whether a slow log entry's arguments are a command sent to every primary.
fn fanned_out(args: &[u8]) -> bool {
    crate::protocol::reply::element(args, 0)
        .is_some_and(|name| FANNED_OUT.iter().any(|f| name.eq_ignore_ascii_case(f)))
}

/// Whether a slow log entry's arguments are `SLOWLOG RESET`.
fn logs_reset(args: &[u8]) -> bool {
    let arg = |i| crate::protocol::reply::element(args, i);
    args.starts_with(b"*2\r\n")
        && arg(0).is_some_and(|a| a.eq_ignore_ascii_case(b"slowlog"))
        && arg(1).is_some_and(|a| a.eq_ignore_ascii_case(b"reset"))
}

/// SCRIPT KILL / FUNCTION KILL answered by every primary: one script at most runs per node,
/// and Redis answers `+OK` only where it killed one (see [`Merge::Kill`]).
fn merge_kill(replies: &[Bytes]) -> Bytes {
    let is = |r: &Bytes, prefix: &[u8]| r.starts_with(prefix);
    replies
        .iter()
        .find(|r| is(r, b"+OK"))
        .or_else(|| replies.iter().find(|r| is(r, b"-UNKILLABLE")))
        .or_else(|| replies.iter().find(|r| !is(r, b"-NOTBUSY")))
        .or(replies.first())
        .cloned()
        .unwrap_or_else(answers::clusterdown)
}

/// Joins the replies of a split command's parts (see [`Join`]); the first error wins.
pub(super) fn join(how: Join, keys: usize, parts: &[(Vec<usize>, Bytes)], proto: u8) -> Bytes {
    if let Join::Sets(op) = how {
        return join_sets(op, keys, parts, proto);
    }
    if let Join::Sorted(op) = how {
        return join_sorted(op, keys, parts, proto);
    }
    if how == Join::HllCount {
        return join_hll(keys, parts);
    }
    if how == Join::Streams {
        return join_streams(parts, proto);
    }
    if how != Join::Values {
        let replies: Vec<Bytes> = parts.iter().map(|(_, r)| r.clone()).collect();
        return merge(
            if how == Join::Sum {
                Merge::Sum
            } else {
                Merge::AllOk
            },
            &replies,
            0,
        );
    }
    let nil: &[u8] = if proto == 3 { b"_\r\n" } else { b"$-1\r\n" };
    let mut values: Vec<Bytes> = vec![Bytes::from_static(b""); keys];
    for (positions, reply) in parts {
        if reply.first() != Some(&b'*') {
            return if reply.first() == Some(&b'-') {
                reply.clone()
            } else {
                unexpected(reply)
            };
        }
        let Some(cr) = memchr::memchr(b'\r', reply) else {
            return unexpected(reply);
        };
        if codec::parse_int(&reply[1..cr]) != Some(positions.len() as i64) {
            return unexpected(reply);
        }
        let elements = crate::protocol::reply::split(&reply.slice(cr + 2..));
        if elements.len() != positions.len() {
            return unexpected(reply);
        }
        for (&p, v) in positions.iter().zip(elements) {
            if let Some(slot) = values.get_mut(p) {
                *slot = v;
            }
        }
    }
    let mut out = BytesMut::from(format!("*{keys}\r\n").as_bytes());
    for v in values {
        out.extend_from_slice(if v.is_empty() { nil } else { &v });
    }
    out.freeze()
}

/// XREAD's reply from one reply per stream (`parts`, each at its stream's position): the
/// streams with entries in the client's order, as an array of `[stream, entries]` pairs
/// (RESP2) or a map (RESP3), as Redis answers; a null when none has any; the first error
/// in the client's order if a stream's XREAD failed.
fn join_streams(parts: &[(Vec<usize>, Bytes)], proto: u8) -> Bytes {
    let mut ordered: Vec<(usize, &Bytes)> = parts
        .iter()
        .map(|(p, r)| (p.first().copied().unwrap_or(usize::MAX), r))
        .collect();
    ordered.sort_by_key(|(p, _)| *p);
    if let Some((_, e)) = ordered.iter().find(|(_, r)| r.first() == Some(&b'-')) {
        return (*e).clone();
    }
    let mut out = BytesMut::new();
    let mut streams = 0;
    for (_, reply) in ordered {
        if matches!(&reply[..], b"*-1\r\n" | b"_\r\n") {
            continue;
        }
        // One stream asked: `*1` then its `[stream, entries]` pair, or `%1` then the two.
        let Some(cr) = memchr::memchr(b'\r', reply) else {
            return unexpected(reply);
        };
        let one = match (reply.first(), codec::parse_int(&reply[1..cr])) {
            (Some(b'*' | b'%'), Some(1)) => reply.slice(cr + 2..),
            _ => return unexpected(reply),
        };
        out.extend_from_slice(&one);
        streams += 1;
    }
    if streams == 0 {
        return answers::null_array(proto);
    }
    let head = if proto == 3 { '%' } else { '*' };
    let mut reply = BytesMut::from(format!("{head}{streams}\r\n").as_bytes());
    reply.extend_from_slice(&out);
    reply.freeze()
}

/// What a sorted-set command across slots computes from its keys' members and scores (a
/// set's members score 1, a missing key is empty, as in Redis). ZDIFF's scores are the first
/// key's, as its node formatted them; ZINTERCARD has none; ZUNION's and ZINTER's are
/// computed here and formatted as the upstream formats doubles (`format_score`).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ZOp {
    /// ZDIFF: the members of the first key that no other key has, by score then member,
    /// with their scores when `scores` (WITHSCORES).
    Diff {
        /// WITHSCORES was given.
        scores: bool,
    },
    /// ZINTERCARD: how many members every key has, counting no further than the limit
    /// (0: no limit).
    InterCard(u64),
    /// ZUNION: the members of any key, their weighted scores aggregated.
    Union(Combine),
    /// ZINTER: the members of every key, their weighted scores aggregated.
    Inter(Combine),
}

impl ZOp {
    /// Whether the keys' scores are read (ZRANGE … WITHSCORES): ZDIFF, ZUNION and ZINTER
    /// order their reply by them, WITHSCORES or not.
    pub(super) fn scores(&self) -> bool {
        !matches!(self, ZOp::InterCard(_))
    }
}

/// ZUNION's and ZINTER's options, as Redis 7.0 takes them.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Combine {
    /// One factor per key, in key order, each score of the key is multiplied by (WEIGHTS;
    /// 1 each without it).
    weights: Vec<f64>,
    /// How a member's weighted scores in several keys become one (AGGREGATE).
    aggregate: Aggregate,
    /// WITHSCORES was given: the reply carries the scores.
    scores: bool,
    /// How the upstream writes doubles, so the computed scores read as its own would.
    text: DoubleText,
}

/// AGGREGATE's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aggregate {
    /// The weighted scores added up (the default); +inf plus -inf makes 0, as in Redis.
    Sum,
    /// The smallest weighted score.
    Min,
    /// The largest weighted score.
    Max,
}

impl Combine {
    /// ZUNION's or ZINTER's `options` (what follows the `keys` keys): WEIGHTS with exactly
    /// one valid float per key, AGGREGATE SUM|MIN|MAX, WITHSCORES, in any order, keywords in
    /// any case, a repeated option's last value counting (Redis 7.0's parser). `None` for
    /// anything Redis refuses, so that the command gets CROSSSLOT as Redis Cluster answers
    /// it (it checks the slots first).
    pub(super) fn parse(options: &[&[u8]], keys: usize, doubles: ServerDoubles) -> Option<Combine> {
        let mut combine = Combine {
            weights: vec![1.0; keys],
            aggregate: Aggregate::Sum,
            scores: false,
            text: doubles.text,
        };
        let mut rest = options;
        while let Some((&option, after)) = rest.split_first() {
            if keyword(option, b"WEIGHTS") && after.len() >= keys {
                let (weights, after) = after.split_at(keys);
                combine.weights = weights
                    .iter()
                    .map(|w| parse_weight(w, doubles.hex))
                    .collect::<Option<_>>()?;
                rest = after;
            } else if keyword(option, b"AGGREGATE") && !after.is_empty() {
                combine.aggregate = match after[0] {
                    a if keyword(a, b"SUM") => Aggregate::Sum,
                    a if keyword(a, b"MIN") => Aggregate::Min,
                    a if keyword(a, b"MAX") => Aggregate::Max,
                    _ => return None,
                };
                rest = &after[1..];
            } else if keyword(option, b"WITHSCORES") {
                combine.scores = true;
                rest = after;
            } else {
                return None;
            }
        }
        Some(combine)
    }
}

/// A weight as Redis reads a double from an argument (`strtod` over the whole argument):
/// decimal or (`hex`: the server reads them) hexadecimal notation, `inf`/`infinity` in any
/// case, an optional sign; no white space, no NaN, no overflow to infinity nor underflow to 0.
fn parse_weight(text: &[u8], hex: bool) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?;
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let negative = text.starts_with('-');
    if unsigned.starts_with("0x") || unsigned.starts_with("0X") {
        if !hex {
            return None;
        }
        let v = parse_hex_float(&unsigned[2..])?;
        return Some(if negative { -v } else { v });
    }
    // Rust's parser takes what strtod takes in decimal, but gives inf and 0 where strtod
    // reports a range error, which Redis refuses.
    let v: f64 = text.parse().ok()?;
    let literal_inf = ["inf", "infinity"]
        .iter()
        .any(|i| unsigned.eq_ignore_ascii_case(i));
    let nonzero_digits = unsigned
        .split(['e', 'E'])
        .next()
        .is_some_and(|m| m.bytes().any(|b| (b'1'..=b'9').contains(&b)));
    let refused = v.is_nan() || (v.is_infinite() && !literal_inf) || (v == 0.0 && nonzero_digits);
    (!refused).then_some(v)
}

/// The value of a hexadecimal float's digits after `0x` (`1.8p3`), when it is exact in a
/// normal double; `None` otherwise (the weight is then refused: the command gets CROSSSLOT
/// rather than a result that might differ from Redis's rounding).
fn parse_hex_float(digits: &str) -> Option<f64> {
    let (mantissa, exponent) = match digits.split_once(['p', 'P']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (digits, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{whole}{fraction}");
    if all.is_empty() || !all.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let significant = all.trim_start_matches('0');
    if significant.len() > 13 {
        return None;
    }
    let value = u64::from_str_radix(
        if significant.is_empty() {
            "0"
        } else {
            significant
        },
        16,
    )
    .ok()?;
    let shift = exponent.checked_sub(i32::try_from(fraction.len()).ok()?.checked_mul(4)?)?;
    if value == 0 {
        return Some(0.0);
    }
    // Exact as long as the result stays a normal double.
    let v = value as f64 * 2f64.powi(shift.clamp(-1100, 1100));
    (v.is_finite() && v >= f64::MIN_POSITIVE && (-1100..=1100).contains(&shift)).then_some(v)
}

/// One member of a key read for a sorted-set command.
#[derive(Debug, Clone, PartialEq)]
struct Scored {
    /// The member's bulk frame, as the node sent it.
    member: Bytes,
    /// Its score (1 for a set's member; 0 when scores were not read).
    score: f64,
    /// The score as the node formatted it (a bulk string in RESP2, a double in RESP3), or
    /// the same for a set's 1; empty when scores were not read.
    score_frame: Bytes,
}

/// The reply of a sorted-set command gathered across slots: `parts` holds each key's
/// ZRANGE reply at its positions and SMEMBERS reply at its positions plus `keys`. Each key
/// is whichever of the two did not answer WRONGTYPE; a key neither read is WRONGTYPE, and
/// the first error in key order wins, as Redis checks every key's type first.
fn join_sorted(op: ZOp, keys: usize, parts: &[(Vec<usize>, Bytes)], proto: u8) -> Bytes {
    let mut replies: Vec<Option<&Bytes>> = vec![None; 2 * keys];
    for (positions, reply) in parts {
        for &p in positions {
            if let Some(r) = replies.get_mut(p) {
                *r = Some(reply);
            }
        }
    }
    let mut inputs = Vec::with_capacity(keys);
    for k in 0..keys {
        let (Some(zrange), Some(smembers)) = (replies[k], replies[keys + k]) else {
            return unexpected(b"(a key without a reply)");
        };
        match key_entries(zrange, smembers, op.scores(), proto) {
            Ok(entries) => inputs.push(entries),
            Err(reply) => return reply,
        }
    }
    match op {
        ZOp::InterCard(limit) => {
            let sets: Vec<Vec<Bytes>> = inputs
                .into_iter()
                .map(|e| e.into_iter().map(|s| s.member).collect())
                .collect();
            answers::integer(inter_card(&sets, limit) as i64)
        }
        ZOp::Diff { scores } => scored_reply(&zdiff(inputs), scores, proto),
        ZOp::Union(c) => {
            let entries = combined(zunion(&inputs, &c), c.text, proto);
            scored_reply(&entries, c.scores, proto)
        }
        ZOp::Inter(c) => {
            let entries = combined(zinter(&inputs, &c), c.text, proto);
            scored_reply(&entries, c.scores, proto)
        }
    }
}

/// The order Redis 7.0 reads ZUNION's and ZINTER's keys in: by size, smallest first, keys
/// of one size in command order (its sort of the inputs is stable on glibc). With AGGREGATE
/// SUM the order decides how a member's floating-point scores are rounded, so it must match.
fn by_size(inputs: &[Vec<Scored>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&i| inputs[i].len());
    order
}

/// A member's weighted score in one key: Redis turns the NaN of an infinite score times a
/// 0 weight into 0 where it starts a member's score.
fn weighted(score: f64, weight: f64) -> f64 {
    let v = weight * score;
    if v.is_nan() { 0.0 } else { v }
}

/// Adds one more weighted score `v` to a member's `total` as AGGREGATE says: a NaN sum
/// (+inf plus -inf, or a later key's inf times 0) becomes 0, and MIN and MAX keep their
/// value against a NaN, as in Redis.
fn aggregate(total: f64, v: f64, how: Aggregate) -> f64 {
    match how {
        Aggregate::Sum if (total + v).is_nan() => 0.0,
        Aggregate::Sum => total + v,
        Aggregate::Min if v < total => v,
        Aggregate::Max if v > total => v,
        Aggregate::Min | Aggregate::Max => total,
    }
}

/// ZUNION of the keys' entries: every member of any key, its weighted scores aggregated in
/// Redis's key order (`by_size`). Unordered: `combined` sorts.
fn zunion(inputs: &[Vec<Scored>], c: &Combine) -> Vec<(Bytes, f64)> {
    let mut scores: std::collections::HashMap<Bytes, f64> = std::collections::HashMap::new();
    let mut first_seen = Vec::new();
    for i in by_size(inputs) {
        let weight = c.weights.get(i).copied().unwrap_or(1.0);
        for e in &inputs[i] {
            let v = weighted(e.score, weight);
            match scores.get_mut(&e.member) {
                Some(total) => *total = aggregate(*total, v, c.aggregate),
                None => {
                    scores.insert(e.member.clone(), v);
                    first_seen.push(e.member.clone());
                }
            }
        }
    }
    first_seen
        .into_iter()
        .map(|m| {
            let score = scores.get(&m).copied().unwrap_or(0.0);
            (m, score)
        })
        .collect()
}

/// ZINTER of the keys' entries: the members of the smallest key that every other key has,
/// the weighted scores aggregated in Redis's key order (`by_size`). Only the smallest key's
/// own weighted score has its NaN made 0 up front, as in Redis.
fn zinter(inputs: &[Vec<Scored>], c: &Combine) -> Vec<(Bytes, f64)> {
    let order = by_size(inputs);
    let Some((&first, others)) = order.split_first() else {
        return Vec::new();
    };
    let lookups: Vec<(f64, std::collections::HashMap<&Bytes, f64>)> = others
        .iter()
        .map(|&j| {
            let weight = c.weights.get(j).copied().unwrap_or(1.0);
            (
                weight,
                inputs[j].iter().map(|e| (&e.member, e.score)).collect(),
            )
        })
        .collect();
    let first_weight = c.weights.get(first).copied().unwrap_or(1.0);
    let mut out = Vec::new();
    'members: for e in &inputs[first] {
        let mut total = weighted(e.score, first_weight);
        for (weight, scores) in &lookups {
            match scores.get(&e.member) {
                Some(&score) => total = aggregate(total, score * weight, c.aggregate),
                None => continue 'members,
            }
        }
        out.push((e.member.clone(), total));
    }
    out
}

/// Computed (member, score) pairs as a sorted set orders them (by score, then member byte
/// by byte), each score formatted for the reply.
fn combined(mut entries: Vec<(Bytes, f64)>, text: DoubleText, proto: u8) -> Vec<Scored> {
    entries.sort_by(|a, b| {
        a.1.partial_cmp(&b.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| bulk_content(&a.0).cmp(&bulk_content(&b.0)))
    });
    entries
        .into_iter()
        .map(|(member, score)| Scored {
            member,
            score,
            score_frame: format_score(score, text, proto),
        })
        .collect()
}

/// A score as the upstream replies with a double (`text`): a bulk string in RESP2, a
/// double in RESP3.
fn format_score(score: f64, text: DoubleText, proto: u8) -> Bytes {
    let text = text.write(score);
    if proto == 3 {
        Bytes::from(format!(",{text}\r\n"))
    } else {
        Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
    }
}

/// PFCOUNT gathered: `parts` holds each key's GET reply at its positions. In key order, as
/// Redis reads them: a node's error (WRONGTYPE for a key that is no string) fails the
/// command, a missing key is an empty HyperLogLog, a string that is not one fails it with
/// Redis's error; the merged registers' estimate is the reply.
fn join_hll(keys: usize, parts: &[(Vec<usize>, Bytes)]) -> Bytes {
    let mut replies: Vec<Option<&Bytes>> = vec![None; keys];
    for (positions, reply) in parts {
        for &p in positions {
            if let Some(r) = replies.get_mut(p) {
                *r = Some(reply);
            }
        }
    }
    let mut registers = hll::Registers::default();
    for reply in replies {
        let Some(reply) = reply else {
            return unexpected(b"(a key without a reply)");
        };
        match reply.first() {
            Some(b'-') => return reply.clone(),
            _ if &reply[..] == b"$-1\r\n" || &reply[..] == b"_\r\n" => continue,
            Some(b'$') => {}
            _ => return unexpected(reply),
        }
        let Some(value) = bulk_content(reply) else {
            return unexpected(reply);
        };
        if let Err(invalid) = registers.merge(value) {
            return Bytes::from_static(invalid.reply());
        }
    }
    answers::integer(i64::try_from(registers.count()).unwrap_or(i64::MAX))
}

/// A key's members from its ZRANGE and SMEMBERS replies (one of them WRONGTYPE unless the key
/// is missing, when both are empty), or the reply the whole command gets instead.
fn key_entries(
    zrange: &Bytes,
    smembers: &Bytes,
    scores: bool,
    proto: u8,
) -> Result<Vec<Scored>, Bytes> {
    let wrongtype = |r: &Bytes| r.starts_with(b"-WRONGTYPE");
    match (
        zrange.first() == Some(&b'-'),
        smembers.first() == Some(&b'-'),
    ) {
        // A set (its ZRANGE refused), or a missing key (both empty).
        (true, false) if wrongtype(zrange) => set_entries(smembers, scores, proto),
        (false, false) if zrange_is_empty(zrange) => set_entries(smembers, scores, proto),
        (false, _) => sorted_entries(zrange, scores).ok_or_else(|| unexpected(zrange)),
        // Neither a set nor a sorted set: WRONGTYPE; or the node's other error.
        (true, _) => Err(zrange.clone()),
    }
}

/// Whether a ZRANGE reply is an empty array.
fn zrange_is_empty(reply: &[u8]) -> bool {
    reply == b"*0\r\n"
}

/// A set's members as sorted-set entries scored 1, as Redis takes a set in ZDIFF.
fn set_entries(smembers: &Bytes, scores: bool, proto: u8) -> Result<Vec<Scored>, Bytes> {
    // A score of 1, as every server version formats it.
    let one: &'static [u8] = match (scores, proto) {
        (false, _) => b"",
        (true, 3) => b",1\r\n",
        (true, _) => b"$1\r\n1\r\n",
    };
    let members = members(smembers).ok_or_else(|| unexpected(smembers))?;
    Ok(members
        .into_iter()
        .map(|member| Scored {
            member,
            score: 1.0,
            score_frame: Bytes::from_static(one),
        })
        .collect())
}

/// The entries of a `ZRANGE key 0 -1 [WITHSCORES]` reply: members alone, or with scores as
/// RESP2 sends them (member, score, member, score…) or RESP3 (pairs); `None` for a reply of
/// another shape.
fn sorted_entries(reply: &Bytes, scores: bool) -> Option<Vec<Scored>> {
    let cr = memchr::memchr(b'\r', reply)?;
    if reply.first() != Some(&b'*') {
        return None;
    }
    let count = usize::try_from(codec::parse_int(&reply[1..cr])?).ok()?;
    let elements = crate::protocol::reply::split(&reply.slice(cr + 2..));
    if elements.len() != count {
        return None;
    }
    if !scores {
        return elements
            .into_iter()
            .map(|member| {
                (member.first() == Some(&b'$')).then_some(Scored {
                    member,
                    score: 0.0,
                    score_frame: Bytes::new(),
                })
            })
            .collect();
    }
    let pairs: Vec<(Bytes, Bytes)> = if elements.first().is_some_and(|e| e.starts_with(b"*2\r\n")) {
        let mut pairs = Vec::with_capacity(count);
        for pair in &elements {
            match &crate::protocol::reply::split(&pair.slice(4..))[..] {
                [member, score] => pairs.push((member.clone(), score.clone())),
                _ => return None,
            }
        }
        pairs
    } else {
        if count % 2 != 0 {
            return None;
        }
        elements
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect()
    };
    pairs
        .into_iter()
        .map(|(member, score_frame)| {
            let score = score_of(&score_frame)?;
            (member.first() == Some(&b'$')).then_some(Scored {
                member,
                score,
                score_frame,
            })
        })
        .collect()
}

/// The value of a score frame: a bulk string (RESP2) or a double (RESP3) as Redis formats
/// them (`1.5`, `inf`, `-inf`, `1e+21`, `0.10000000000000001`).
fn score_of(frame: &[u8]) -> Option<f64> {
    let text = match frame.first()? {
        b',' => frame.get(1..frame.len().checked_sub(2)?)?,
        b'$' => bulk_content(frame)?,
        _ => return None,
    };
    std::str::from_utf8(text)
        .ok()?
        .parse::<f64>()
        .ok()
        .filter(|v| !v.is_nan())
}

/// The bytes a bulk frame carries.
fn bulk_content(frame: &[u8]) -> Option<&[u8]> {
    let cr = memchr::memchr(b'\r', frame)?;
    frame.get(cr + 2..frame.len().checked_sub(2)?)
}

/// ZDIFF: the entries of the first input that no other input has, in a sorted set's order
/// (by score, then by member, byte by byte), as Redis answers it.
fn zdiff(inputs: Vec<Vec<Scored>>) -> Vec<Scored> {
    let mut inputs = inputs.into_iter();
    let Some(first) = inputs.next() else {
        return Vec::new();
    };
    let others: std::collections::HashSet<Bytes> = inputs.flatten().map(|e| e.member).collect();
    let mut out: Vec<Scored> = first
        .into_iter()
        .filter(|e| !others.contains(&e.member))
        .collect();
    out.sort_by(|a, b| {
        a.score
            .partial_cmp(&b.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| bulk_content(&a.member).cmp(&bulk_content(&b.member)))
    });
    out
}

/// A sorted-set range reply of `entries`: the members, or with WITHSCORES each followed by
/// its score (RESP2) or paired with it (RESP3), as ZRANGE answers.
fn scored_reply(entries: &[Scored], scores: bool, proto: u8) -> Bytes {
    let pairs = scores && proto == 3;
    let count = if scores && !pairs {
        2 * entries.len()
    } else {
        entries.len()
    };
    let mut out = BytesMut::from(format!("*{count}\r\n").as_bytes());
    for e in entries {
        if pairs {
            out.extend_from_slice(b"*2\r\n");
        }
        out.extend_from_slice(&e.member);
        if scores {
            out.extend_from_slice(&e.score_frame);
        }
    }
    out.freeze()
}

/// The reply of a set command gathered across slots: `parts` holds each key's `SMEMBERS`
/// reply with the positions of that key in the client's command (`keys` of them). The first
/// error in key order wins (Redis checks every key's type before answering, so one
/// WRONGTYPE key fails the whole command, missing keys or not); then the members are
/// combined by `op`, and answered as a set (an array in RESP2) or SINTERCARD's count.
fn join_sets(op: SetOp, keys: usize, parts: &[(Vec<usize>, Bytes)], proto: u8) -> Bytes {
    let mut replies: Vec<Option<&Bytes>> = vec![None; keys];
    for (positions, reply) in parts {
        for &p in positions {
            if let Some(r) = replies.get_mut(p) {
                *r = Some(reply);
            }
        }
    }
    let replies: Vec<&Bytes> = match replies.into_iter().collect() {
        Some(replies) => replies,
        None => return unexpected(b"(a key without a reply)"),
    };
    if let Some(error) = replies.iter().find(|r| r.first() == Some(&b'-')) {
        return (*error).clone();
    }
    let mut sets = Vec::with_capacity(keys);
    for reply in replies {
        match members(reply) {
            Some(m) => sets.push(m),
            None => return unexpected(reply),
        }
    }
    match op {
        SetOp::InterCard(limit) => answers::integer(inter_card(&sets, limit) as i64),
        op => set_reply(&set_algebra(op, &sets), proto),
    }
}

/// The members of an `SMEMBERS` reply (an array, or a RESP3 set, of bulk strings), each its
/// whole frame; `None` for a reply of another shape.
fn members(reply: &Bytes) -> Option<Vec<Bytes>> {
    if !matches!(reply.first(), Some(b'*' | b'~')) {
        return None;
    }
    let cr = memchr::memchr(b'\r', reply)?;
    let count = usize::try_from(codec::parse_int(&reply[1..cr])?).ok()?;
    let elements = crate::protocol::reply::split(&reply.slice(cr + 2..));
    (elements.len() == count && elements.iter().all(|e| e.first() == Some(&b'$')))
        .then_some(elements)
}

/// SUNION, SINTER or SDIFF of `sets` (each without repeats, as SMEMBERS answers), in the
/// order the members first appear: Redis leaves the order undefined, so any is right, and
/// this one is stable for a given input.
fn set_algebra(op: SetOp, sets: &[Vec<Bytes>]) -> Vec<Bytes> {
    let Some((first, others)) = sets.split_first() else {
        return Vec::new();
    };
    match op {
        SetOp::Union => {
            let mut seen = std::collections::HashSet::new();
            sets.iter()
                .flatten()
                .filter(|m| seen.insert(*m))
                .cloned()
                .collect()
        }
        SetOp::Inter | SetOp::InterCard(_) => intersection(first, others).cloned().collect(),
        SetOp::Diff => {
            let others: std::collections::HashSet<&Bytes> = others.iter().flatten().collect();
            first
                .iter()
                .filter(|m| !others.contains(m))
                .cloned()
                .collect()
        }
    }
}

/// SINTERCARD: the size of the intersection of `sets`, no more than `limit` (0: no limit).
fn inter_card(sets: &[Vec<Bytes>], limit: u64) -> u64 {
    let Some((first, others)) = sets.split_first() else {
        return 0;
    };
    let limit = if limit == 0 { u64::MAX } else { limit };
    (intersection(first, others).count() as u64).min(limit)
}

/// The members of `first` that every set of `others` has too.
fn intersection<'a>(first: &'a [Bytes], others: &[Vec<Bytes>]) -> impl Iterator<Item = &'a Bytes> {
    let others: Vec<std::collections::HashSet<&Bytes>> =
        others.iter().map(|s| s.iter().collect()).collect();
    first
        .iter()
        .filter(move |m| others.iter().all(|s| s.contains(m)))
}

/// A set reply of `members` (whole bulk frames): a RESP3 set, or in RESP2 an array, as Redis
/// answers SUNION.
fn set_reply(members: &[Bytes], proto: u8) -> Bytes {
    let kind = if proto == 3 { '~' } else { '*' };
    let mut out = BytesMut::from(format!("{kind}{}\r\n", members.len()).as_bytes());
    for m in members {
        out.extend_from_slice(m);
    }
    out.freeze()
}

/// The smallest integer reply, or for arrays of integers (WAITAOF) the element-wise minimum.
/// The element-wise smallest (`take` = `i64::min`) or largest (`i64::max`) of integer
/// replies, or of arrays of integers of one length.
fn merge_ints(replies: &[Bytes], take: fn(i64, i64) -> i64) -> Bytes {
    let ints = |r: &Bytes| -> Option<Vec<i64>> {
        let frames: Vec<Bytes> = match r.first() {
            Some(b':') => vec![r.clone()],
            Some(b'*') => {
                let cr = memchr::memchr(b'\r', r)?;
                crate::protocol::reply::split(&r.slice(cr + 2..))
            }
            _ => return None,
        };
        frames
            .iter()
            .map(|f| {
                f.strip_prefix(b":")
                    .and_then(|f| f.strip_suffix(b"\r\n"))
                    .and_then(codec::parse_int)
            })
            .collect()
    };
    let Some(first) = replies.first() else {
        return answers::clusterdown();
    };
    let Some(mut acc) = ints(first) else {
        return unexpected(first);
    };
    for r in &replies[1..] {
        match ints(r) {
            Some(v) if v.len() == acc.len() => {
                for (m, x) in acc.iter_mut().zip(v) {
                    *m = take(*m, x);
                }
            }
            _ => return unexpected(r),
        }
    }
    if first.first() == Some(&b':') {
        answers::integer(acc[0])
    } else {
        let mut out = format!("*{}\r\n", acc.len());
        for m in acc {
            out.push_str(&format!(":{m}\r\n"));
        }
        Bytes::from(out)
    }
}

/// Bits of a composite SCAN cursor holding the node's own cursor; the bits above hold the
/// index of the primary (ordered by address). A node's cursor is a reverse-binary bucket
/// index, far below 2^48 for any real table.
const NODE_CURSOR_BITS: u32 = 48;
/// The node cursor's part of a composite cursor.
const NODE_CURSOR_MASK: u64 = (1 << NODE_CURSOR_BITS) - 1;

/// Where a client's composite SCAN cursor points: the index of the primary (ordered by
/// address) and that node's own cursor.
pub(super) fn scan_position(cursor: u64) -> (usize, u64) {
    (
        (cursor >> NODE_CURSOR_BITS) as usize,
        cursor & NODE_CURSOR_MASK,
    )
}

/// A node's reply to one SCAN step as the client gets it, its cursor made composite again
/// (the node is primary `shard` of `shards`): the same node's next step, the next primary's
/// first once this one is done, 0 after the last. `Err` with the reply the client gets
/// instead: the node's error, or ours for a reply of the wrong shape or a node cursor too
/// large for the composite one.
pub(super) fn scan_step_reply(reply: &Bytes, shard: usize, shards: usize) -> Result<Bytes, Bytes> {
    let composite = match scan_reply_cursor(reply) {
        Err(()) if reply.first() == Some(&b'-') => return Err(reply.clone()),
        Err(()) => return Err(unexpected(reply)),
        Ok((0, _)) if shard + 1 < shards => ((shard + 1) as u64) << NODE_CURSOR_BITS,
        Ok((0, _)) => 0,
        Ok((c, _)) if c > NODE_CURSOR_MASK => {
            return Err(answers::scan_cursor_too_large());
        }
        Ok((c, _)) => ((shard as u64) << NODE_CURSOR_BITS) | c,
    };
    let Ok((_, keys_at)) = scan_reply_cursor(reply) else {
        return Err(unexpected(reply));
    };
    let cursor = composite.to_string();
    let mut out = BytesMut::from(format!("*2\r\n${}\r\n{cursor}\r\n", cursor.len()).as_bytes());
    out.extend_from_slice(&reply[keys_at..]);
    Ok(out.freeze())
}

/// The cursor of a SCAN reply (`*2`, a bulk cursor, the array of names) and where the array
/// starts.
fn scan_reply_cursor(reply: &[u8]) -> Result<(u64, usize), ()> {
    let rest = reply.strip_prefix(b"*2\r\n$").ok_or(())?;
    let nl = memchr::memchr(b'\n', rest).ok_or(())?;
    let len: usize = std::str::from_utf8(rest.get(..nl.checked_sub(1).ok_or(())?).ok_or(())?)
        .map_err(|_| ())?
        .parse()
        .map_err(|_| ())?;
    let digits = rest.get(nl + 1..nl + 1 + len).ok_or(())?;
    let cursor = std::str::from_utf8(digits)
        .map_err(|_| ())?
        .parse()
        .map_err(|_| ())?;
    // "*2\r\n$" + header + digits + CRLF
    Ok((cursor, 5 + nl + 1 + len + 2))
}

/// A node's reply that does not have the shape its command promises.
pub(super) fn unexpected(reply: &[u8]) -> Bytes {
    answers::unexpected_node_reply(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_exists_is_the_element_wise_largest() {
        let exists =
            |r: &[&'static [u8]]| merge(Merge::Max, &r.iter().map(|r| b(r)).collect::<Vec<_>>(), 0);
        assert_eq!(
            &exists(&[b"*2\r\n:0\r\n:0\r\n", b"*2\r\n:1\r\n:0\r\n"])[..],
            b"*2\r\n:1\r\n:0\r\n"
        );
        assert!(is_unexpected(&exists(&[
            b"*1\r\n:0\r\n",
            b"*2\r\n:1\r\n:0\r\n"
        ])));
    }

    /// One slow log entry: `id`, time `at`, arguments `cmd` (split at spaces).
    fn entry(id: u32, at: u32, cmd: &str) -> String {
        let args: Vec<&str> = cmd.split(' ').collect();
        let encoded: String = args
            .iter()
            .map(|a| format!("${}\r\n{a}\r\n", a.len()))
            .collect();
        format!(
            "*6\r\n:{id}\r\n:{at}\r\n:5\r\n*{}\r\n{encoded}$0\r\n\r\n$0\r\n\r\n",
            args.len()
        )
    }

    /// A node's reply to `SLOWLOG GET`: its entries.
    fn node_log(entries: &[String]) -> Bytes {
        Bytes::from(format!("*{}\r\n{}", entries.len(), entries.concat()))
    }

    #[test]
    fn slowlog_entries_of_every_node_newest_first_at_most_the_count() {
        let one = node_log(&[entry(1, 100, "b"), entry(0, 90, "a")]);
        let two = node_log(&[entry(0, 95, "c")]);
        let all = merge(Merge::Slowlog(None), &[one.clone(), two.clone()], 0);
        assert_eq!(
            all,
            Bytes::from(format!(
                "*3\r\n{}{}{}",
                entry(1, 100, "b"),
                entry(0, 95, "c"),
                entry(0, 90, "a")
            ))
        );
        let two_newest = merge(Merge::Slowlog(Some(2)), &[one, two], 0);
        assert_eq!(
            two_newest,
            Bytes::from(format!("*2\r\n{}{}", entry(1, 100, "b"), entry(0, 95, "c")))
        );
        assert!(is_unexpected(&merge(
            Merge::Slowlog(None),
            &[b(b":1\r\n")],
            0
        )));
    }

    /// What the proxy sent every node is logged once, and a RESET as the oldest entry.
    #[test]
    fn the_merged_slowlog_logs_a_fan_out_once() {
        let fresh = [
            node_log(&[
                entry(5, 7, "spop s 10"),
                entry(4, 7, "config set slowlog-log-slower-than 0"),
                entry(3, 7, "slowlog reset"),
            ]),
            node_log(&[
                entry(91, 7, "config set slowlog-log-slower-than 0"),
                entry(90, 7, "SLOWLOG RESET"),
            ]),
        ];
        assert_eq!(
            merge(Merge::Slowlog(None), &fresh, 0),
            Bytes::from(format!(
                "*3\r\n{}{}{}",
                entry(5, 7, "spop s 10"),
                entry(4, 7, "config set slowlog-log-slower-than 0"),
                entry(3, 7, "slowlog reset")
            ))
        );
        // The same keyless command on two nodes is two commands; one node's repeats too.
        let pings = [
            node_log(&[entry(2, 7, "ping"), entry(1, 7, "ping")]),
            node_log(&[entry(8, 7, "ping"), entry(7, 7, "info")]),
            node_log(&[entry(4, 7, "info")]),
        ];
        let merged = merge(Merge::Slowlog(None), &pings, 0);
        assert!(merged.starts_with(b"*4\r\n"), "{merged:?}");
    }

    #[test]
    fn a_kill_is_ok_where_one_node_killed_a_script() {
        let (ok, notbusy) = (
            b(b"+OK\r\n"),
            b(b"-NOTBUSY No scripts in execution right now.\r\n"),
        );
        let unkillable = b(b"-UNKILLABLE Sorry the script already executed write commands\r\n");
        let down = b(b"-ERR upstream 127.0.0.1:1 unavailable\r\n");
        let kill = |replies: &[Bytes]| merge(Merge::Kill, replies, 0);
        assert_eq!(kill(&[notbusy.clone(), ok.clone(), notbusy.clone()]), ok);
        assert_eq!(kill(&[down.clone(), ok.clone()]), ok);
        assert_eq!(kill(&[notbusy.clone(), unkillable.clone()]), unkillable);
        assert_eq!(kill(&[notbusy.clone(), down.clone()]), down);
        assert_eq!(kill(&[notbusy.clone(), notbusy.clone()]), notbusy);
    }

    #[test]
    fn merges() {
        assert_eq!(
            &merge(Merge::Sum, &[b(b":3\r\n"), b(b":0\r\n"), b(b":4\r\n")], 0)[..],
            b":7\r\n"
        );
        let lens = [b(b":3\r\n"), b(b":0\r\n"), b(b":4\r\n")];
        assert_eq!(&merge(Merge::SumAtMost(Some(5)), &lens, 0)[..], b":5\r\n");
        assert_eq!(&merge(Merge::SumAtMost(None), &lens, 0)[..], b":7\r\n");
        assert_eq!(
            &merge(
                Merge::Concat,
                &[
                    b(b"*1\r\n$1\r\na\r\n"),
                    b(b"*0\r\n"),
                    b(b"*2\r\n$1\r\nb\r\n$1\r\nc\r\n")
                ],
                0
            )[..],
            b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"
        );
        assert_eq!(
            &merge(Merge::AllOk, &[b(b"+OK\r\n"), b(b"-ERR no\r\n")], 0)[..],
            b"-ERR no\r\n"
        );
        for seed in 0..3 {
            assert_eq!(
                &merge(
                    Merge::FirstNonNil,
                    &[b(b"$-1\r\n"), b(b"$1\r\nk\r\n"), b(b"$-1\r\n")],
                    seed
                )[..],
                b"$1\r\nk\r\n"
            );
        }
        assert_eq!(
            &merge(Merge::FirstNonNil, &[b(b"$-1\r\n"), b(b"$-1\r\n")], 1)[..],
            b"$-1\r\n"
        );
        assert!(merge(Merge::Sum, &[b(b"+OK\r\n")], 0).starts_with(b"-ERR unexpected"));
    }

    #[test]
    fn wait_takes_the_smallest_count() {
        assert_eq!(
            &merge(Merge::Min, &[b(b":2\r\n"), b(b":1\r\n"), b(b":3\r\n")], 0)[..],
            b":1\r\n"
        );
        assert_eq!(
            &merge(
                Merge::Min,
                &[b(b"*2\r\n:1\r\n:2\r\n"), b(b"*2\r\n:0\r\n:3\r\n")],
                0
            )[..],
            b"*2\r\n:0\r\n:2\r\n"
        );
    }

    #[test]
    fn scan_reply_cursor_and_array() {
        let reply = b"*2\r\n$5\r\n12345\r\n*1\r\n$1\r\nk\r\n";
        let (cursor, at) = scan_reply_cursor(reply).unwrap();
        assert_eq!(cursor, 12345);
        assert_eq!(&reply[at..], b"*1\r\n$1\r\nk\r\n");
        assert!(scan_reply_cursor(b"-ERR no\r\n").is_err());
        assert!(scan_reply_cursor(b"*2\r\n$3\r\nabc\r\n*0\r\n").is_err());
    }

    fn b(s: &'static [u8]) -> Bytes {
        Bytes::from_static(s)
    }

    /// The error a reply of the wrong shape gets.
    fn is_unexpected(reply: &[u8]) -> bool {
        reply.starts_with(b"-ERR unexpected reply from a cluster node: ")
    }

    #[test]
    fn sum_adds_up_and_saturates() {
        assert_eq!(
            &merge(Merge::Sum, &[b(b":5\r\n"), b(b":-2\r\n"), b(b":10\r\n")], 0)[..],
            b":13\r\n"
        );
        let max = format!(":{}\r\n", i64::MAX);
        assert_eq!(
            &merge(Merge::Sum, &[Bytes::from(max.clone()), b(b":1\r\n")], 0)[..],
            max.as_bytes()
        );
        assert!(is_unexpected(&merge(
            Merge::Sum,
            &[b(b":1\r\n"), b(b"$1\r\n1\r\n")],
            0
        )));
    }

    #[test]
    fn the_first_error_wins_over_every_other_reply() {
        let replies = [b(b":1\r\n"), b(b"-ERR first\r\n"), b(b"-ERR second\r\n")];
        for how in [
            Merge::Sum,
            Merge::Concat,
            Merge::AllOk,
            Merge::Min,
            Merge::Info,
        ] {
            assert_eq!(&merge(how, &replies, 0)[..], b"-ERR first\r\n", "{how:?}");
        }
        // Even over a reply of the wrong shape before it.
        assert_eq!(
            &merge(Merge::Sum, &[b(b"+OK\r\n"), b(b"-ERR down\r\n")], 0)[..],
            b"-ERR down\r\n"
        );
    }

    #[test]
    fn concat_keeps_the_nodes_order() {
        assert_eq!(
            &merge(
                Merge::Concat,
                &[
                    b(b"*2\r\n$1\r\nx\r\n$1\r\ny\r\n"),
                    b(b"~1\r\n$1\r\nz\r\n"),
                    b(b"*-1\r\n")
                ],
                0
            )[..],
            b"*3\r\n$1\r\nx\r\n$1\r\ny\r\n$1\r\nz\r\n"
        );
        assert_eq!(&merge(Merge::Concat, &[], 0)[..], b"*0\r\n");
        assert!(is_unexpected(&merge(
            Merge::Concat,
            &[b(b"*0\r\n"), b(b":3\r\n")],
            0
        )));
    }

    #[test]
    fn all_ok_is_the_first_reply() {
        assert_eq!(
            &merge(Merge::AllOk, &[b(b"+OK\r\n"), b(b"+QUEUED\r\n")], 0)[..],
            b"+OK\r\n"
        );
        assert_eq!(&merge(Merge::AllOk, &[], 0), &answers::clusterdown());
    }

    #[test]
    fn first_non_nil_starts_where_the_seed_says() {
        let keys = [b(b"$2\r\nk0\r\n"), b(b"$2\r\nk1\r\n"), b(b"$2\r\nk2\r\n")];
        // Start at (seed + n/2) mod n: seed 0 starts at node 1.
        let picked: Vec<Bytes> = (0..3)
            .map(|seed| merge(Merge::FirstNonNil, &keys, seed))
            .collect();
        assert_eq!(picked, [keys[1].clone(), keys[2].clone(), keys[0].clone()]);
        // Nils (RESP2 and RESP3) and errors are passed over, wherever the start is.
        let replies = [
            b(b"_\r\n"),
            b(b"-ERR down\r\n"),
            b(b"$-1\r\n"),
            keys[0].clone(),
        ];
        for seed in 0..4 {
            assert_eq!(
                merge(Merge::FirstNonNil, &replies, seed),
                keys[0],
                "seed {seed}"
            );
        }
        // No key anywhere: the first reply that is no error, else the first error.
        assert_eq!(
            &merge(Merge::FirstNonNil, &[b(b"-ERR down\r\n"), b(b"$-1\r\n")], 0)[..],
            b"$-1\r\n"
        );
        assert_eq!(
            &merge(Merge::FirstNonNil, &[b(b"-ERR a\r\n"), b(b"-ERR b\r\n")], 1)[..],
            b"-ERR a\r\n"
        );
        assert_eq!(&merge(Merge::FirstNonNil, &[], 0), &answers::clusterdown());
    }

    #[test]
    fn min_needs_replies_of_one_shape() {
        assert!(is_unexpected(&merge(
            Merge::Min,
            &[b(b"*2\r\n:1\r\n:2\r\n"), b(b"*1\r\n:0\r\n")],
            0
        )));
        assert!(is_unexpected(&merge(Merge::Min, &[b(b"+OK\r\n")], 0)));
        assert_eq!(&merge(Merge::Min, &[], 0), &answers::clusterdown());
    }

    #[test]
    fn info_keeps_the_first_nodes_text_and_kind() {
        let verbatim = |text: &str| Bytes::from(format!("={}\r\ntxt:{text}\r\n", text.len() + 4));
        let merged = merge(
            Merge::Info,
            &[
                verbatim("# Keyspace\r\ndb0:keys=1,expires=0\r\n"),
                verbatim("# Keyspace\r\ndb0:keys=2,expires=1\r\ndb3:keys=5,expires=0\r\n"),
            ],
            0,
        );
        // The first node's lines only (db3 is not in them), with db0 summed; still verbatim.
        assert_eq!(merged, verbatim("# Keyspace\r\ndb0:keys=3,expires=1\r\n"));
        assert!(is_unexpected(&merge(Merge::Info, &[b(b":1\r\n")], 0)));
    }

    #[test]
    fn join_puts_values_back_in_key_order() {
        // MGET k0 k1 k2 k3: k1 and k3 in one slot, k0 and k2 in others.
        let parts = [
            (vec![1, 3], b(b"*2\r\n$1\r\nb\r\n$-1\r\n")),
            (vec![0], b(b"*1\r\n$1\r\na\r\n")),
            (vec![2], b(b"*1\r\n$1\r\nc\r\n")),
        ];
        assert_eq!(
            &join(Join::Values, 4, &parts, 2)[..],
            b"*4\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$-1\r\n"
        );
        // A part that failed fails the whole, a part of the wrong shape or length too.
        let failed = [
            (vec![0], b(b"*1\r\n$1\r\na\r\n")),
            (vec![1], b(b"-ERR down\r\n")),
        ];
        assert_eq!(&join(Join::Values, 2, &failed, 2)[..], b"-ERR down\r\n");
        let short = [(vec![0, 1], b(b"*1\r\n$1\r\na\r\n"))];
        assert!(is_unexpected(&join(Join::Values, 2, &short, 2)));
        let scalar = [(vec![0], b(b":1\r\n"))];
        assert!(is_unexpected(&join(Join::Values, 1, &scalar, 2)));
    }

    #[test]
    fn join_sums_counts_and_needs_every_ok() {
        let counts = [(vec![0, 2], b(b":2\r\n")), (vec![1], b(b":1\r\n"))];
        assert_eq!(&join(Join::Sum, 3, &counts, 2)[..], b":3\r\n");
        let oks = [(vec![0], b(b"+OK\r\n")), (vec![1], b(b"+OK\r\n"))];
        assert_eq!(&join(Join::AllOk, 2, &oks, 2)[..], b"+OK\r\n");
        let failed = [(vec![0], b(b"+OK\r\n")), (vec![1], b(b"-ERR oom\r\n"))];
        assert_eq!(&join(Join::AllOk, 2, &failed, 2)[..], b"-ERR oom\r\n");
        let failed = [(vec![0], b(b":1\r\n")), (vec![1], b(b"-ERR oom\r\n"))];
        assert_eq!(&join(Join::Sum, 2, &failed, 2)[..], b"-ERR oom\r\n");
    }

    /// A member list as SMEMBERS frames.
    fn bulks(members: &[&str]) -> Vec<Bytes> {
        members
            .iter()
            .map(|m| Bytes::from(format!("${}\r\n{m}\r\n", m.len())))
            .collect()
    }

    /// An SMEMBERS reply of `members`, as a RESP2 array or a RESP3 set.
    fn smembers(members: &[&str], proto: u8) -> Bytes {
        set_reply(&bulks(members), proto)
    }

    #[test]
    fn set_algebra_unions_intersects_and_subtracts() {
        let sets = [
            bulks(&["a", "b", "c"]),
            bulks(&["b", "c", "d"]),
            bulks(&["c", "b", "e"]),
        ];
        assert_eq!(
            set_algebra(SetOp::Union, &sets),
            bulks(&["a", "b", "c", "d", "e"])
        );
        assert_eq!(set_algebra(SetOp::Inter, &sets), bulks(&["b", "c"]));
        assert_eq!(set_algebra(SetOp::Diff, &sets), bulks(&["a"]));
        // A missing key is an empty set: the intersection is empty, nothing is taken away.
        let with_empty = [bulks(&["a", "b"]), Vec::new()];
        assert!(set_algebra(SetOp::Inter, &with_empty).is_empty());
        assert_eq!(set_algebra(SetOp::Diff, &with_empty), bulks(&["a", "b"]));
        assert!(set_algebra(SetOp::Diff, &[Vec::new(), bulks(&["a"])]).is_empty());
        assert_eq!(set_algebra(SetOp::Union, &with_empty), bulks(&["a", "b"]));
        // Members are compared byte for byte: "a" and "A" differ, "1" and "01" too.
        let case = [bulks(&["a", "1"]), bulks(&["A", "01", "a"])];
        assert_eq!(set_algebra(SetOp::Inter, &case), bulks(&["a"]));
        assert!(set_algebra(SetOp::Union, &[]).is_empty());
    }

    #[test]
    fn inter_card_stops_at_the_limit() {
        let sets = [bulks(&["a", "b", "c", "d"]), bulks(&["d", "c", "b", "x"])];
        assert_eq!(inter_card(&sets, 0), 3);
        assert_eq!(inter_card(&sets, 2), 2);
        assert_eq!(inter_card(&sets, 10), 3);
        assert_eq!(inter_card(&[bulks(&["a"]), Vec::new()], 0), 0);
    }

    #[test]
    fn join_sets_answers_in_the_clients_protocol() {
        // SUNION k0 k1 k0: k0's reply stands for both of its positions.
        let parts = [
            (vec![0, 2], smembers(&["a", "b"], 2)),
            (vec![1], smembers(&["b", "c"], 2)),
        ];
        let union = join(Join::Sets(SetOp::Union), 3, &parts, 2);
        assert_eq!(union, smembers(&["a", "b", "c"], 2));
        let parts3 = [
            (vec![0], smembers(&["a", "b"], 3)),
            (vec![1], smembers(&["b", "c"], 3)),
        ];
        let inter = join(Join::Sets(SetOp::Inter), 2, &parts3, 3);
        assert_eq!(&inter[..], b"~1\r\n$1\r\nb\r\n");
        assert_eq!(
            &join(Join::Sets(SetOp::Diff), 2, &parts3, 3)[..],
            b"~1\r\n$1\r\na\r\n"
        );
        assert_eq!(
            &join(Join::Sets(SetOp::InterCard(0)), 2, &parts3, 3)[..],
            b":1\r\n"
        );
        // Nothing in common: an empty set, or an empty array in RESP2.
        let apart = [(vec![0], smembers(&["a"], 2)), (vec![1], smembers(&[], 2))];
        assert_eq!(&join(Join::Sets(SetOp::Inter), 2, &apart, 2)[..], b"*0\r\n");
    }

    #[test]
    fn join_sets_fails_on_the_first_error_in_key_order() {
        let wrongtype =
            b(b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
        // The WRONGTYPE key comes after an empty one: the error still wins, as in Redis.
        let parts = [
            (vec![1], wrongtype.clone()),
            (vec![0], smembers(&[], 2)),
            (vec![2], b(b"-ERR later\r\n")),
        ];
        for op in [SetOp::Union, SetOp::Inter, SetOp::Diff, SetOp::InterCard(0)] {
            assert_eq!(join(Join::Sets(op), 3, &parts, 2), wrongtype, "{op:?}");
        }
        // A reply of the wrong shape, or a key without one, is not taken for a set.
        let odd = [(vec![0], b(b":1\r\n")), (vec![1], smembers(&["a"], 2))];
        assert!(is_unexpected(&join(Join::Sets(SetOp::Union), 2, &odd, 2)));
        let short = [(vec![0], b(b"*2\r\n$1\r\na\r\n"))];
        assert!(is_unexpected(&join(Join::Sets(SetOp::Union), 1, &short, 2)));
        let missing = [(vec![0], smembers(&["a"], 2))];
        assert!(is_unexpected(&join(
            Join::Sets(SetOp::Union),
            2,
            &missing,
            2
        )));
    }

    /// A `ZRANGE … WITHSCORES` reply of (member, score text) pairs: flat in RESP2, pairs of
    /// a bulk and a double in RESP3.
    fn zrange(entries: &[(&str, &str)], proto: u8) -> Bytes {
        let mut out = if proto == 3 {
            format!("*{}\r\n", entries.len())
        } else {
            format!("*{}\r\n", 2 * entries.len())
        };
        for (m, score) in entries {
            if proto == 3 {
                out.push_str(&format!("*2\r\n${}\r\n{m}\r\n,{score}\r\n", m.len()));
            } else {
                out.push_str(&format!(
                    "${}\r\n{m}\r\n${}\r\n{score}\r\n",
                    m.len(),
                    score.len()
                ));
            }
        }
        Bytes::from(out)
    }

    const WRONGTYPE: &[u8] =
        b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n";

    #[test]
    fn zdiff_keeps_the_first_keys_scores_in_sorted_set_order() {
        for proto in [2, 3] {
            // ZDIFF z s none: z a sorted set, s a set (its ZRANGE refused), none missing.
            let parts = [
                (
                    vec![0],
                    zrange(
                        &[
                            ("e", "0.10000000000000001"),
                            ("b", "1"),
                            ("a", "1"),
                            ("c", "inf"),
                        ],
                        proto,
                    ),
                ),
                (vec![3], b(WRONGTYPE)),
                (vec![1], b(WRONGTYPE)),
                (vec![4], smembers(&["b", "x"], proto)),
                (vec![2], b(b"*0\r\n")),
                (vec![5], smembers(&[], proto)),
            ];
            let scored = join(Join::Sorted(ZOp::Diff { scores: true }), 3, &parts, proto);
            let want = zrange(
                &[("e", "0.10000000000000001"), ("a", "1"), ("c", "inf")],
                proto,
            );
            assert_eq!(scored, want, "RESP{proto}");
            let plain = join(Join::Sorted(ZOp::Diff { scores: false }), 3, &parts, proto);
            assert_eq!(&plain[..], b"*3\r\n$1\r\ne\r\n$1\r\na\r\n$1\r\nc\r\n");
            assert_eq!(
                &join(
                    Join::Sorted(ZOp::InterCard(0)),
                    2,
                    &[
                        // ZINTERCARD reads members only: ZRANGE without WITHSCORES.
                        (vec![0], set_reply(&bulks(&["e", "b", "a", "c"]), 2)),
                        (vec![1], b(WRONGTYPE)),
                        (vec![2], b(WRONGTYPE)),
                        (vec![3], smembers(&["b", "x"], proto))
                    ],
                    proto
                )[..],
                b":1\r\n"
            );
        }
        // A set first: its members score 1, as every server formats it.
        let parts = [
            (vec![0], b(WRONGTYPE)),
            (vec![2], smembers(&["m"], 2)),
            (vec![1], zrange(&[("z", "2")], 2)),
            (vec![3], b(WRONGTYPE)),
        ];
        assert_eq!(
            join(Join::Sorted(ZOp::Diff { scores: true }), 2, &parts, 2),
            zrange(&[("m", "1")], 2)
        );
        let parts3 = [
            (vec![0], b(WRONGTYPE)),
            (vec![2], smembers(&["m"], 3)),
            (vec![1], b(b"*0\r\n")),
            (vec![3], smembers(&[], 3)),
        ];
        assert_eq!(
            join(Join::Sorted(ZOp::Diff { scores: true }), 2, &parts3, 3),
            zrange(&[("m", "1")], 3)
        );
    }

    #[test]
    fn sorted_commands_fail_on_a_key_of_another_type() {
        // Key 1 is a string (both reads refused), after a missing key 0.
        let parts = [
            (vec![0], b(b"*0\r\n")),
            (vec![2], smembers(&[], 2)),
            (vec![1], b(WRONGTYPE)),
            (vec![3], b(WRONGTYPE)),
        ];
        for op in [
            ZOp::Diff { scores: true },
            ZOp::Diff { scores: false },
            ZOp::InterCard(0),
        ] {
            assert_eq!(
                &join(Join::Sorted(op.clone()), 2, &parts, 2)[..],
                WRONGTYPE,
                "{op:?}"
            );
        }
        // A node's other error, and replies of the wrong shape.
        let down = [
            (vec![0], b(b"-ERR down\r\n")),
            (vec![1], b(b"-ERR down\r\n")),
        ];
        assert_eq!(
            &join(Join::Sorted(ZOp::InterCard(0)), 1, &down, 2)[..],
            b"-ERR down\r\n"
        );
        let odd = [(vec![0], b(b"*1\r\n$1\r\na\r\n")), (vec![1], b(WRONGTYPE))];
        assert!(is_unexpected(&join(
            Join::Sorted(ZOp::Diff { scores: true }),
            1,
            &odd,
            2
        )));
        let missing = [(vec![0], b(b"*0\r\n"))];
        assert!(is_unexpected(&join(
            Join::Sorted(ZOp::InterCard(0)),
            1,
            &missing,
            2
        )));
    }

    #[test]
    fn scores_are_read_as_redis_formats_them() {
        assert_eq!(score_of(b"$3\r\n1.5\r\n"), Some(1.5));
        assert_eq!(score_of(b",0.10000000000000001\r\n"), Some(0.1));
        assert_eq!(score_of(b"$4\r\n-inf\r\n"), Some(f64::NEG_INFINITY));
        assert_eq!(score_of(b",1e+21\r\n"), Some(1e21));
        assert_eq!(score_of(b",nan\r\n"), None);
        assert_eq!(score_of(b":1\r\n"), None);
    }

    /// ZUNION's or ZINTER's options parsed for `keys` keys.
    fn options(args: &[&str], keys: usize) -> Option<Combine> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let redis_7_0 = ServerDoubles {
            text: DoubleText::G17,
            hex: true,
        };
        Combine::parse(&args, keys, redis_7_0)
    }

    #[test]
    fn combine_options_parse_as_redis_7_0_does() {
        let default = options(&[], 2).unwrap();
        assert_eq!(default.weights, [1.0, 1.0]);
        assert_eq!((default.aggregate, default.scores), (Aggregate::Sum, false));
        // Any order, any case, the last of a repeated option counting.
        let c = options(
            &[
                "withscores",
                "WEIGHTS",
                "2",
                "3",
                "aggregate",
                "max",
                "Weights",
                "-1",
                ".5",
            ],
            2,
        )
        .unwrap();
        assert_eq!(c.weights, [-1.0, 0.5]);
        assert_eq!((c.aggregate, c.scores), (Aggregate::Max, true));
        let c = options(
            &[
                "AGGREGATE",
                "MAX",
                "AGGREGATE",
                "min",
                "WITHSCORES",
                "WITHSCORES",
            ],
            1,
        );
        assert_eq!(
            c.map(|c| (c.aggregate, c.scores)),
            Some((Aggregate::Min, true))
        );
        // What Redis refuses: too few or too many weights, a bad float, an unknown option
        // or aggregate, a keyword without its value.
        for refused in [
            &["WEIGHTS", "1"][..],
            &["WEIGHTS", "1", "2", "3"],
            &["WEIGHTS", "1", "x"],
            &["WEIGHTS", "1", "nan"],
            &["WEIGHTS", "1", "1e400"],
            &["WEIGHTS", "1", "1e-400"],
            &["WEIGHTS", "1", " 1"],
            &["WEIGHTS", "1", "1e"],
            &["WEIGHTS", "1", ""],
            &["AGGREGATE", "avg"],
            &["AGGREGATE"],
            &["LIMIT", "1"],
            &["WITHSCORE"],
        ] {
            assert_eq!(options(refused, 2), None, "{refused:?}");
        }
    }

    #[test]
    fn weights_read_as_strtod_reads_them() {
        for (text, want) in [
            ("1", 1.0),
            ("-0", -0.0),
            ("+5.", 5.0),
            ("1E2", 100.0),
            ("-InF", f64::NEG_INFINITY),
            ("infinity", f64::INFINITY),
            ("1e-310", 1e-310),
            ("0x10", 16.0),
            ("0x1p-2", 0.25),
            ("-0X1.8P1", -3.0),
            ("0e-400", 0.0),
        ] {
            assert_eq!(parse_weight(text.as_bytes(), true), Some(want), "{text}");
            // Valkey reads decimals only.
            let decimal = !text.to_ascii_lowercase().contains("0x");
            assert_eq!(
                parse_weight(text.as_bytes(), false),
                decimal.then_some(want),
                "{text}"
            );
        }
        for text in [
            "nan", "1e400", "-1e400", "1e-400", "0x", "1 ", "inf ", "0x1g", "--1",
        ] {
            assert_eq!(parse_weight(text.as_bytes(), true), None, "{text}");
        }
    }

    #[test]
    fn scores_are_written_as_the_upstream_writes_doubles() {
        let g17 = DoubleText::G17;
        assert_eq!(
            &format_score(0.1, g17, 2)[..],
            b"$19\r\n0.10000000000000001\r\n"
        );
        assert_eq!(&format_score(0.1, DoubleText::Shortest, 3)[..], b",0.1\r\n");
        assert_eq!(&format_score(f64::INFINITY, g17, 2)[..], b"$3\r\ninf\r\n");
        assert_eq!(&format_score(f64::NEG_INFINITY, g17, 3)[..], b",-inf\r\n");
        assert_eq!(&format_score(0.5, g17, 3)[..], b",0.5\r\n");
    }

    /// Entries of a key: (member, score).
    fn entries(list: &[(&str, f64)]) -> Vec<Scored> {
        list.iter()
            .map(|(m, score)| Scored {
                member: Bytes::from(format!("${}\r\n{m}\r\n", m.len())),
                score: *score,
                score_frame: Bytes::new(),
            })
            .collect()
    }

    /// Combined entries as (member, score) text pairs, in reply order.
    fn pairs(entries: Vec<(Bytes, f64)>) -> Vec<(String, String)> {
        combined(entries, DoubleText::G17, 2)
            .into_iter()
            .map(|e| {
                let text = |f: &Bytes| {
                    String::from_utf8_lossy(bulk_content(f).unwrap_or_default()).into_owned()
                };
                (text(&e.member), text(&e.score_frame))
            })
            .collect()
    }

    #[test]
    fn zunion_and_zinter_weigh_and_aggregate_as_redis() {
        let inputs = [
            entries(&[("a", 1.0), ("b", 2.0), ("c", f64::INFINITY)]),
            entries(&[("a", 1.0), ("x", 1.0)]),
        ];
        let with = |weights: &[f64], aggregate| Combine {
            weights: weights.to_vec(),
            aggregate,
            scores: true,
            text: DoubleText::G17,
        };
        let p = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(m, s)| (m.to_string(), s.to_string()))
                .collect()
        };
        assert_eq!(
            pairs(zunion(&inputs, &with(&[1.0, 1.0], Aggregate::Sum))),
            p(&[("x", "1"), ("a", "2"), ("b", "2"), ("c", "inf")])
        );
        // inf times 0 is NaN, made 0; ties ordered by member.
        assert_eq!(
            pairs(zunion(&inputs, &with(&[0.0, 1.0], Aggregate::Sum))),
            p(&[("b", "0"), ("c", "0"), ("a", "1"), ("x", "1")])
        );
        assert_eq!(
            pairs(zunion(&inputs, &with(&[2.0, -1.0], Aggregate::Min))),
            p(&[("a", "-1"), ("x", "-1"), ("b", "4"), ("c", "inf")])
        );
        assert_eq!(
            pairs(zinter(&inputs, &with(&[2.0, 3.0], Aggregate::Max))),
            p(&[("a", "3")])
        );
        // +inf plus -inf is NaN, made 0, in ZINTER's later keys too.
        let infinite = [
            entries(&[("m", f64::INFINITY)]),
            entries(&[("m", f64::NEG_INFINITY)]),
        ];
        for combine in [zinter, zunion] {
            assert_eq!(
                pairs(combine(&infinite, &with(&[1.0, 1.0], Aggregate::Sum))),
                p(&[("m", "0")])
            );
        }
        // A later key's inf times 0 is NaN: MIN and MAX keep the score they have.
        let later = [
            entries(&[("m", 5.0)]),
            entries(&[("m", f64::INFINITY), ("n", 1.0)]),
        ];
        assert_eq!(
            pairs(zinter(&later, &with(&[1.0, 0.0], Aggregate::Max))),
            p(&[("m", "5")])
        );
        // The keys are read smallest first: 0.1 + 0.2 first, then + 0.3, whatever the
        // command's order.
        let rounding = [
            entries(&[("m", 0.3), ("y", 0.0), ("z", 0.0)]),
            entries(&[("m", 0.1)]),
            entries(&[("m", 0.2), ("y", 0.0)]),
        ];
        let sum = pairs(zunion(&rounding, &with(&[1.0; 3], Aggregate::Sum)));
        let g17 = |v| DoubleText::G17.write(v);
        assert_eq!(sum[2], ("m".to_string(), g17(0.1 + 0.2 + 0.3)));
        assert_ne!(g17(0.1 + 0.2 + 0.3), g17(0.3 + 0.2 + 0.1));
        assert!(zinter(&[], &with(&[], Aggregate::Sum)).is_empty());
        assert!(zinter(&[entries(&[("a", 1.0)]), Vec::new()], &default_combine()).is_empty());
    }

    /// ZUNION's options when none are given, for two keys.
    fn default_combine() -> Combine {
        options(&[], 2).unwrap()
    }

    #[test]
    fn join_sorted_answers_zunion_in_the_clients_protocol() {
        for proto in [2, 3] {
            // ZUNION 2 z s WITHSCORES: z a sorted set, s a set (members score 1).
            let parts = [
                (vec![0], zrange(&[("a", "1"), ("b", "2.5")], proto)),
                (vec![2], b(WRONGTYPE)),
                (vec![1], b(WRONGTYPE)),
                (vec![3], smembers(&["a", "x"], proto)),
            ];
            let mut c = default_combine();
            c.scores = true;
            let got = join(Join::Sorted(ZOp::Union(c.clone())), 2, &parts, proto);
            assert_eq!(got, zrange(&[("x", "1"), ("a", "2"), ("b", "2.5")], proto));
            let got = join(Join::Sorted(ZOp::Inter(c.clone())), 2, &parts, proto);
            assert_eq!(got, zrange(&[("a", "2")], proto));
            c.scores = false;
            let got = join(Join::Sorted(ZOp::Union(c)), 2, &parts, proto);
            assert_eq!(&got[..], b"*3\r\n$1\r\nx\r\n$1\r\na\r\n$1\r\nb\r\n");
        }
    }

    /// A GET reply of `value`.
    fn get_reply(value: &[u8]) -> Bytes {
        let mut out = format!("${}\r\n", value.len()).into_bytes();
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
        Bytes::from(out)
    }

    #[test]
    fn join_hll_counts_in_key_order_with_redis_errors() {
        let empty = get_reply(b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xff");
        // One register at 1 (a VAL run at register 0, then zeros): counts 1.
        let one = get_reply(b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x80\x7f\xfe");
        let missing = b(b"$-1\r\n");
        let parts = [
            (vec![0], empty.clone()),
            (vec![1, 3], one.clone()),
            (vec![2], missing.clone()),
        ];
        assert_eq!(&join(Join::HllCount, 4, &parts, 2)[..], b":1\r\n");
        let parts = [(vec![0], b(b"_\r\n")), (vec![1], empty.clone())];
        assert_eq!(&join(Join::HllCount, 2, &parts, 3)[..], b":0\r\n");
        // A string that is no HyperLogLog, a key of another type: the first in key order.
        let parts = [
            (vec![1], b(WRONGTYPE)),
            (vec![0], get_reply(b"text")),
            (vec![2], one),
        ];
        assert_eq!(
            &join(Join::HllCount, 3, &parts, 2)[..],
            b"-WRONGTYPE Key is not a valid HyperLogLog string value.\r\n"
        );
        let parts = [(vec![0], missing), (vec![1], b(WRONGTYPE))];
        assert_eq!(&join(Join::HllCount, 2, &parts, 2)[..], WRONGTYPE);
        let corrupt = get_reply(b"HYLL\x01\0\0\0\0\0\0\0\0\0\0\0\x7f\xfe");
        assert_eq!(
            &join(Join::HllCount, 1, &[(vec![0], corrupt)], 2)[..],
            b"-INVALIDOBJ Corrupted HLL object detected\r\n"
        );
        assert!(is_unexpected(&join(
            Join::HllCount,
            1,
            &[(vec![0], b(b":1\r\n"))],
            2
        )));
        assert!(is_unexpected(&join(
            Join::HllCount,
            2,
            &[(vec![0], empty)],
            2
        )));
    }

    #[test]
    fn scan_cursor_names_the_primary_and_its_cursor() {
        assert_eq!(scan_position(0), (0, 0));
        assert_eq!(scan_position((2u64 << NODE_CURSOR_BITS) | 7), (2, 7));
        assert_eq!(scan_position(NODE_CURSOR_MASK), (0, NODE_CURSOR_MASK));
    }

    #[test]
    fn scan_step_makes_the_cursor_composite() {
        let names = b"*1\r\n$1\r\nk\r\n";
        let reply = |cursor: &str| {
            let mut r = format!("*2\r\n${}\r\n{cursor}\r\n", cursor.len()).into_bytes();
            r.extend_from_slice(names);
            Bytes::from(r)
        };
        // Mid-way through primary 1 of 3: its cursor under its index.
        let mid = (1u64 << NODE_CURSOR_BITS) | 17;
        assert_eq!(
            scan_step_reply(&reply("17"), 1, 3),
            Ok(reply(&mid.to_string()))
        );
        assert_eq!(scan_position(mid), (1, 17));
        // Primary 1 of 3 done: the next primary from its start.
        assert_eq!(
            scan_step_reply(&reply("0"), 1, 3),
            Ok(reply(&(2u64 << NODE_CURSOR_BITS).to_string()))
        );
        // The last primary done: the whole scan is.
        assert_eq!(scan_step_reply(&reply("0"), 2, 3), Ok(reply("0")));
        // A node cursor above the composite's room, an error, a reply of the wrong shape.
        let big = (NODE_CURSOR_MASK + 1).to_string();
        assert_eq!(
            scan_step_reply(&reply(&big), 0, 1),
            Err(answers::scan_cursor_too_large())
        );
        assert_eq!(
            scan_step_reply(&reply(&NODE_CURSOR_MASK.to_string()), 0, 1),
            Ok(reply(&NODE_CURSOR_MASK.to_string()))
        );
        let error = b(b"-ERR no\r\n");
        assert_eq!(scan_step_reply(&error, 0, 1), Err(error));
        assert!(scan_step_reply(&b(b"*0\r\n"), 0, 1).is_err_and(|e| is_unexpected(&e)));
    }

    #[test]
    fn frames_split_until_the_first_incomplete_one() {
        let data = b(b"+OK\r\n*2\r\n:1\r\n:2\r\n$3\r\nab");
        let frames = crate::protocol::reply::split(&data);
        assert_eq!(frames, [b(b"+OK\r\n"), b(b"*2\r\n:1\r\n:2\r\n")]);
    }
}
