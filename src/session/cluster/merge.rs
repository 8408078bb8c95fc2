//! The replies of several cluster nodes made into the client's one reply: a fan-out's
//! (`Merge`), a split command's parts (`Join`), a node's SCAN step. Pure functions over
//! reply bytes: no session, no node, nothing sent.

use crate::{answers, codec};
use bytes::{Bytes, BytesMut};

/// How the replies of a command sent to every primary become one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Merge {
    /// Integer replies added up (DBSIZE).
    Sum,
    /// Array replies concatenated (KEYS).
    Concat,
    /// The first error, else the first reply (FLUSHALL, FLUSHDB).
    AllOk,
    /// The first non-nil reply, starting from a node that varies (RANDOMKEY).
    FirstNonNil,
    /// WAIT/WAITAOF: the smallest count (element-wise for WAITAOF's pair): the replicas (or
    /// fsyncs) every node the client may have written to has reached.
    Min,
    /// INFO: one node's text, with `# Keyspace` counts summed over the primaries and
    /// `cluster_enabled:0` (to its clients the proxy is one server).
    Info,
    /// SCRIPT KILL, FUNCTION KILL: sent to every primary because a script runs on the node
    /// of its keys, which the killer cannot name. `+OK` when one node killed a script;
    /// otherwise the most telling refusal: a node's `UNKILLABLE` (its script wrote), any
    /// other error (a node that could not be asked may be the busy one), else `NOTBUSY`.
    Kill,
}

