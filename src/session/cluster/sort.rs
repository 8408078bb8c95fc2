//! Cluster mode: SORT and SORT_RO with `BY` and `GET` patterns, answered by gathering.
//!
//! A pattern names other keys (`weight_*` is `weight_<element>` for each element), which
//! may live on any node, so Redis Cluster refuses every such SORT (Redis 7.0: any `GET` and
//! any `BY` with a `*`; 7.4+: those whose keys may be in another slot). A client of the proxy
//! sees one server, and these are reads, so the proxy answers them itself, as a non-atomic
//! gather like a split MGET:
//! 1. the sorted key's elements from its node: `SORT key` with the client's options but its
//!    GETs (Redis sorts them, LIMIT, ASC/DESC and ALPHA included) when nothing is sorted by
//!    a pattern; `SORT key BY nosort` (every element) when a `BY` pattern sorts them; with a
//!    LIMIT that asks for one element more than `MAX_LOOKUPS` allows, so a list too long is
//!    told apart without the node sending it whole;
//! 2. for a `BY` pattern, each element's weight (`GET`, or `HGET` for `pattern->field`) from
//!    its key's node, then sorted as `sortCommandGeneric` sorts: by the weight as a double
//!    (a missing one is 0, one that is not a number is Redis's error) with ties broken by the
//!    element's bytes, or with ALPHA by the weight's bytes (a missing one first), then
//!    reversed for DESC and cut to LIMIT;
//! 3. for each `GET` pattern, each element's value the same way (`#` is the element itself,
//!    a pattern without `*`, a missing key or a key of another type is a nil).
//!
//! Differences from one Redis: not atomic (a weight written meanwhile may be read before or
//! after); ALPHA with a `BY` pattern compares bytes, as Redis does under the C locale
//! (Redis uses `strcoll` in its own locale; without `BY` the node sorts, so its locale
//! applies); memory for the elements and their lookups while the command runs, at most
//! `MAX_LOOKUPS` keys read per command (past it the command is refused, saying why). Not gathered
//! (the node answers as before): `STORE` (a write across slots: refused with CROSSSLOT, its
//! refusal naming hash tags), inside MULTI or a pinned session, a namespaced tenant (the
//! policy refuses its patterns), options Redis refuses, and with routes (each route is one
//! Redis, which reads the patterns itself).

use super::ClusterSession;
use super::again::may_redirect;
use super::exchange::{lost_reply, receive};
use super::plan::SortGather;
use crate::commands::grammar::keyword;
use crate::policy::rewrite::Rewrite;
use crate::protocol::{answers, codec};
use crate::session::route::Args;
use crate::topology::cluster::Router;
use bytes::{Bytes, BytesMut};
use std::cmp::Ordering;

/// The most keys one gathered SORT reads (weights and GET values together): each costs the
/// proxy its key and value while the command runs, and a client names as many GET patterns
/// as it likes, so without a bound one command could hold the proxy's memory for every
/// tenant. 100,000 lookups hold about 10 MB; past it the command is refused, saying why.
pub(in crate::session) const MAX_LOOKUPS: usize = 100_000;

/// Whether `spec` is SORT or SORT_RO, whose patterns `plan` may gather.
pub(super) fn is_sort(spec: Option<&crate::commands::CommandSpec>) -> bool {
    spec.is_some_and(|s| matches!(s.name, "sort" | "sort_ro"))
}

/// The gather for a SORT or SORT_RO (`args`, or the policy's rewrite of it) that has a `GET`
/// or a sorting `BY` pattern; `None` for any other command, with STORE, with options Redis
/// refuses, or when the policy's rewrite does more than replace the command.
pub(super) fn plan(args: &Args<'_>, rewrite: Option<&Rewrite>) -> Option<SortGather> {
    // A read has no hidden commands to place; a namespaced tenant's patterns are refused.
    if rewrite.is_some_and(|r| !r.after.is_empty() || r.strip.is_some()) {
        return None;
    }
    plan_argv(&super::gather::decided_argv(args, rewrite)?)
}

