//! Keys of two servers compared: what `backfill` and the mirror must leave behind.

use super::RedisServer;

/// Fills `redis` with one key of each type, some with TTLs, and `n` plain strings.
pub(crate) async fn fill(redis: &RedisServer, n: usize) {
    redis.direct(&["SET", "s:plain", "v"]).await;
    redis.direct(&["SET", "s:ttl", "v", "EX", "1000"]).await;
    redis.direct(&["HSET", "h", "f1", "a", "f2", "b"]).await;
    redis.direct(&["RPUSH", "l", "1", "2", "3"]).await;
    redis.direct(&["SADD", "set", "x", "y"]).await;
    redis.direct(&["ZADD", "z", "1", "one", "2", "two"]).await;
    redis.direct(&["XADD", "stream", "1-1", "k", "v"]).await;
    redis.direct(&["PEXPIRE", "h", "500000"]).await;
    for i in 0..n {
        redis
            .direct(&["SET", &format!("bulk:{i}"), &i.to_string()])
            .await;
    }
}

pub(crate) fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// A key's type and value, in an order that does not depend on the encoding (a restored set
/// may list its members in another order).
pub(crate) async fn value_of(redis: &RedisServer, key: &str) -> (String, Vec<String>) {
    let kind = text(&redis.direct(&["TYPE", key]).await);
    let read: &[&str] = match kind.trim() {
        "+string" => &["GET"],
        "+hash" => &["HGETALL"],
        "+list" => &["LRANGE", "_", "0", "-1"],
        "+set" => &["SMEMBERS"],
        "+zset" => &["ZRANGE", "_", "0", "-1", "WITHSCORES"],
        "+stream" => &["XRANGE", "_", "-", "+"],
        other => panic!("{key}: type {other}"),
    };
    let mut args: Vec<&str> = read.to_vec();
    if args.len() == 1 {
        args.push(key);
    } else {
        args[1] = key;
    }
    let reply = text(&redis.direct(&args).await);
    let mut lines: Vec<String> = reply.lines().map(str::to_string).collect();
    if matches!(kind.trim(), "+hash" | "+set") {
        lines.sort();
    }
    (kind, lines)
}

/// Every key of `from` is on `to` with the same value (read by type) and a TTL
/// within a few seconds of the source's (both count down), except those in `differ`.
pub(crate) async fn assert_same(from: &RedisServer, to: &RedisServer, differ: &[&str]) {
    let keys = text(&from.direct(&["KEYS", "*"]).await);
    let names: Vec<&str> = keys
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .collect();
    assert!(!names.is_empty());
    assert_eq!(
        from.direct(&["DBSIZE"]).await,
        to.direct(&["DBSIZE"]).await,
        "key counts"
    );
    for key in names {
        if differ.contains(&key) {
            continue;
        }
        assert_eq!(value_of(from, key).await, value_of(to, key).await, "{key}");
        let ttl = |r: Vec<u8>| -> i64 { text(&r)[1..].trim().parse().unwrap() };
        let (a, b) = (
            ttl(from.direct(&["PTTL", key]).await),
            ttl(to.direct(&["PTTL", key]).await),
        );
        if a == -1 {
            assert_eq!(b, -1, "{key} has no TTL on the source");
        } else {
            assert!((a - b).abs() < 5_000, "{key}: PTTL {a} there, {b} here");
        }
    }
}