/// How the replies of a multi-key command split by slot become the client's one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// ZDIFF, ZINTERCARD: per key `ZRANGE key 0 -1` then `SMEMBERS` (the key is a sorted
    /// set or a set, which these commands take too), combined as the command would (see
    /// [`ZOp`]). The parts carry the ZRANGE replies at the key's positions and the SMEMBERS
    /// replies at the key's positions plus the number of keys.
    Sorted(ZOp),
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
        Merge::Sum => {
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
        Merge::Info => merge_info(replies),
        Merge::Min => merge_min(replies),
        Merge::Kill => merge_kill(replies),
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
        let elements = crate::reply::split(&reply.slice(cr + 2..));
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

/// What a sorted-set command across slots computes from its keys' members and scores (a
/// set's members score 1, a missing key is empty, as in Redis). Only commands whose reply
/// holds no score the proxy would have to compute: ZDIFF's are the first key's, as its node
/// formatted them (Redis 7.0 and 7.2+ format doubles differently), ZINTERCARD has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl ZOp {
    /// Whether the keys' scores are read (ZRANGE … WITHSCORES): ZDIFF orders its reply by
    /// them, WITHSCORES or not.
    pub(super) fn scores(self) -> bool {
        matches!(self, ZOp::Diff { .. })
    }
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
    }
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
    let elements = crate::reply::split(&reply.slice(cr + 2..));
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
            match &crate::reply::split(&pair.slice(4..))[..] {
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
    let elements = crate::reply::split(&reply.slice(cr + 2..));
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
fn merge_min(replies: &[Bytes]) -> Bytes {
    let ints = |r: &Bytes| -> Option<Vec<i64>> {
        let frames: Vec<Bytes> = match r.first() {
            Some(b':') => vec![r.clone()],
            Some(b'*') => {
                let cr = memchr::memchr(b'\r', r)?;
                crate::reply::split(&r.slice(cr + 2..))
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
    let Some(mut min) = ints(first) else {
        return unexpected(first);
    };
    for r in &replies[1..] {
        match ints(r) {
            Some(v) if v.len() == min.len() => {
                for (m, x) in min.iter_mut().zip(v) {
                    *m = (*m).min(x);
                }
            }
            _ => return unexpected(r),
        }
    }
    if first.first() == Some(&b':') {
        answers::integer(min[0])
    } else {
        let mut out = format!("*{}\r\n", min.len());
        for m in min {
            out.push_str(&format!(":{m}\r\n"));
        }
        Bytes::from(out)
    }
}

/// The first node's INFO text with every `dbN:keys=…,expires=…` line's counts summed over all
/// nodes and `cluster_enabled:1` turned to 0.
fn merge_info(replies: &[Bytes]) -> Bytes {
    let Some(first) = replies.first() else {
        return answers::clusterdown();
    };
    let Some((verbatim, text)) = crate::session::replies::text_of(first) else {
        return unexpected(first);
    };
    let sums = keyspace_sums(replies);
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for line in text.split_inclusive(|&b| b == b'\n') {
        merged_info_line(line, &sums, &mut out);
    }
    crate::session::replies::text_reply(verbatim, &out)
}

/// Per database, a keyspace count summed over every node's INFO.
type KeyspaceSums = Vec<(Vec<u8>, &'static str, i64)>;

/// (db, field) → sum over the nodes' INFO replies, for the integer fields worth adding up.
fn keyspace_sums(replies: &[Bytes]) -> KeyspaceSums {
    let mut sums = KeyspaceSums::new();
    for reply in replies {
        let Some((_, body)) = crate::session::replies::text_of(reply) else {
            continue;
        };
        for line in body.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some((db, fields)) = keyspace_line(line) {
                add_keyspace_counts(&mut sums, db, fields);
            }
        }
    }
    sums
}

/// Adds the `keys` and `expires` counts of one node's keyspace line for `db` to `sums`.
fn add_keyspace_counts(sums: &mut KeyspaceSums, db: &[u8], fields: &[u8]) {
    for field in fields.split(|&b| b == b',') {
        for name in ["keys", "expires"] {
            let Some(v) = field
                .strip_prefix(name.as_bytes())
                .and_then(|r| r.strip_prefix(b"="))
                .and_then(codec::parse_int)
            else {
                continue;
            };
            match sums.iter_mut().find(|(d, n, _)| d == db && *n == name) {
                Some((_, _, total)) => *total += v,
                None => sums.push((db.to_vec(), name, v)),
            }
        }
    }
}

/// One line of the first node's INFO text (with its line ending) as the client gets it:
/// `cluster_enabled:0`, a keyspace line with the summed counts, any other line as it is.
fn merged_info_line(line: &[u8], sums: &KeyspaceSums, out: &mut Vec<u8>) {
    let bare = line.strip_suffix(b"\n").unwrap_or(line);
    let bare = bare.strip_suffix(b"\r").unwrap_or(bare);
    let ending = &line[bare.len()..];
    if bare == b"cluster_enabled:1" {
        out.extend_from_slice(b"cluster_enabled:0");
        out.extend_from_slice(ending);
        return;
    }
    let Some((db, fields)) = keyspace_line(bare) else {
        out.extend_from_slice(line);
        return;
    };
    out.extend_from_slice(db);
    out.push(b':');
    for (i, field) in fields.split(|&b| b == b',').enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let name = field.split(|&b| b == b'=').next().unwrap_or(b"");
        match sums
            .iter()
            .find(|(d, n, _)| d == db && n.as_bytes() == name)
        {
            Some((_, n, total)) => out.extend_from_slice(format!("{n}={total}").as_bytes()),
            None => out.extend_from_slice(field),
        }
    }
    out.extend_from_slice(ending);
}

/// `dbN` and its fields, for a `# Keyspace` line such as `db0:keys=3,expires=1,avg_ttl=0`.
fn keyspace_line(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = memchr::memchr(b':', line)?;
    let (db, fields) = (&line[..colon], &line[colon + 1..]);
    (db.len() > 2
        && db.starts_with(b"db")
        && db[2..].iter().all(u8::is_ascii_digit)
        && fields.starts_with(b"keys="))
    .then_some((db, fields))
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
    fn info_sums_the_keyspace() {
        let info = |keys: u32, expires: u32| {
            let text = format!(
                "# Server\r\nredis_version:7.2\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n\r\n# Keyspace\r\ndb0:keys={keys},expires={expires},avg_ttl=5\r\n"
            );
            Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
        };
        let merged = merge(Merge::Info, &[info(3, 1), info(4, 0), info(10, 2)], 0);
        let text = String::from_utf8_lossy(&merged).into_owned();
        assert!(
            text.contains("db0:keys=17,expires=3,avg_ttl=5\r\n"),
            "{text}"
        );
        assert!(text.contains("cluster_enabled:0\r\n"), "{text}");
        assert!(text.contains("redis_version:7.2\r\n"), "{text}");
        let header = format!(
            "${}\r\n",
            merged.len() - 2 - format!("{}", merged.len()).len() - 3
        );
        assert!(merged.starts_with(header.as_bytes()), "{text}");
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
    fn keyspace_lines_are_recognised() {
        assert_eq!(
            keyspace_line(b"db12:keys=3,expires=1"),
            Some((&b"db12"[..], &b"keys=3,expires=1"[..]))
        );
        assert_eq!(keyspace_line(b"db:keys=3"), None);
        assert_eq!(keyspace_line(b"dbx:keys=3"), None);
        assert_eq!(keyspace_line(b"db0:expires=1"), None);
        assert_eq!(keyspace_line(b"used_memory:100"), None);
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
                &join(Join::Sorted(op), 2, &parts, 2)[..],
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
        let frames = crate::reply::split(&data);
        assert_eq!(frames, [b(b"+OK\r\n"), b(b"*2\r\n:1\r\n:2\r\n")]);
    }
}