/// `plan` over the command's arguments, read as `sortCommandGeneric` reads them.
fn plan_argv(argv: &[&[u8]]) -> Option<SortGather> {
    let name = argv.first()?;
    let readonly = if name.eq_ignore_ascii_case(b"SORT") {
        false
    } else if name.eq_ignore_ascii_case(b"SORT_RO") {
        true
    } else {
        return None;
    };
    let key = *argv.get(1)?;
    let (mut desc, mut alpha, mut dontsort) = (false, false, false);
    let mut limit = None;
    let mut by: Option<&[u8]> = None;
    let mut gets = Vec::new();
    let mut j = 2;
    while j < argv.len() {
        let a = argv[j];
        let left = argv.len() - j - 1;
        if keyword(a, b"ASC") {
            desc = false;
        } else if keyword(a, b"DESC") {
            desc = true;
        } else if keyword(a, b"ALPHA") {
            alpha = true;
        } else if keyword(a, b"LIMIT") && left >= 2 {
            let start = codec::parse_int(argv[j + 1])?;
            let count = codec::parse_int(argv[j + 2])?;
            limit = Some((start, count));
            j += 3;
            continue;
        } else if !readonly && keyword(a, b"STORE") && left >= 1 {
            return None;
        } else if keyword(a, b"BY") && left >= 1 {
            let pattern = argv[j + 1];
            // Redis reads the pattern as a C string; once constant, nothing is sorted.
            if !c_str(pattern).contains(&b'*') {
                dontsort = true;
            }
            by = Some(pattern);
            j += 2;
            continue;
        } else if keyword(a, b"GET") && left >= 1 {
            gets.push(Bytes::copy_from_slice(argv[j + 1]));
            j += 2;
            continue;
        } else {
            return None;
        }
        j += 1;
    }
    let sorting_by = by.filter(|_| !dontsort);
    if gets.is_empty() && sorting_by.is_none() {
        return None;
    }
    let first = match sorting_by {
        // Every element, each a weight to read: one past the bound says it is too many
        // without the node sending (and the proxy holding) the whole list.
        Some(_) => codec::encode(&[
            name,
            key,
            b"BY",
            b"nosort",
            b"LIMIT",
            b"0",
            (MAX_LOOKUPS + 1).to_string().as_bytes(),
        ]),
        None => {
            // What Redis makes of the options, so a BY with a `*` after a constant one (which
            // the node would refuse, and which sorts nothing) is not sent. The window the
            // client asked for, cut to one element past what its GETs may read: the node's
            // reply is then that window's first part, and says whether the window is
            // longer than the bound allows.
            let most = i64::try_from(MAX_LOOKUPS / gets.len() + 1).unwrap_or(i64::MAX);
            let (start, count) = match limit {
                Some((start, count)) if (0..=most).contains(&count) => (start, count),
                Some((start, _)) => (start, most),
                None => (0, most),
            };
            let (start, count) = (start.to_string(), count.to_string());
            let mut node: Vec<&[u8]> = vec![name, key];
            if dontsort {
                node.extend([&b"BY"[..], b"nosort"]);
            }
            node.extend([&b"LIMIT"[..], start.as_bytes(), count.as_bytes()]);
            if desc {
                node.push(b"DESC");
            }
            if alpha {
                node.push(b"ALPHA");
            }
            codec::encode(&node)
        }
    };
    Some(SortGather {
        first,
        key: Bytes::copy_from_slice(key),
        by: sorting_by.map(Bytes::copy_from_slice),
        gets,
        desc,
        alpha,
        limit,
    })
}

/// `s` up to its first NUL: what C's string functions see of it.
fn c_str(s: &[u8]) -> &[u8] {
    s.iter().position(|&b| b == 0).map_or(s, |n| &s[..n])
}

/// What a pattern names for one element (`lookupKeyByPattern`).
#[derive(Debug, PartialEq, Eq)]
enum Lookup {
    /// `#`: the element itself.
    Element,
    /// Nothing (a pattern without `*`): a nil.
    Nothing,
    /// A string key's value.
    Key(Vec<u8>),
    /// A hash field's value (`pattern->field`).
    Field(Vec<u8>, Bytes),
}

