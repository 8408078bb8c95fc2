//! What the keyspace statistics read off one command: each key's pattern, whether a write
//! sets a TTL, and the size of the value it writes.

/// The pattern a key counts under: its name up to the first run of digits or past its
/// `segments`-th `:`, whichever comes first, with `*` for the rest (`user:1234:profile` →
/// `user:*`, `session42` → `session*`, with 2 segments `cache:page:home` → `cache:page:*`).
/// A key with neither a digit nor a `:` has no pattern of its own (`(none)`), so a raw key
/// never becomes a pattern, nor a metric label.
pub(crate) fn pattern_of(key: &[u8], segments: usize) -> String {
    let mut seen = 0;
    for (i, b) in key.iter().enumerate() {
        if b.is_ascii_digit() {
            return with_star(&key[..i]);
        }
        if *b == b':' {
            seen += 1;
            if seen == segments {
                return with_star(&key[..=i]);
            }
        }
    }
    if seen > 0 {
        // Fewer segments than asked: up to the last `:`.
        let last = key.iter().rposition(|b| *b == b':').unwrap_or(0);
        return with_star(&key[..=last]);
    }
    NONE.to_string()
}

/// The pattern of keys without a digit or a `:`.
pub(crate) const NONE: &str = "(none)";

fn with_star(prefix: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(prefix).into_owned();
    s.push('*');
    s
}

/// Whether a write given as `args` (upper-cased name at 0) sets an expiry on its keys: the
/// SET family's EX/PX/EXAT/PXAT/KEEPTTL, SETEX/PSETEX, GETEX with a TTL, the EXPIRE family,
/// RESTORE with a TTL. Other writes (HSET, LPUSH, INCR…) leave the key's TTL as it was: a
/// key they create has none.
pub(crate) fn sets_ttl(name: &str, args: &[&[u8]]) -> bool {
    // Options read as Redis reads them (commands::grammar): `EX\0` is EX.
    let option = |getex: bool| {
        crate::commands::grammar::string_options(args, getex)
            .is_some_and(|o| o.expiry.is_some() || o.keepttl)
    };
    match name {
        "setex" | "psetex" | "expire" | "pexpire" | "expireat" | "pexpireat" => true,
        "set" => option(false),
        "getex" => option(true),
        "restore" => args.get(2).is_some_and(|ttl| *ttl != b"0"),
        _ => false,
    }
}

/// The bucket of a value of `size` bytes in the value-size histogram.
pub(crate) fn size_bucket(size: usize) -> usize {
    BUCKETS
        .iter()
        .position(|&limit| size <= limit)
        .unwrap_or(BUCKETS.len())
}

/// Upper bounds of the value-size histogram's buckets (bytes); a last bucket holds the rest.
pub(crate) const BUCKETS: [usize; 8] = [
    64,
    256,
    1024,
    4 * 1024,
    16 * 1024,
    64 * 1024,
    256 * 1024,
    1024 * 1024,
];

/// The buckets' names, the last one for everything larger.
pub(crate) const BUCKET_NAMES: [&str; 9] = [
    "<=64", "<=256", "<=1k", "<=4k", "<=16k", "<=64k", "<=256k", "<=1m", ">1m",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_stop_at_digits_or_segments() {
        assert_eq!(pattern_of(b"user:1234:profile", 1), "user:*");
        assert_eq!(pattern_of(b"session42", 1), "session*");
        assert_eq!(pattern_of(b"cache:page:home", 2), "cache:page:*");
        assert_eq!(pattern_of(b"cache:page", 3), "cache:*");
        assert_eq!(pattern_of(b"config", 1), NONE);
        assert_eq!(pattern_of(b"42", 1), "*");
    }

    #[test]
    fn writes_with_and_without_ttl() {
        assert!(sets_ttl("set", &[b"SET", b"k", b"v", b"ex", b"10"]));
        assert!(!sets_ttl("set", &[b"SET", b"k", b"v"]));
        assert!(!sets_ttl("set", &[b"SET", b"k", b"EX"]));
        assert!(sets_ttl("setex", &[b"SETEX", b"k", b"10", b"v"]));
        assert!(!sets_ttl("hset", &[b"HSET", b"k", b"f", b"v"]));
        assert_eq!(size_bucket(10), 0);
        assert_eq!(size_bucket(1000), 2);
        assert_eq!(size_bucket(10 << 20), 8);
    }
}
