//! How many elements a read can return, from its arguments alone: the measure behind the
//! `max_range` and `deny_unbounded_reads` guards. A guard on the literal `LRANGE k 0 -1` lets
//! `LRANGE k 0 999999999`, `ZRANGE k 0 -1 REV` or `SRANDMEMBER k -1000000` through; bounding
//! the size of the range the command asks for catches every spelling.
//!
//! Computed only for the commands in [`COMMANDS`] (the guards are indexed by them), without
//! allocating: the arguments are read in place.

use super::line::CommandLine;
use crate::codec::parse_int;
use crate::commands::CommandSpec;

/// The commands a range guard is indexed by.
pub const COMMANDS: &[&str] = &[
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
pub enum Size {
    /// At most this many.
    AtMost(u64),
    /// As many as the collection holds: nothing in the arguments bounds it.
    Whole,
}

/// The size of the range `line` asks for; `None` when the command is not a range read or its
/// arguments are malformed (Redis refuses those itself).
pub fn read_size<L: CommandLine + ?Sized>(spec: &CommandSpec, line: &L) -> Option<Size> {
    let int = |i: usize| (i < line.argc()).then(|| parse_int(line.arg(i))).flatten();
    match spec.name {
        "lrange" | "zrevrange" => indices(int(2)?, int(3)?),
        "zrange" => zrange(line, 2),
        "zrangestore" => zrange(line, 3),
        "zrangebyscore" | "zrevrangebyscore" | "zrangebylex" | "zrevrangebylex" | "sort"
        | "sort_ro" => Some(limit(line)),
        "xrange"
        | "xrevrange"
        | "geosearch"
        | "geosearchstore"
        | "georadius"
        | "georadius_ro"
        | "georadiusbymember"
        | "georadiusbymember_ro" => Some(count_option(line).map_or(Size::Whole, Size::AtMost)),
        // A negative count returns that many elements, repeats allowed.
        "srandmember" | "hrandfield" | "zrandmember" => {
            Some(Size::AtMost(int(2).map_or(1, i64::unsigned_abs)))
        }
        "spop" | "lpop" | "rpop" | "zpopmin" | "zpopmax" => {
            Some(Size::AtMost(int(2).map_or(1, i64::unsigned_abs)))
        }
        "lmpop" | "blmpop" | "zmpop" | "bzmpop" => {
            Some(Size::AtMost(count_option(line).unwrap_or(1)))
        }
        "hgetall" | "hkeys" | "hvals" | "smembers" => Some(Size::Whole),
        _ => None,
    }
}

/// `start stop` as list or rank indices; negative ones count from the end, so a range with a
/// non-negative start and a negative stop reaches the end of any collection.
fn indices(start: i64, stop: i64) -> Option<Size> {
    let span = |a: i64, b: i64| Size::AtMost(u64::try_from(b - a + 1).unwrap_or(0));
    Some(match (start >= 0, stop >= 0) {
        (true, true) | (false, false) => span(start, stop),
        // A negative start is clamped to 0 by Redis: at most `stop + 1` elements.
        (false, true) => span(0, stop),
        (true, false) => Size::Whole,
    })
}

/// ZRANGE (its range from argument `from`): by index unless BYSCORE or BYLEX, whose ranges
/// are bounded only by LIMIT.
fn zrange<L: CommandLine + ?Sized>(line: &L, from: usize) -> Option<Size> {
    let by_value = (from + 2..line.argc()).any(|i| {
        let a = line.arg(i);
        a.eq_ignore_ascii_case(b"BYSCORE") || a.eq_ignore_ascii_case(b"BYLEX")
    });
    if by_value {
        return Some(limit(line));
    }
    let int = |i: usize| (i < line.argc()).then(|| parse_int(line.arg(i))).flatten();
    indices(int(from)?, int(from + 1)?)
}

/// `LIMIT offset count`: `count` elements; a negative count, or no LIMIT, is the whole range.
fn limit<L: CommandLine + ?Sized>(line: &L) -> Size {
    (2..line.argc().saturating_sub(2))
        .rev()
        .find(|&i| line.arg(i).eq_ignore_ascii_case(b"LIMIT"))
        .and_then(|i| parse_int(line.arg(i + 2)))
        .and_then(|n| u64::try_from(n).ok())
        .map_or(Size::Whole, Size::AtMost)
}

/// The value of a `COUNT n` option (the last one wins, as in Redis's parsers).
fn count_option<L: CommandLine + ?Sized>(line: &L) -> Option<u64> {
    (2..line.argc().saturating_sub(1))
        .rev()
        .find(|&i| line.arg(i).eq_ignore_ascii_case(b"COUNT"))
        .and_then(|i| parse_int(line.arg(i + 1)))
        .and_then(|n| u64::try_from(n).ok())
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
}