/// `pattern` with its first `*` replaced by `element`, as `lookupKeyByPattern` forms it: `#`
/// (as a C string) is the element; no `*` before the first NUL names nothing; `->` after the
/// `*` followed by at least one byte names a hash field (the rest of the pattern).
fn lookup(pattern: &[u8], element: &[u8]) -> Lookup {
    if pattern.first() == Some(&b'#') && pattern.get(1).is_none_or(|&b| b == 0) {
        return Lookup::Element;
    }
    let c = c_str(pattern);
    let Some(star) = c.iter().position(|&b| b == b'*') else {
        return Lookup::Nothing;
    };
    let arrow = c[star + 1..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|at| star + 1 + at)
        .filter(|&at| at + 2 < c.len());
    let end = arrow.unwrap_or(pattern.len());
    let mut key = Vec::with_capacity(pattern.len() + element.len());
    key.extend_from_slice(&pattern[..star]);
    key.extend_from_slice(element);
    key.extend_from_slice(&pattern[star + 1..end]);
    match arrow {
        Some(at) => Lookup::Field(key, Bytes::copy_from_slice(&pattern[at + 2..])),
        None => Lookup::Key(key),
    }
}

/// A weight read as `strtod` reads it in `sortCommandGeneric`: leading white space skipped,
/// the whole rest a number (an empty rest is 0); `None` where Redis answers that it "can't
/// be converted into double" (trailing bytes, NaN, out of range). Hexadecimal floats, which
/// `strtod` also reads, are refused.
fn weight(value: &[u8]) -> Option<f64> {
    let value = c_str(value);
    let start = value
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r'))
        .unwrap_or(value.len());
    let text = std::str::from_utf8(&value[start..]).ok()?;
    if text.is_empty() {
        return Some(0.0);
    }
    let lower = text.to_ascii_lowercase();
    let unsigned = lower.trim_start_matches(['+', '-']);
    if unsigned.starts_with("0x") || unsigned.starts_with("nan") {
        return None;
    }
    let v: f64 = text.parse().ok()?;
    // ERANGE: a finite text whose value overflows.
    (v.is_finite() || unsigned.starts_with("inf")).then_some(v)
}

/// The elements' order as `sortCompare` gives it: numeric by weight then by the element's
/// bytes, or ALPHA by the weight's bytes (a missing one first); reversed for DESC.
fn sort_elements(
    elements: &mut [(Bytes, Option<Bytes>)],
    alpha: bool,
    desc: bool,
) -> Result<(), Bytes> {
    let order = |o: Ordering| if desc { o.reverse() } else { o };
    if alpha {
        elements.sort_by(|(_, a), (_, b)| {
            order(match (a, b) {
                (Some(a), Some(b)) => c_str(a).cmp(c_str(b)),
                (a, b) => a.is_some().cmp(&b.is_some()),
            })
        });
        return Ok(());
    }
    let mut scored = Vec::with_capacity(elements.len());
    for (element, w) in elements.iter() {
        let score = match w {
            Some(w) => weight(w).ok_or_else(answers::sort_not_double)?,
            None => 0.0,
        };
        scored.push((score, element.clone(), w.clone()));
    }
    scored.sort_by(|(a, ea, _), (b, eb, _)| {
        order(
            a.partial_cmp(b)
                .unwrap_or(Ordering::Equal)
                .then_with(|| ea.cmp(eb)),
        )
    });
    for (slot, (_, element, w)) in elements.iter_mut().zip(scored) {
        *slot = (element, w);
    }
    Ok(())
}

/// The elements LIMIT keeps of `len`, as `sortCommandGeneric` computes start and end.
fn window(len: usize, limit: Option<(i64, i64)>) -> std::ops::Range<usize> {
    let Some((start, count)) = limit else {
        return 0..len;
    };
    let len = i64::try_from(len).unwrap_or(i64::MAX);
    let start = start.max(0);
    let mut end = if count < 0 {
        len - 1
    } else {
        start.saturating_add(count) - 1
    };
    let (start, end) = if start >= len {
        (len - 1, len - 2)
    } else {
        if end >= len {
            end = len - 1;
        }
        (start, end)
    };
    let start = usize::try_from(start).unwrap_or(0);
    let end = usize::try_from(end.saturating_add(1)).unwrap_or(0);
    start..end.max(start)
}

/// The content of a bulk string frame; `None` for a nil, an error or anything else.
fn bulk_content(frame: &[u8]) -> Option<&[u8]> {
    if frame.first() != Some(&b'$') {
        return None;
    }
    let cr = memchr::memchr(b'\r', frame)?;
    codec::parse_int(&frame[1..cr]).filter(|&n| n >= 0)?;
    frame.get(cr + 2..frame.len().checked_sub(2)?)
}

