//! How many elements a read can return, from its arguments alone: the measure behind the
//! `max_range` and `deny_unbounded_reads` guards. A guard on the literal `LRANGE k 0 -1` lets
//! `LRANGE k 0 999999999`, `ZRANGE k 0 -1 REV` or `SRANDMEMBER k -1000000` through; bounding
//! the size of the range the command asks for catches every spelling.
//!
//! Computed only for the commands in [`COMMANDS`] (the guards are indexed by them), without
//! allocating: the arguments are read in place.

use super::line::CommandLine;
use crate::commands::{CommandSpec, grammar};
use crate::protocol::codec::parse_int;

/// The commands a range guard is indexed by.
pub(crate) const COMMANDS: &[&str] = &[
    "lrange",
    "zrange",
    "zrangestore",
    "zrevrange",
    "zrangebyscore",
    "zrevrangebyscore",
    "zrangebylex",
    "zrevrangebylex",
    "xrange",
    "xrevrange",
    "srandmember",
    "vrandmember",
    "hrandfield",
    "zrandmember",
    "spop",
    "lpop",
    "rpop",
    "zpopmin",
    "zpopmax",
    "lmpop",
    "blmpop",
    "zmpop",
    "bzmpop",
    "sort",
    "sort_ro",
    "geosearch",
    "geosearchstore",
    "georadius",
    "georadius_ro",
    "georadiusbymember",
    "georadiusbymember_ro",
    "hgetall",
    "hkeys",
    "hvals",
    "smembers",
];

/// How many elements a read asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    /// At most this many.
    AtMost(u64),
    /// As many as the collection holds: nothing in the arguments bounds it.
    Whole,
}

/// The size of the range `line` asks for; `None` when the command is not a range read or its
/// arguments are malformed (Redis refuses those itself). Options are read as Redis's own
/// parsers read them ([`grammar`]): `COUNT\0` is COUNT, a `LIMIT` that is the value of `GET`
/// is no LIMIT, the last LIMIT or COUNT is the one applied.
pub(crate) fn read_size<L: CommandLine + ?Sized>(spec: &CommandSpec, line: &L) -> Option<Size> {
    let int = |i: usize| (i < line.argc()).then(|| parse_int(line.arg(i))).flatten();
    let limit = |count: Option<usize>| match count.and_then(int) {
        // A negative LIMIT count is the whole range.
        Some(n) => u64::try_from(n).map_or(Size::Whole, Size::AtMost),
        None => Size::Whole,
    };
    match spec.name {
        "lrange" | "zrevrange" => indices(int(2)?, int(3)?),
        "zrange" | "zrangestore" => {
            let from = if spec.name == "zrange" { 2 } else { 3 };
            let o = grammar::zrange_options(line, from + 2, false)?;
            if o.by_value {
                Some(limit(o.limit_count))
            } else {
                indices(int(from)?, int(from + 1)?)
            }
        }
        "zrangebyscore" | "zrevrangebyscore" | "zrangebylex" | "zrevrangebylex" => {
            Some(limit(grammar::zrange_options(line, 4, true)?.limit_count))
        }
        "sort" | "sort_ro" => Some(limit(
            grammar::sort_options(line, spec.name == "sort_ro")?.limit_count,
        )),
        "xrange" | "xrevrange" => Some(count(grammar::xrange_count(line)?.and_then(int))),
        "geosearch"
        | "geosearchstore"
        | "georadius"
        | "georadius_ro"
        | "georadiusbymember"
        | "georadiusbymember_ro" => Some(count(
            grammar::geo_options(line, spec.name)?.count.and_then(int),
        )),
        // A negative count returns that many elements, repeats allowed.
        "srandmember" | "hrandfield" | "zrandmember" | "vrandmember" => {
            Some(Size::AtMost(int(2).map_or(1, i64::unsigned_abs)))
        }
        "spop" | "lpop" | "rpop" | "zpopmin" | "zpopmax" => {
            Some(Size::AtMost(int(2).map_or(1, i64::unsigned_abs)))
        }
        "lmpop" | "zmpop" => Some(Size::AtMost(mpop(grammar::mpop_count(line, 1)?, line)?)),
        "blmpop" | "bzmpop" => Some(Size::AtMost(mpop(grammar::mpop_count(line, 2)?, line)?)),
        "hgetall" | "hkeys" | "hvals" | "smembers" => Some(Size::Whole),
        _ => None,
    }
}

/// A COUNT option's value: at most that many; none (or a negative one, which XRANGE reads as
/// 0 and GEO refuses) is the whole range.
fn count(n: Option<i64>) -> Size {
    match n {
        Some(n) if n >= 0 => Size::AtMost(n as u64),
        Some(_) => Size::AtMost(0),
        None => Size::Whole,
    }
}

/// The elements an *MPOP pops: its COUNT (1 when absent).
fn mpop<L: CommandLine + ?Sized>(count: Option<usize>, line: &L) -> Option<u64> {
    match count {
        Some(i) => u64::try_from(parse_int(line.arg(i))?).ok(),
        None => Some(1),
    }
}