impl ClusterSession<'_> {
    /// Carries out a `SortGather`: the one reply the client gets.
    pub(in crate::session) async fn sort(&mut self, sort: SortGather) -> Bytes {
        let router = self.cluster.router.clone();
        let Some(node) = router.snapshot().owner(router.slot_of(&sort.key)) else {
            router.refresh_soon();
            return answers::clusterdown();
        };
        let (data, error) = self
            .exchange(&router, node, self.client.proto, sort.first.clone(), 1)
            .await;
        let mut frames = crate::protocol::reply::split(&data);
        if error.is_none() && may_redirect(&data) {
            self.redirect_batch(&router, node, &sort.first, &mut frames)
                .await;
        }
        let Some(reply) = frames.into_iter().next() else {
            return lost_reply(error.as_deref(), &router.addr(node), "no reply");
        };
        // The node's error (WRONGTYPE, a bad double when it sorted) goes to the client.
        let Some(items) = crate::protocol::reply::array_elements(&reply) else {
            return reply;
        };
        let mut elements: Vec<(Bytes, Option<Bytes>)> = Vec::with_capacity(items.len());
        for item in &items {
            match bulk_content(item) {
                Some(e) => elements.push((item.slice_ref(e), None)),
                None => return reply,
            }
        }
        // Bounded before anything is looked up (`MAX_LOOKUPS`): the weights, then each
        // element LIMIT keeps times the GET patterns.
        let weighed = if sort.by.is_some() { elements.len() } else { 0 };
        let kept = if sort.by.is_some() {
            window(elements.len(), sort.limit).len()
        } else {
            elements.len()
        };
        if weighed.saturating_add(kept.saturating_mul(sort.gets.len())) > MAX_LOOKUPS {
            return answers::sort_gather_too_large(MAX_LOOKUPS);
        }
        let mut range = 0..elements.len();
        if let Some(by) = &sort.by {
            let looked: Vec<Lookup> = elements.iter().map(|(e, _)| lookup(by, e)).collect();
            let weights = match self.look_up(&router, &looked).await {
                Ok(values) => values,
                Err(reply) => return reply,
            };
            for ((_, w), value) in elements.iter_mut().zip(weights) {
                *w = value;
            }
            if let Err(reply) = sort_elements(&mut elements, sort.alpha, sort.desc) {
                return reply;
            }
            range = window(elements.len(), sort.limit);
        }
        let shown = &elements[range];
        let proto = self.client.proto;
        if sort.gets.is_empty() {
            let mut out = BytesMut::from(format!("*{}\r\n", shown.len()).as_bytes());
            for (e, _) in shown {
                out.extend_from_slice(&answers::bulk(e));
            }
            return out.freeze();
        }
        let looked: Vec<Lookup> = shown
            .iter()
            .flat_map(|(e, _)| sort.gets.iter().map(move |g| lookup(g, e)))
            .collect();
        let values = match self.look_up(&router, &looked).await {
            Ok(values) => values,
            Err(reply) => return reply,
        };
        let mut out = BytesMut::from(format!("*{}\r\n", values.len()).as_bytes());
        let per_element = sort.gets.len();
        for (i, (value, what)) in values.iter().zip(&looked).enumerate() {
            match (what, value) {
                (Lookup::Element, _) => {
                    out.extend_from_slice(&answers::bulk(&shown[i / per_element].0));
                }
                (_, Some(value)) => out.extend_from_slice(&answers::bulk(value)),
                _ => out.extend_from_slice(&answers::null(proto)),
            }
        }
        out.freeze()
    }

    /// The value of each lookup read from its node (`None`: a missing key or field, a key of
    /// another type; and for `Element` and `Nothing`, which ask no node), all nodes asked at
    /// once; the client's error reply when a node failed or a slot has no owner.
    async fn look_up(
        &mut self,
        router: &Router,
        lookups: &[Lookup],
    ) -> Result<Vec<Option<Bytes>>, Bytes> {
        let snapshot = router.snapshot();
        // Per node: its commands and the lookups they answer, in order.
        let mut batches: Vec<(u16, BytesMut, Vec<usize>)> = Vec::new();
        for (i, l) in lookups.iter().enumerate() {
            let command = match l {
                Lookup::Key(key) => codec::encode(&[b"GET", key]),
                Lookup::Field(key, field) => codec::encode(&[b"HGET", key, field]),
                Lookup::Element | Lookup::Nothing => continue,
            };
            let key = match l {
                Lookup::Key(key) | Lookup::Field(key, _) => key,
                Lookup::Element | Lookup::Nothing => continue,
            };
            let Some(node) = snapshot.owner(router.slot_of(key)) else {
                router.refresh_soon();
                return Err(answers::clusterdown());
            };
            let at = match batches.iter().position(|(n, ..)| *n == node) {
                Some(at) => at,
                None => {
                    batches.push((node, BytesMut::new(), Vec::new()));
                    batches.len() - 1
                }
            };
            batches[at].1.extend_from_slice(&command);
            batches[at].2.push(i);
        }
        let proto = self.client.proto;
        let mut pending = Vec::with_capacity(batches.len());
        for (node, bytes, answers_for) in batches {
            let bytes = bytes.freeze();
            let frames = u32::try_from(answers_for.len()).unwrap_or(u32::MAX);
            let rx = self
                .send_shared(router, node, proto, bytes.clone(), frames)
                .await;
            pending.push((node, bytes, answers_for, rx));
        }
        let mut values: Vec<Option<Bytes>> = vec![None; lookups.len()];
        for (node, bytes, answers_for, rx) in pending {
            let (data, error) = receive(rx, router, node).await;
            let mut frames = crate::protocol::reply::split(&data);
            if error.is_none() && may_redirect(&data) {
                self.redirect_batch(router, node, &bytes, &mut frames).await;
            }
            if frames.len() < answers_for.len() {
                return Err(lost_reply(error.as_deref(), &router.addr(node), "no reply"));
            }
            for (i, frame) in answers_for.into_iter().zip(frames) {
                values[i] = bulk_content(&frame).map(|v| frame.slice_ref(v));
            }
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(line: &str) -> Option<SortGather> {
        let argv: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        plan_argv(&argv)
    }

    #[test]
    fn gathered_only_with_a_get_or_a_sorting_by() {
        assert_eq!(plan_of("SORT k"), None);
        assert_eq!(plan_of("SORT k BY nosort LIMIT 0 3"), None);
        assert_eq!(plan_of("SORT k BY w_* STORE d"), None, "a write");
        assert_eq!(
            plan_of("SORT_RO k BY w_* STORE d"),
            None,
            "Redis refuses it"
        );
        assert_eq!(plan_of("SORT k BY w_* LIMIT x 1"), None, "Redis refuses it");
        assert_eq!(plan_of("SORT k BY"), None, "Redis refuses it");
        let by = plan_of("sort k limit 5 5 by w_* desc alpha").unwrap();
        assert_eq!(
            by.first,
            codec::encode(&[b"sort", b"k", b"BY", b"nosort", b"LIMIT", b"0", b"100001"])
        );
        assert_eq!(by.by.as_deref(), Some(&b"w_*"[..]));
        assert_eq!((by.desc, by.alpha, by.limit), (true, true, Some((5, 5))));
        // The node sorts, with the options as Redis reads them, but the GETs.
        let get = plan_of("SORT k GET # DESC GET w_*->f LIMIT 0 2 LIMIT 1 3 asc alpha").unwrap();
        assert_eq!(
            get.first,
            codec::encode(&[b"SORT", b"k", b"LIMIT", b"1", b"3", b"ALPHA"])
        );
        assert_eq!(get.by, None);
        assert_eq!(get.gets, [&b"#"[..], b"w_*->f"]);
        // The node sends no more than one element past what the GETs may read.
        for (line, start, count) in [
            ("SORT k GET #", "0", "100001"),
            ("SORT k GET # GET h_*", "0", "50001"),
            ("SORT k GET # LIMIT 7 -1", "7", "100001"),
            ("SORT k GET # LIMIT -3 200000", "-3", "100001"),
            ("SORT k GET # LIMIT 2 100001", "2", "100001"),
        ] {
            let want = codec::encode(&[
                &b"SORT"[..],
                b"k",
                b"LIMIT",
                start.as_bytes(),
                count.as_bytes(),
            ]);
            assert_eq!(plan_of(line).unwrap().first, want, "{line}");
        }
        // A constant BY anywhere means no sorting, as Redis's `dontsort` stays set.
        let constant = plan_of("SORT k BY nosort BY w_* GET # DESC").unwrap();
        assert_eq!(constant.by, None);
        assert_eq!(
            constant.first,
            codec::encode(&[
                b"SORT", b"k", b"BY", b"nosort", b"LIMIT", b"0", b"100001", b"DESC"
            ])
        );
        assert_eq!(
            plan_of("SORT k BY w\0* GET #").unwrap().by,
            None,
            "C string"
        );
        // NUL-suffixed keywords, as strcasecmp reads them.
        assert!(plan_of("SORT k GET\0x # DESC\0").is_some_and(|p| p.desc));
    }

    #[test]
    fn patterns_name_keys_and_fields_as_lookup_key_by_pattern() {
        let key = |s: &str| Lookup::Key(s.as_bytes().to_vec());
        assert_eq!(lookup(b"#", b"e"), Lookup::Element);
        assert_eq!(lookup(b"#\0x", b"e"), Lookup::Element);
        assert_eq!(lookup(b"##", b"e"), Lookup::Nothing);
        assert_eq!(lookup(b"foo", b"e"), Lookup::Nothing);
        assert_eq!(lookup(b"w_*", b"e"), key("w_e"));
        assert_eq!(lookup(b"w_*_*", b"e"), key("w_e_*"));
        assert_eq!(
            lookup(b"h_*->f", b"e"),
            Lookup::Field(b"h_e".to_vec(), Bytes::from_static(b"f"))
        );
        // `->` with nothing after it is part of the key (Redis's own test).
        assert_eq!(lookup(b"x:*->", b"a"), key("x:a->"));
        // `->` before the `*` is part of the key.
        assert_eq!(lookup(b"a->b*", b"e"), key("a->be"));
        assert_eq!(lookup(b"w\0*", b"e"), Lookup::Nothing);
    }

    #[test]
    fn weights_read_as_strtod() {
        assert_eq!(weight(b"1.5"), Some(1.5));
        assert_eq!(weight(b"  -2"), Some(-2.0));
        assert_eq!(weight(b""), Some(0.0));
        assert_eq!(weight(b"inf"), Some(f64::INFINITY));
        assert_eq!(weight(b"-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(weight(b"1e400"), None, "ERANGE");
        assert_eq!(weight(b"nan"), None);
        assert_eq!(weight(b"not-a-double"), None);
        assert_eq!(weight(b"1 "), None, "trailing bytes");
        assert_eq!(weight(b"7\0junk"), Some(7.0), "C string");
    }

    #[test]
    fn sorted_by_weight_then_element_reversed_for_desc() {
        let e = |s: &'static str, w: Option<&'static str>| {
            (
                Bytes::from_static(s.as_bytes()),
                w.map(|w| Bytes::from_static(w.as_bytes())),
            )
        };
        let names = |v: &[(Bytes, Option<Bytes>)]| {
            v.iter()
                .map(|(e, _)| String::from_utf8_lossy(e).into_owned())
                .collect::<Vec<_>>()
        };
        let mut v = vec![
            e("b", Some("2")),
            e("c", None),
            e("a", Some("2")),
            e("d", Some("1")),
        ];
        sort_elements(&mut v, false, false).unwrap();
        assert_eq!(names(&v), ["c", "d", "a", "b"]);
        sort_elements(&mut v, false, true).unwrap();
        assert_eq!(names(&v), ["b", "a", "d", "c"]);
        let mut v = vec![e("x", Some("b")), e("y", None), e("z", Some("a"))];
        sort_elements(&mut v, true, false).unwrap();
        assert_eq!(names(&v), ["y", "z", "x"]);
        let mut bad = vec![e("x", Some("1")), e("y", Some("no"))];
        assert_eq!(
            sort_elements(&mut bad, false, false),
            Err(answers::sort_not_double())
        );
    }

    #[test]
    fn limit_windows_as_sort_command_generic() {
        assert_eq!(window(10, None), 0..10);
        assert_eq!(window(10, Some((5, 5))), 5..10);
        assert_eq!(window(10, Some((5, 100))), 5..10);
        assert_eq!(window(10, Some((-10, 3))), 0..3);
        assert_eq!(window(10, Some((2, -1))), 2..10);
        assert_eq!(window(10, Some((10, 5))), 9..9);
        assert_eq!(window(10, Some((0, 0))), 0..0);
        assert_eq!(window(0, Some((0, 5))), 0..0);
        assert_eq!(window(3, Some((1, i64::MAX))), 1..3);
    }
}