/// `start stop` as list or rank indices; negative ones count from the end, so a range with a
/// non-negative start and a negative stop reaches the end of any collection.
fn indices(start: i64, stop: i64) -> Option<Size> {
    // In i128: `LRANGE k -9223372036854775808 0` overflowed i64 (a panic in a debug build).
    let span = |a: i64, b: i64| {
        let n = i128::from(b) - i128::from(a) + 1;
        Size::AtMost(n.clamp(0, i128::from(u64::MAX)) as u64)
    };
    Some(match (start >= 0, stop >= 0) {
        (true, true) | (false, false) => span(start, stop),
        // A negative start is clamped to 0 by Redis: at most `stop + 1` elements.
        (false, true) => span(0, stop),
        (true, false) => Size::Whole,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands;

    fn size(line: &str) -> Option<Size> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        read_size(commands::lookup_args(&args).unwrap(), &args[..])
    }

    #[test]
    fn every_spelling_of_a_whole_collection_read_is_whole() {
        for line in [
            "LRANGE l 0 -1",
            "LRANGE l 5 -2",
            "ZRANGE z 0 -1",
            "ZRANGE z 0 -1 REV WITHSCORES",
            "ZRANGE z -inf +inf BYSCORE",
            "ZRANGE z - + BYLEX REV",
            "ZRANGE z (1 5 BYSCORE LIMIT 0 -1",
            "ZREVRANGE z 0 -1",
            "ZRANGEBYSCORE z -inf +inf",
            "ZREVRANGEBYLEX z + -",
            "ZRANGESTORE d z 0 -1",
            "XRANGE s - +",
            "GEOSEARCH g FROMLONLAT 0 0 BYRADIUS 10 km",
            "SORT l",
            "HGETALL h",
            "SMEMBERS s",
            "HKEYS h",
        ] {
            assert_eq!(size(line), Some(Size::Whole), "{line}");
        }
    }

    #[test]
    fn bounded_ranges_are_measured() {
        assert_eq!(
            size("LRANGE l 0 999999999"),
            Some(Size::AtMost(1_000_000_000))
        );
        assert_eq!(size("LRANGE l 0 99"), Some(Size::AtMost(100)));
        assert_eq!(size("LRANGE l -10 -1"), Some(Size::AtMost(10)));
        assert_eq!(size("LRANGE l -100 4"), Some(Size::AtMost(5)));
        assert_eq!(size("LRANGE l 5 2"), Some(Size::AtMost(0)));
        assert_eq!(size("ZRANGE z 0 9 REV"), Some(Size::AtMost(10)));
        assert_eq!(
            size("ZRANGE z -inf +inf BYSCORE LIMIT 0 50"),
            Some(Size::AtMost(50))
        );
        assert_eq!(size("ZRANGESTORE d z 0 4"), Some(Size::AtMost(5)));
        assert_eq!(
            size("ZRANGEBYSCORE z 0 10 LIMIT 5 20"),
            Some(Size::AtMost(20))
        );
        assert_eq!(size("XRANGE s - + COUNT 100"), Some(Size::AtMost(100)));
        assert_eq!(
            size("SRANDMEMBER s -1000000"),
            Some(Size::AtMost(1_000_000))
        );
        assert_eq!(size("SRANDMEMBER s"), Some(Size::AtMost(1)));
        assert_eq!(
            size("HRANDFIELD h 5000 WITHVALUES"),
            Some(Size::AtMost(5000))
        );
        assert_eq!(size("ZRANDMEMBER z 3"), Some(Size::AtMost(3)));
        assert_eq!(size("SPOP s 10"), Some(Size::AtMost(10)));
        assert_eq!(size("LMPOP 2 a b LEFT COUNT 7"), Some(Size::AtMost(7)));
        assert_eq!(size("SORT l LIMIT 0 10 ALPHA"), Some(Size::AtMost(10)));
        assert_eq!(size("GET k"), None);
    }

    #[test]
    fn hostile_spellings_are_read_as_redis_reads_them() {
        // Keywords end at a NUL byte (strcasecmp); decoys are values of other options.
        for line in [
            "ZRANGE z -inf +inf BYSCORE\0",
            "ZRANGE z -inf +inf byscore\0x",
            "XRANGE s - + COUNT\0 100000",
            "SORT k GET # BY LIMIT GET 10",
            "SORT k BY LIMIT\0",
            "GEOSEARCH g FROMLONLAT 0 0 BYRADIUS 10 km COUNT\0 5 COUNT\0 -5",
        ] {
            assert_ne!(size(line), Some(Size::AtMost(10)), "{line}");
            let s = size(line);
            assert!(
                s.is_none()
                    || s == Some(Size::Whole)
                    || matches!(s, Some(Size::AtMost(n)) if n > 1000),
                "{line}: {s:?}"
            );
        }
        assert_eq!(
            size("XRANGE s - + COUNT\0 100000"),
            Some(Size::AtMost(100_000))
        );
        assert_eq!(
            size("LMPOP 1 k LEFT COUNT\0 100000"),
            Some(Size::AtMost(100_000))
        );
        assert_eq!(size("SORT k GET # BY LIMIT GET 10"), Some(Size::Whole));
        assert_eq!(
            size("ZRANGE z 0 1 LIMIT 0 1 LIMIT 0 5000 BYSCORE"),
            Some(Size::AtMost(5000))
        );
        // LMPOP's COUNT may be given once: Redis refuses the second.
        assert_eq!(size("LMPOP 1 k LEFT COUNT 1 COUNT 100000"), None);
        // Extremes do not overflow.
        assert_eq!(
            size("LRANGE l -9223372036854775808 0"),
            Some(Size::AtMost(1))
        );
        assert_eq!(
            size("LRANGE l -9223372036854775808 -1"),
            Some(Size::AtMost(1 << 63))
        );
    }
}
