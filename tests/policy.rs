//! The shipped default policy, enforced through the proxy against a real Redis: refusals name
//! the rule and the better pattern, and nothing refused reaches the server.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{DEADLINE, Proxy, Raw, RedisServer, bulk, http_get, resp, resp_cmds, sample, show};

/// A proxy in front of `redis` running `policy/default.yaml` with its data-changing rules
/// enforced, as after the rollout the file describes.
async fn default_policy(redis: &RedisServer) -> Proxy {
    default_policy_edited(redis, "\nrules:\n", "\nrules:\n").await
}

/// [`default_policy`] with `from` replaced by `to` in the file's text (which must contain it).
async fn default_policy_edited(redis: &RedisServer, from: &str, to: &str) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let text = common::default_policy_enforced();
    assert!(text.contains(from), "{from:?} not in default.yaml");
    let mut config = redis_policy_proxy::setup::from_yaml(&text.replace(from, to), &path)
        .expect("edited default policy loads");
    config.set_upstream(redis.addr());
    Proxy::start(config).await
}

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dangerous_commands_are_refused_with_the_rule_and_the_better_pattern() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        text(&c.call(&["KEYS", "*"]).await),
        "-NOPERM policy deny-keys: KEYS is not allowed; KEYS blocks the server; use SCAN (cursor) instead\r\n"
    );
    assert_eq!(c.call(&["SET", "keep", "1"]).await, b"+OK\r\n");
    for cmd in [&["FLUSHALL"][..], &["FLUSHALL", "ASYNC"], &["flushdb"]] {
        let reply = text(&c.call(cmd).await);
        assert!(reply.starts_with("-NOPERM policy deny-flush: "), "{reply}");
    }
    let reply = text(&c.call(&["CONFIG", "SET", "maxmemory", "1"]).await);
    assert!(
        reply.starts_with("-NOPERM policy deny-admin: CONFIG SET is not allowed"),
        "{reply}"
    );
    // Reads of the configuration stay allowed.
    assert!(
        c.call(&["CONFIG", "GET", "maxmemory"])
            .await
            .starts_with(b"*2\r\n")
    );
    // Nothing refused reached Redis: the key survived and maxmemory is unchanged.
    assert_eq!(redis.direct(&["GET", "keep"]).await, b"$1\r\n1\r\n");
    assert_eq!(
        redis.direct(&["CONFIG", "GET", "maxmemory"]).await,
        b"*2\r\n$9\r\nmaxmemory\r\n$1\r\n0\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_and_size_limits() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let reply = text(&c.call(&["SCAN", "0", "COUNT", "5000"]).await);
    assert!(
        reply.starts_with("-ERR policy scan-count: SCAN COUNT 5000 is above 1000"),
        "{reply}"
    );
    assert!(
        c.call(&["SCAN", "0", "COUNT", "100"])
            .await
            .starts_with(b"*2\r\n")
    );

    let big = "x".repeat(102_401);
    let reply = text(&c.call(&["SET", "blob", &big]).await);
    assert!(reply.starts_with("-ERR policy max-value-size: SET value of 102401 bytes is above 102400; store a reference"), "{reply}");
    assert_eq!(redis.direct(&["EXISTS", "blob"]).await, b":0\r\n");
    let fits = "x".repeat(102_400);
    assert_eq!(c.call(&["SET", "blob", &fits]).await, b"+OK\r\n");

    let mut mget = vec!["MGET".to_string()];
    mget.extend((0..1001).map(|i| format!("k{i}")));
    let reply = text(&c.call(&mget).await);
    assert!(
        reply.starts_with("-ERR policy max-keys: MGET names 1001 keys, above 1000"),
        "{reply}"
    );

    // Audit mode: the whole-collection read goes through.
    assert_eq!(c.call(&["RPUSH", "l", "a", "b"]).await, b":2\r\n");
    assert_eq!(
        c.call(&["LRANGE", "l", "0", "-1"]).await,
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    );
}

/// `max_value_bytes` (102400 in the default policy) holds for writes at an offset, whose
/// resulting size the arguments give, and for a script's values; APPEND is refused when its
/// chunk alone is above the cap (what it appends to is Redis's to know: policy/README.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_cannot_grow_past_the_cap_by_offset_or_through_a_script() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let refusals: &[(&[&str], &str)] = &[
        (
            &["SETRANGE", "sr", "102400", "x"],
            "SETRANGE would grow the value to 102401 bytes",
        ),
        (
            &["SETRANGE", "sr", "536870000", "x"],
            "SETRANGE would grow the value",
        ),
        (
            &["SETBIT", "sb", "819200", "1"],
            "SETBIT would grow the value to 102401 bytes",
        ),
        (
            &["BITFIELD", "bf", "SET", "u8", "#102400", "1"],
            "BITFIELD would grow the value",
        ),
    ];
    for (cmd, want) in refusals {
        let reply = text(&c.call(cmd).await);
        assert!(
            reply.starts_with(&format!("-ERR policy max-value-size: {want}")),
            "{cmd:?}: {reply}"
        );
    }
    assert_eq!(redis.direct(&["EXISTS", "sr", "sb", "bf"]).await, b":0\r\n");
    // Within the cap they work as in Redis.
    assert_eq!(
        c.call(&["SETRANGE", "sr", "102399", "x"]).await,
        b":102400\r\n"
    );
    assert_eq!(c.call(&["SETBIT", "sb", "819199", "1"]).await, b":0\r\n");
    // A script cannot store a value the cap refuses to a SET.
    let big = "x".repeat(102_401);
    let set = "return redis.call('SET', KEYS[1], ARGV[1])";
    let reply = text(&c.call(&["EVAL", set, "1", "scripted", &big]).await);
    assert!(
        reply.starts_with("-ERR policy max-value-size: EVAL value of 102401 bytes"),
        "{reply}"
    );
    assert_eq!(redis.direct(&["EXISTS", "scripted"]).await, b":0\r\n");
    // APPEND: a chunk above the cap is refused; appending small chunks is best effort.
    let reply = text(&c.call(&["APPEND", "ap", &big]).await);
    assert!(
        reply.starts_with("-ERR policy max-value-size: APPEND value of 102401"),
        "{reply}"
    );
    assert_eq!(c.call(&["APPEND", "ap", "xy"]).await, b":2\r\n");
}

/// Range guards measure what a read can return, so no spelling of a whole-collection or huge
/// read gets through: the literal `LRANGE k 0 -1` was the only one caught before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_guards_catch_every_spelling_of_a_huge_read() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: ranges\n    max_range: 1000\n    message: page your reads\n",
        redis.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("r.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    redis.direct(&["RPUSH", "l", "a", "b"]).await;
    redis.direct(&["ZADD", "z", "1", "a", "2", "b"]).await;
    redis.direct(&["SADD", "s", "a"]).await;
    redis.direct(&["HSET", "h", "f", "v"]).await;
    let whole: &[&[&str]] = &[
        &["LRANGE", "l", "0", "-1"],
        &["ZRANGE", "z", "0", "-1"],
        &["ZRANGE", "z", "0", "-1", "REV"],
        &["ZRANGE", "z", "-inf", "+inf", "BYSCORE"],
        &["ZRANGE", "z", "-", "+", "BYLEX"],
        &["ZREVRANGE", "z", "0", "-1"],
        &["ZRANGEBYSCORE", "z", "-inf", "+inf"],
        &["HGETALL", "h"],
        &["SMEMBERS", "s"],
    ];
    for cmd in whole {
        let reply = text(&c.call(cmd).await);
        assert!(
            reply.starts_with("-ERR policy ranges: ") && reply.contains("reads a whole collection"),
            "{cmd:?}: {reply}"
        );
    }
    let huge: &[&[&str]] = &[
        &["LRANGE", "l", "0", "999999999"],
        &["SRANDMEMBER", "s", "-1000000"],
        &["HRANDFIELD", "h", "5000"],
        &["ZRANDMEMBER", "z", "1001"],
        &[
            "ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "0", "5000",
        ],
    ];
    for cmd in huge {
        let reply = text(&c.call(cmd).await);
        assert!(
            reply.starts_with("-ERR policy ranges: ")
                && reply.contains("elements, above 1000; page your reads"),
            "{cmd:?}: {reply}"
        );
    }
    // Paged reads are answered by Redis as usual.
    assert_eq!(
        c.call(&["LRANGE", "l", "0", "999"]).await,
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    );
    assert_eq!(
        c.call(&["ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "0", "10"])
            .await,
        b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    );
    assert_eq!(
        c.call(&["SRANDMEMBER", "s", "-3"]).await,
        b"*3\r\n$1\r\na\r\n$1\r\na\r\n$1\r\na\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_inside_multi_aborts_the_transaction() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    c.send(b"MULTI\r\nSET t 1\r\nKEYS *\r\nSET u 2\r\nEXEC\r\nGET t\r\n")
        .await;
    let got = c.collect_frames(6, DEADLINE).await.frames;
    assert_eq!(got[0], b"+OK\r\n");
    assert_eq!(got[1], b"+QUEUED\r\n");
    assert!(got[2].starts_with(b"-NOPERM policy deny-keys"));
    assert_eq!(got[3], b"+QUEUED\r\n");
    assert_eq!(
        got[4],
        b"-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    assert_eq!(got[5], b"$-1\r\n");
    assert_eq!(redis.direct(&["EXISTS", "t", "u"]).await, b":0\r\n");
    // The connection is usable for a clean transaction afterwards.
    c.send(b"MULTI\r\nSET t 1\r\nEXEC\r\n").await;
    assert_eq!(
        c.collect_frames(3, DEADLINE).await.joined(),
        b"+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_per_connection_refuses_with_a_retry_hint() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: ratelimit-default\n    rate_limit: {{requests: 5, window_ms: 60000}}\n    message: slow down\n",
        redis.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("rl.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    // `Proxy::start` probes readiness on its own connections; this one starts with a full budget.
    let mut c = Raw::connect(proxy.addr).await;
    for i in 0..5 {
        assert_eq!(
            c.call(&["INCR", "rl:n"]).await,
            format!(":{}\r\n", i + 1).as_bytes()
        );
    }
    let reply = text(&c.call(&["INCR", "rl:n"]).await);
    assert!(
        reply.starts_with("-ERR policy ratelimit-default: 5 requests per 60s exceeded; retry in "),
        "{reply}"
    );
    assert!(reply.ends_with(" ms; slow down\r\n"), "{reply}");
    // The refused command never reached Redis; another connection has its own budget.
    assert_eq!(redis.direct(&["GET", "rl:n"]).await, b"$1\r\n5\r\n");
    let mut other = Raw::connect(proxy.addr).await;
    assert_eq!(other.call(&["INCR", "rl:n"]).await, b":6\r\n");
}

/// A command that waits for the replies before it (a pipeline's MULTI, BLPOP or RESET after
/// writes in flight: they change connections) is judged once: it spends one request of the
/// rate budget, as Redis would count one command (before, such a command was judged again
/// when it resumed and charged twice, so a client at its limit was refused early).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_waits_for_earlier_replies_spends_one_request() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: rl\n    rate_limit: {{requests: 8, window_ms: 600000}}\n",
        redis.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("rl.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    // Eight commands, three of which wait for the writes before them.
    c.send(&resp_cmds(&[
        "SET a 1",
        "MULTI",
        "INCR a",
        "EXEC",
        "SET b 2",
        "BLPOP nolist 0.01",
        "SET c 3",
        "RESET",
    ]))
    .await;
    let replies: Vec<String> = c.read_frames(8).await.iter().map(|r| text(r)).collect();
    assert_eq!(
        replies,
        [
            "+OK\r\n",
            "+OK\r\n",
            "+QUEUED\r\n",
            "*1\r\n:2\r\n",
            "+OK\r\n",
            "*-1\r\n",
            "+OK\r\n",
            "+RESET\r\n"
        ]
    );
    // The budget is spent now: the ninth is refused.
    let refused = text(&c.call(&["GET", "a"]).await);
    assert!(
        refused.starts_with("-ERR policy rl: 8 requests"),
        "{refused}"
    );
}

/// What a rate limit counts, as policy/README.md says: every command the policy lets through
/// its own rules, the proxy's own answers included (CLIENT ID), and commands a size limit
/// refuses (size limits run after rate limits); not the commands a deny rule refuses, nor the
/// ones it refuses itself. The window (10 minutes) is far longer than the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_rate_limit_counts_what_the_policy_readme_says() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: deny-keys\n    deny: [KEYS]\n  - id: small\n    max_value_bytes: 10\n  - id: rl\n    rate_limit: {{requests: 4, window_ms: 600000}}\n",
        redis.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("rl.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    for _ in 0..3 {
        let reply = text(&c.call(&["KEYS", "*"]).await);
        assert!(reply.starts_with("-NOPERM policy deny-keys: "), "{reply}");
    }
    for _ in 0..2 {
        let reply = text(&c.call(&["SET", "k", "more than ten bytes"]).await);
        assert!(reply.starts_with("-ERR policy small: "), "{reply}");
    }
    assert!(c.call(&["CLIENT", "ID"]).await.starts_with(b":"));
    // Two size refusals and CLIENT ID spent 3 of the 4; the 3 KEYS nothing.
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    let reply = text(&c.call(&["PING"]).await);
    assert!(
        reply.starts_with("-ERR policy rl: 4 requests per 600s exceeded; retry in "),
        "{reply}"
    );
    // A refusal by the limit spends nothing either: still refused, still 4 counted.
    let reply = text(&c.call(&["PING"]).await);
    assert!(reply.starts_with("-ERR policy rl: "), "{reply}");
}

/// The Redis-counted limit (`backend: redis`) runs after every other rule and counts only
/// what is forwarded to Redis: refusals and the proxy's own answers leave its count alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_rate_limit_counts_only_what_reaches_redis() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: deny-keys\n    deny: [KEYS]\n  - id: small\n    max_value_bytes: 10\n  - id: shared\n    rate_limit: {{requests: 100, window_ms: 600000, per: address, backend: redis}}\n",
        redis.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("rl.yaml")).unwrap();
    // No readiness probe: it would spend budget.
    let proxy = Proxy::spawn(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    let key = "rpp:rl:shared:127.0.0.1";
    let direct = &redis;
    let count = move || async move {
        let h = text(&direct.direct(&["HGET", key, "c"]).await);
        h.lines().nth(1).unwrap_or("0").parse::<u32>().unwrap_or(0)
    };
    // The limiter fails open until its control connection is up: PING until it counts.
    let until = std::time::Instant::now() + DEADLINE;
    while redis.direct(&["EXISTS", key]).await != b":1\r\n" {
        assert!(
            std::time::Instant::now() < until,
            "the limiter never counted"
        );
        assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    }
    let before = count().await;
    let reply = text(&c.call(&["KEYS", "*"]).await);
    assert!(reply.starts_with("-NOPERM policy deny-keys: "), "{reply}");
    let reply = text(&c.call(&["SET", "k", "more than ten bytes"]).await);
    assert!(reply.starts_with("-ERR policy small: "), "{reply}");
    assert!(c.call(&["CLIENT", "ID"]).await.starts_with(b":"));
    assert_eq!(count().await, before, "refusals and CLIENT ID were counted");
    assert_eq!(c.call(&["PING"]).await, b"+PONG\r\n");
    assert_eq!(count().await, before + 1);
    // A command that waits for the writes before it (BLPOP changes connections) counts
    // once: four forwarded, four counted (RESET is the proxy's to answer; BLPOP was counted
    // twice before).
    c.send(&resp_cmds(&[
        "SET a 1",
        "BLPOP nolist 0.01",
        "SET b 2",
        "RESET",
        "PING",
    ]))
    .await;
    assert_eq!(c.read_frames(5).await.len(), 5);
    assert_eq!(count().await, before + 5);
    let ttl = text(&redis.direct(&["PTTL", key]).await);
    let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(ms > 0 && ms <= 1_200_000, "two windows at most: {ttl}");
}

/// `PTTL` of `key` read directly from Redis.
async fn pttl(redis: &RedisServer, key: &str) -> i64 {
    let reply = redis.direct(&["PTTL", key]).await;
    let text = text(&reply);
    text.trim_start_matches(':').trim_end().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_family_leaves_a_ttl_on_the_server() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let hour = 3_600_000;
    // (command, key, reply the client must see unchanged)
    let cases: &[(&[&str], &str, &[u8])] = &[
        (&["SET", "s", "v"], "s", b"+OK\r\n"),
        (&["SETNX", "nx", "v"], "nx", b":1\r\n"),
        (&["MSET", "m1", "a", "m2", "b"], "m2", b"+OK\r\n"),
        (&["GETSET", "gs", "v"], "gs", b"$-1\r\n"),
        (&["HSET", "h", "f", "v"], "h", b":1\r\n"),
        (&["HSETNX", "hn", "f", "v"], "hn", b":1\r\n"),
        (&["SADD", "set", "a"], "set", b":1\r\n"),
        (&["ZADD", "z", "1", "a"], "z", b":1\r\n"),
        (&["LPUSH", "l", "a"], "l", b":1\r\n"),
        (&["RPUSH", "r", "a"], "r", b":1\r\n"),
        (&["PFADD", "hll", "a"], "hll", b":1\r\n"),
        (&["INCR", "counter"], "counter", b":1\r\n"),
        (&["INCRBY", "counter2", "5"], "counter2", b":5\r\n"),
        (&["APPEND", "ap", "x"], "ap", b":1\r\n"),
        (&["COPY", "s", "copy"], "copy", b":1\r\n"),
        (&["SUNIONSTORE", "dest", "set"], "dest", b":1\r\n"),
    ];
    for (cmd, key, reply) in cases {
        assert_eq!(c.call(cmd).await, *reply, "{cmd:?}");
        let ttl = pttl(&redis, key).await;
        assert!(
            ttl > hour - 60_000 && ttl <= hour,
            "{cmd:?}: PTTL {key} = {ttl}"
        );
    }
    let id = c.call(&["XADD", "stream", "*", "f", "v"]).await;
    assert!(id.starts_with(b"$"), "{}", text(&id));
    assert!(pttl(&redis, "stream").await > 0);
    // Prefixes: sessions live a day, cache entries 15 minutes.
    c.call(&["HSET", "session:1", "user", "42"]).await;
    assert!(pttl(&redis, "session:1").await > 86_400_000 - 60_000);
    c.call(&["SET", "cache:page", "html"]).await;
    let ttl = pttl(&redis, "cache:page").await;
    assert!(ttl > 0 && ttl <= 900_000, "{ttl}");
    // A TTL the application chose is kept; one above a week is cut.
    c.call(&["SET", "own", "v", "EX", "60"]).await;
    assert!(pttl(&redis, "own").await <= 60_000);
    c.call(&["EXPIRE", "h", "30"]).await;
    c.call(&["HSET", "h", "g", "w"]).await;
    assert!(
        pttl(&redis, "h").await <= 30_000,
        "PEXPIRE NX must not replace a chosen TTL"
    );
    assert_eq!(
        c.call(&["SETEX", "long", "99999999", "v"]).await,
        b"+OK\r\n"
    );
    assert!(pttl(&redis, "long").await <= 604_800_000);
    assert_eq!(c.call(&["EXPIRE", "own", "99999999"]).await, b":1\r\n");
    assert!(pttl(&redis, "own").await <= 604_800_000);
    // PERSIST is refused and the key keeps its TTL.
    let reply = text(&c.call(&["PERSIST", "own"]).await);
    assert!(
        reply.starts_with("-NOPERM policy ttl-default: PERSIST would leave"),
        "{reply}"
    );
    assert!(pttl(&redis, "own").await > 0);
}

/// Keys written before the proxy arrived, without a TTL.
async fn seed_persistent_keys(redis: &RedisServer) {
    redis
        .direct(&["HSET", "config:features", "dark", "on"])
        .await;
    redis.direct(&["SET", "counter", "5"]).await;
    redis.direct(&["SET", "config:name", "shop"]).await;
    redis.direct(&["SADD", "members", "a"]).await;
    redis.direct(&["RPUSH", "jobs", "j1"]).await;
    redis.direct(&["SET", "old", "x"]).await;
    redis.direct(&["SET", "mset:old", "x"]).await;
}

/// Writes an application sends to keys that exist and keys that do not.
async fn write_through(c: &mut Raw) {
    let writes: &[(&[&str], &[u8])] = &[
        (&["HSET", "config:features", "beta", "off"], b":1\r\n"),
        (&["INCR", "counter"], b":6\r\n"),
        (&["SET", "config:name", "store"], b"+OK\r\n"),
        (&["SADD", "members", "b"], b":1\r\n"),
        (&["GETSET", "old", "y"], b"$1\r\nx\r\n"),
        (
            &[
                "EVAL",
                "return redis.call('RPUSH', KEYS[1], ARGV[1])",
                "1",
                "jobs",
                "j2",
            ],
            b":2\r\n",
        ),
        (&["HSET", "fresh:hash", "f", "v"], b":1\r\n"),
        (&["SET", "fresh:string", "v"], b"+OK\r\n"),
        (&["INCR", "fresh:counter"], b":1\r\n"),
        (&["MSET", "mset:old", "y", "mset:new", "z"], b"+OK\r\n"),
    ];
    for (cmd, reply) in writes {
        assert_eq!(c.call(cmd).await, *reply, "{cmd:?}");
    }
}

/// In front of a Redis with persistent data, the default policy (`keys: created`) gives a TTL
/// to the keys writes create and leaves the keys that existed without one persistent, inside
/// MULTI too; `keys: written` gives every key it writes a TTL, as its comment warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_persistent_keys_stay_persistent_unless_the_policy_says_written() {
    let redis = RedisServer::start();
    seed_persistent_keys(&redis).await;
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    write_through(&mut c).await;
    for key in [
        "config:features",
        "counter",
        "config:name",
        "members",
        "old",
        "jobs",
    ] {
        assert_eq!(pttl(&redis, key).await, -1, "{key} got a TTL");
    }
    for key in ["fresh:hash", "fresh:string", "fresh:counter", "mset:new"] {
        let ttl = pttl(&redis, key).await;
        assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{key}: {ttl}");
    }
    // MSET makes what it writes persistent in Redis, so the rule cannot tell an old key from
    // a new one: it gets the TTL (policy/README.md).
    assert!(pttl(&redis, "mset:old").await > 0);
    // A key that had a TTL keeps it across a SET; inside MULTI the checks are queued too, and
    // EXEC shows the client's results only.
    c.call(&["SET", "short", "v", "EX", "100"]).await;
    c.send(b"MULTI\r\nSET short w\r\nHSET config:features x 1\r\nSADD fresh:set a\r\nEXEC\r\n")
        .await;
    let got = c.collect_frames(5, DEADLINE).await.frames;
    assert_eq!(got[4], b"*3\r\n+OK\r\n:1\r\n:1\r\n");
    assert!(pttl(&redis, "short").await <= 100_000);
    assert_eq!(pttl(&redis, "config:features").await, -1);
    assert!(pttl(&redis, "fresh:set").await > 3_500_000);
    // No marker is left behind: the keyspace holds the application's keys only.
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":13\r\n");

    // `keys: written`: every key written without a TTL gets one, existing ones included.
    let redis = RedisServer::start();
    seed_persistent_keys(&redis).await;
    let proxy = default_policy_edited(&redis, "keys: created", "keys: written").await;
    let mut c = Raw::connect(proxy.addr).await;
    write_through(&mut c).await;
    for key in [
        "config:features",
        "counter",
        "config:name",
        "members",
        "old",
        "jobs",
    ] {
        assert!(pttl(&redis, key).await > 0, "{key} has no TTL");
    }
}

/// Unix time in seconds, as Redis reads it for EXAT and EXPIREAT.
fn unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The TTL rule applies to the keys a script declares, as policy/README.md says: a script that
/// SETs its key without a TTL leaves one with the key's TTL; a read-only script adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_declared_keys_get_the_ttl_rule() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let set = "return redis.call('SET', KEYS[1], ARGV[1])";
    assert_eq!(
        c.call(&["EVAL", set, "1", "scripted", "v"]).await,
        b"+OK\r\n"
    );
    let ttl = pttl(&redis, "scripted").await;
    assert!(ttl > 3_500_000 && ttl <= 3_600_000, "PTTL scripted = {ttl}");
    // EVALSHA of the same script, on a session key: the prefix's TTL.
    let sha = text(&c.call(&["SCRIPT", "LOAD", set]).await);
    let sha = sha.lines().nth(1).unwrap().to_string();
    assert_eq!(
        c.call(&["EVALSHA", &sha, "1", "session:s", "v"]).await,
        b"+OK\r\n"
    );
    assert!(pttl(&redis, "session:s").await > 86_000_000);
    // FCALL of a function library (loaded directly: FUNCTION LOAD is an operator's job).
    let lib = "#!lua name=rpp\nredis.register_function('put', function(keys, args) return redis.call('SET', keys[1], args[1]) end)";
    redis.direct(&["FUNCTION", "LOAD", lib]).await;
    assert_eq!(
        c.call(&["FCALL", "put", "1", "fn:key", "v"]).await,
        b"+OK\r\n"
    );
    assert!(pttl(&redis, "fn:key").await > 3_500_000);
    // A read-only script adds nothing (and an existing key keeps no TTL it never had).
    redis.direct(&["SET", "persistent", "v"]).await;
    let get = "return redis.call('GET', KEYS[1])";
    assert_eq!(
        c.call(&["EVAL_RO", get, "1", "persistent"]).await,
        b"$1\r\nv\r\n"
    );
    assert_eq!(pttl(&redis, "persistent").await, -1);
}

/// Every TTL-setting and TTL-removing form of Redis 7's command table keeps the rule: none
/// leaves a key it writes without a TTL, none sets one above `max` (7 days).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ttl_variant_escapes_the_rule_or_its_maximum() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let week: i64 = 604_800_000;
    let within_max = |ttl: i64| ttl > week - 60_000 && ttl <= week;
    let month_s = (unix_s() + 30 * 86_400).to_string();
    let month_ms = ((unix_s() + 30 * 86_400) * 1000).to_string();

    // KEEPTTL on a new key: no TTL to keep, so the key's own.
    assert_eq!(c.call(&["SET", "kt", "v", "KEEPTTL"]).await, b"+OK\r\n");
    let ttl = pttl(&redis, "kt").await;
    assert!(
        ttl > 3_500_000 && ttl <= 3_600_000,
        "KEEPTTL on a new key: {ttl}"
    );
    // KEEPTTL on a key with a TTL keeps exactly that TTL.
    c.call(&["SET", "kt2", "v", "EX", "100"]).await;
    c.call(&["SET", "kt2", "w", "KEEPTTL"]).await;
    assert!(pttl(&redis, "kt2").await <= 100_000);
    // A SET without expiry on an existing key (which Redis would make persistent) gets one.
    c.call(&["SET", "over", "v", "EX", "100"]).await;
    assert_eq!(c.call(&["SET", "over", "w"]).await, b"+OK\r\n");
    assert!(pttl(&redis, "over").await > 0);
    assert_eq!(c.call(&["GETSET", "over", "x"]).await, b"$1\r\nw\r\n");
    assert!(pttl(&redis, "over").await > 0);

    // Absolute expiries a month away are cut to the week, with the reply Redis gives.
    assert_eq!(
        c.call(&["SET", "exat", "v", "EXAT", &month_s]).await,
        b"+OK\r\n"
    );
    assert!(within_max(pttl(&redis, "exat").await), "SET EXAT");
    assert_eq!(
        c.call(&["SET", "pxat", "v", "PXAT", &month_ms, "GET"])
            .await,
        b"$-1\r\n"
    );
    assert!(within_max(pttl(&redis, "pxat").await), "SET PXAT");
    assert_eq!(c.call(&["EXPIREAT", "exat", &month_s]).await, b":1\r\n");
    assert!(within_max(pttl(&redis, "exat").await), "EXPIREAT");
    assert_eq!(c.call(&["PEXPIREAT", "pxat", &month_ms]).await, b":1\r\n");
    assert!(within_max(pttl(&redis, "pxat").await), "PEXPIREAT");
    assert_eq!(
        c.call(&["GETEX", "exat", "EXAT", &month_s]).await,
        b"$1\r\nv\r\n"
    );
    assert!(within_max(pttl(&redis, "exat").await), "GETEX EXAT");
    assert_eq!(
        c.call(&["GETEX", "pxat", "PXAT", &month_ms]).await,
        b"$1\r\nv\r\n"
    );
    assert!(within_max(pttl(&redis, "pxat").await), "GETEX PXAT");
    // An absolute expiry within the week is kept as sent.
    let soon = (unix_s() + 3600).to_string();
    c.call(&["EXPIREAT", "exat", &soon]).await;
    assert!(pttl(&redis, "exat").await <= 3_600_000);

    // The TTL-removing forms are refused; the key keeps its TTL.
    for cmd in [&["PERSIST", "exat"][..], &["GETEX", "exat", "PERSIST"]] {
        let reply = text(&c.call(cmd).await);
        assert!(
            reply.starts_with("-NOPERM policy ttl-default: "),
            "{cmd:?}: {reply}"
        );
    }
    assert!(pttl(&redis, "exat").await > 0);

    // RESTORE: TTL 0 would restore a persistent key; a month (relative or ABSTTL) is cut.
    redis.direct(&["SET", "src", "payload"]).await;
    let dump = redis.direct(&["DUMP", "src"]).await;
    // The DUMP payload is binary: send it as raw bytes.
    let payload = &dump[dump.iter().position(|&b| b == b'\n').unwrap() + 1..dump.len() - 2];
    let restore = |key: &str, ttl: &str, extra: &[&str]| {
        let mut args: Vec<Vec<u8>> = vec![
            b"RESTORE".to_vec(),
            key.into(),
            ttl.into(),
            payload.to_vec(),
        ];
        args.extend(extra.iter().map(|a| a.as_bytes().to_vec()));
        common::resp(&args)
    };
    for (key, ttl, extra, expect_week) in [
        ("r0", "0", &[][..], false),
        ("r1", "2592000000", &[][..], true),
        ("r2", month_ms.as_str(), &["ABSTTL"][..], true),
    ] {
        c.send(&restore(key, ttl, extra)).await;
        assert_eq!(
            c.collect_frames(1, DEADLINE).await.joined(),
            b"+OK\r\n",
            "RESTORE {key}"
        );
        let ttl = pttl(&redis, key).await;
        if expect_week {
            assert!(within_max(ttl), "RESTORE {key}: {ttl}");
        } else {
            assert!(ttl > 3_500_000 && ttl <= 3_600_000, "RESTORE {key}: {ttl}");
        }
    }
    assert_eq!(redis.direct(&["GET", "r2"]).await, b"$7\r\npayload\r\n");

    // COPY into another database leaves this database's key of the same name alone.
    redis.direct(&["SET", "other", "mine"]).await;
    c.call(&["SET", "copied", "v"]).await;
    assert_eq!(
        c.call(&["COPY", "copied", "other", "DB", "1"]).await,
        b":1\r\n"
    );
    assert_eq!(pttl(&redis, "other").await, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_keep_their_own_ttl_and_release_with_lua() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        c.call(&["SET", "lock:job", "token", "NX", "PX", "5000"])
            .await,
        b"+OK\r\n"
    );
    let ttl = pttl(&redis, "lock:job").await;
    assert!(ttl > 0 && ttl <= 5000, "{ttl}");
    assert_eq!(
        c.call(&["SET", "lock:job", "other", "NX", "PX", "5000"])
            .await,
        b"$-1\r\n"
    );
    let release = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
    assert_eq!(
        c.call(&["EVAL", release, "1", "lock:job", "token"]).await,
        b":1\r\n"
    );
    assert_eq!(redis.direct(&["EXISTS", "lock:job"]).await, b":0\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_added_inside_multi_are_part_of_the_transaction() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    c.send(b"MULTI\r\nHSET session:7 a 1\r\nSET plain v\r\nSADD tags x y\r\nEXEC\r\n")
        .await;
    let got = c.collect_frames(5, DEADLINE).await.frames;
    assert_eq!(got[0], b"+OK\r\n");
    assert_eq!(
        &got[1..4],
        &[
            b"+QUEUED\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec(),
            b"+QUEUED\r\n".to_vec()
        ]
    );
    // EXEC shows the client's three results only, not the hidden PEXPIREs.
    assert_eq!(got[4], b"*3\r\n:1\r\n+OK\r\n:2\r\n");
    assert!(pttl(&redis, "session:7").await > 86_400_000 - 60_000);
    assert!(pttl(&redis, "plain").await > 0);
    assert!(pttl(&redis, "tags").await > 0);
    // A WATCH conflict still answers nil, untouched.
    c.send(b"WATCH w\r\n").await;
    assert_eq!(c.collect_frames(1, DEADLINE).await.joined(), b"+OK\r\n");
    redis.direct(&["SET", "w", "changed"]).await;
    c.send(b"MULTI\r\nHSET session:8 a 1\r\nEXEC\r\n").await;
    assert_eq!(
        c.collect_frames(3, DEADLINE).await.joined(),
        b"+OK\r\n+QUEUED\r\n*-1\r\n"
    );
    assert_eq!(redis.direct(&["EXISTS", "session:8"]).await, b":0\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_patterns_work_unchanged_under_the_default_policy() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    // Cache-aside with SETEX.
    assert_eq!(c.call(&["GET", "cache:user:1"]).await, b"$-1\r\n");
    assert_eq!(
        c.call(&["SETEX", "cache:user:1", "300", "{}"]).await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["GET", "cache:user:1"]).await, b"$2\r\n{}\r\n");
    // Sessions in hashes with EXPIRE.
    assert_eq!(
        c.call(&["HSET", "session:abc", "user", "1", "role", "admin"])
            .await,
        b":2\r\n"
    );
    assert_eq!(c.call(&["EXPIRE", "session:abc", "1800"]).await, b":1\r\n");
    assert!(pttl(&redis, "session:abc").await <= 1_800_000);
    // A sliding-window rate limit in Lua, a stream with a consumer group, pub/sub.
    common::guide_patterns(&mut c, proxy.addr, "7.0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_mixing_rewritten_and_plain_commands_keep_their_replies_in_order() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    c.send(b"SET a 1\r\nGET a\r\nHSET h f v\r\nHGET h f\r\nINCR n\r\nMSET x 1 y 2\r\nMGET x y\r\n")
        .await;
    assert_eq!(
        c.collect_frames(7, DEADLINE).await.joined(),
        b"+OK\r\n$1\r\n1\r\n:1\r\n$1\r\nv\r\n:1\r\n+OK\r\n*2\r\n$1\r\n1\r\n$1\r\n2\r\n"
    );
    for key in ["a", "h", "n", "x", "y"] {
        assert!(pttl(&redis, key).await > 0, "{key} has no TTL");
    }
    // A transaction mixing plain reads and writes with hidden PEXPIREs.
    c.send(b"MULTI\r\nGET a\r\nHSET h2 f v\r\nGET a\r\nLPUSH q 1 2\r\nEXEC\r\n")
        .await;
    let got = c.collect_frames(6, DEADLINE).await.frames;
    assert_eq!(got[5], b"*4\r\n$1\r\n1\r\n:1\r\n$1\r\n1\r\n:2\r\n");
    assert!(pttl(&redis, "h2").await > 0 && pttl(&redis, "q").await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_pipeline_of_sets_gets_its_ttls_appended_in_place() {
    // The session appends `PX <ttl>` to SET frames while copying them into the upstream batch
    // (no re-encoding): a pipeline mixing rewritten, kept, inline and multibulk SETs with reads
    // must reach Redis intact and answer in order.
    // `keys: written` is the mode whose SET gets `PX` appended in place.
    let redis = RedisServer::start();
    let proxy = default_policy_edited(&redis, "keys: created", "keys: written").await;
    let mut c = Raw::connect(proxy.addr).await;
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for i in 0..300 {
        match i % 4 {
            0 => input.extend(resp(&[
                b"SET".to_vec(),
                format!("k:{i}").into(),
                vec![b'x'; i],
            ])),
            1 => input.extend(format!("SET session:{i} v{i}\r\n").as_bytes()),
            2 => input.extend(resp(&["SET", &format!("lock:{i}"), "v", "NX"])),
            _ => input.extend(resp(&["SET", &format!("c:{i}"), "v", "EX", "60"])),
        }
        expected.extend_from_slice(b"+OK\r\n");
        input.extend(resp(&["GET", &format!("session:{}", i - i % 4 + 1)]));
        if i % 4 == 0 {
            expected.extend_from_slice(b"$-1\r\n");
        } else {
            let v = format!("v{}", i - i % 4 + 1);
            expected.extend(bulk(v.as_bytes()));
        }
    }
    c.send(&input).await;
    let got = c.collect_frames(600, DEADLINE).await.joined();
    assert_eq!(show(&got), show(&expected));
    for i in (0..300).step_by(4) {
        let ttl = pttl(&redis, &format!("k:{i}")).await;
        assert!(ttl > 3_500_000 && ttl <= 3_600_000, "k:{i}: {ttl}");
        let ttl = pttl(&redis, &format!("session:{}", i + 1)).await;
        assert!(
            ttl > 86_000_000 && ttl <= 86_400_000,
            "session:{}: {ttl}",
            i + 1
        );
        // A lock written without a TTL gets the lock: prefix's 30 s (default.yaml).
        let ttl = pttl(&redis, &format!("lock:{}", i + 2)).await;
        assert!(ttl > 25_000 && ttl <= 30_000, "lock:{}: {ttl}", i + 2);
        let ttl = pttl(&redis, &format!("c:{}", i + 3)).await;
        assert!(ttl > 50_000 && ttl <= 60_000, "c:{}: {ttl}", i + 3);
    }
    let value = redis.direct(&["GET", "k:296"]).await;
    assert_eq!(value, bulk(&[b'x'; 296]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_capped_and_key_names_enforced() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: cap\n    stream_maxlen: 10\n  - id: names\n    key_pattern: '^[a-z]+(:[A-Za-z0-9_-]+)+$'\n    message: name keys resource:id:field\n",
        redis.addr()
    );
    let proxy =
        Proxy::start(redis_policy_proxy::setup::from_yaml(&yaml, Path::new("s.yaml")).unwrap())
            .await;
    let mut c = Raw::connect(proxy.addr).await;
    let mut pipeline = Vec::new();
    for i in 0..1000 {
        pipeline.extend_from_slice(format!("XADD events:all * n {i}\r\n").as_bytes());
    }
    c.send(&pipeline).await;
    let got = c.collect_frames(1000, DEADLINE).await.frames;
    assert!(
        got.iter().all(|f| f.starts_with(b"$")),
        "every XADD returns an id"
    );
    // Approximate trimming keeps whole 100-entry nodes: far below 1000.
    let len = text(&redis.direct(&["XLEN", "events:all"]).await);
    let len: u64 = len.trim_start_matches(':').trim_end().parse().unwrap();
    assert!(len <= 110, "XLEN {len}");
    // An explicit cap is kept as written.
    c.call(&["XADD", "events:mine", "MAXLEN", "5000", "*", "n", "1"])
        .await;
    // Keys must follow the naming pattern.
    let reply = text(&c.call(&["SET", "NoColon", "v"]).await);
    assert_eq!(
        reply,
        "-ERR policy names: key 'NoColon' does not match the naming pattern ^[a-z]+(:[A-Za-z0-9_-]+)+$; name keys resource:id:field\r\n"
    );
    assert_eq!(c.call(&["SET", "user:1", "v"]).await, b"+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_rate_limit_is_one_budget_for_every_proxy() {
    let redis = RedisServer::start();
    let yaml = format!(
        "upstream:\n  address: {}\nrules:\n  - id: shared-limit\n    rate_limit: {{requests: 5, window_ms: 60000, per: address, backend: redis}}\n",
        redis.addr()
    );
    let config = || redis_policy_proxy::setup::from_yaml(&yaml, Path::new("shared.yaml")).unwrap();
    // Two proxy replicas in front of the same Redis. No readiness probe: it would spend budget.
    let first = Proxy::spawn(config()).await;
    let second = Proxy::spawn(config()).await;
    let mut a = Raw::connect(first.addr).await;
    let mut b = Raw::connect(second.addr).await;
    let until = std::time::Instant::now() + DEADLINE;
    // The first command may race the control connection's first handshake: a limiter outage
    // fails open, so wait until the budget is really being counted.
    while redis
        .direct(&["EXISTS", "rpp:rl:shared-limit:127.0.0.1"])
        .await
        != b":1\r\n"
    {
        assert!(
            std::time::Instant::now() < until,
            "the limiter never counted"
        );
        assert_eq!(a.call(&["PING"]).await, b"+PONG\r\n");
    }
    let used: usize = {
        let h = text(
            &redis
                .direct(&["HGET", "rpp:rl:shared-limit:127.0.0.1", "c"])
                .await,
        );
        h.lines().nth(1).unwrap_or("0").parse().unwrap_or(0)
    };
    let mut allowed = used;
    let mut refused = 0;
    for i in 0..8 {
        let c = if i % 2 == 0 { &mut a } else { &mut b };
        let reply = text(&c.call(&["PING"]).await);
        if reply == "+PONG\r\n" {
            allowed += 1;
        } else {
            assert!(
                reply.starts_with(
                    "-ERR policy shared-limit: 5 requests per 60s exceeded; retry in "
                ),
                "{reply}"
            );
            refused += 1;
        }
    }
    assert_eq!(allowed, 5, "both proxies together allowed {allowed}");
    assert_eq!(refused, 8 - (5 - used));
    let ttl = text(
        &redis
            .direct(&["PTTL", "rpp:rl:shared-limit:127.0.0.1"])
            .await,
    );
    assert!(!ttl.starts_with(":-"), "the limiter key has no TTL: {ttl}");
}

/// `admin`'s password is `adminpw`.
const ADMIN_SHA256: &str = "5fcf82bc15aef42cd3ec93e6d4b51c04df110cf77ee715f62f3f172ff8ed9de9";

/// MONITOR is listed as working (README.md) but the shipped policy refuses it: the refusal
/// says what to use instead and how an operator is exempted, and that exemption, done as
/// policy/default.yaml describes it, lets an operator's MONITOR through while others are
/// still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_is_refused_with_what_to_do_instead_and_the_named_exemption_works() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let reply = text(&c.call(&["MONITOR"]).await);
    assert!(
        reply.starts_with("-NOPERM policy deny-monitor: MONITOR is not allowed; "),
        "{reply}"
    );
    for hint in ["audit trail", "audit.commands", "except_tenants"] {
        assert!(reply.contains(hint), "{hint:?} not in {reply}");
    }
    drop(c);
    proxy.stop().await;

    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let rule = "  - id: deny-monitor\n";
    let text_in = common::default_policy_enforced();
    assert!(text_in.contains(rule) && text_in.contains("\nrules:\n"));
    let edited = text_in
        .replace(
            "\nrules:\n",
            &format!(
                "\naccess:\n  users:\n    - {{name: admin, password_sha256: {ADMIN_SHA256}}}\n  identities:\n    - {{tenant: admin, user: admin}}\nrules:\n"
            ),
        )
        .replace(rule, &format!("{rule}    except_tenants: [admin]\n"));
    let mut config = redis_policy_proxy::setup::from_yaml(&edited, &path).expect("policy loads");
    config.set_upstream(redis.addr());
    let proxy = Proxy::start(config).await;
    let mut app = Raw::connect(proxy.addr).await;
    let reply = text(&app.call(&["MONITOR"]).await);
    assert!(
        reply.starts_with("-NOPERM policy deny-monitor: "),
        "{reply}"
    );
    let mut operator = Raw::connect(proxy.addr).await;
    assert_eq!(
        operator.call(&["AUTH", "admin", "adminpw"]).await,
        b"+OK\r\n"
    );
    assert_eq!(operator.call(&["MONITOR"]).await, b"+OK\r\n");
    assert_eq!(app.call(&["SET", "monitored", "1"]).await, b"+OK\r\n");
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let line = text(&operator.read_frame().await);
        if line.contains("\"SET\" \"monitored\" \"1\"") {
            break;
        }
        assert!(std::time::Instant::now() < until, "no SET in MONITOR");
    }
}

/// The security hole of the earlier default: `deny-admin` named four commands, so anyone who
/// reached the proxy could create a Redis superuser (and then bypass the proxy), make the
/// upstream a replica that refuses every write, or kill the proxy's own upstream connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_refuses_whatever_changes_roles_users_modules_or_other_clients() {
    let redis = RedisServer::start();
    let proxy = default_policy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let refused: &[&[&str]] = &[
        &["ACL", "SETUSER", "intruder", "on", "nopass", "+@all"],
        &["ACL", "DELUSER", "default"],
        &["ACL", "GETUSER", "default"],
        &["ACL", "LIST"],
        &["ACL", "LOAD"],
        &["REPLICAOF", "127.0.0.1", "1"],
        &["SLAVEOF", "127.0.0.1", "1"],
        &["FAILOVER"],
        &["CLIENT", "KILL", "TYPE", "normal"],
        &["CLIENT", "PAUSE", "100000"],
        &["MODULE", "LOAD", "/tmp/x.so"],
        &["SWAPDB", "0", "1"],
        &["FUNCTION", "FLUSH"],
        &["FUNCTION", "RESTORE", "x"],
        &["CLUSTER", "RESET"],
        &["CLUSTER", "MEET", "127.0.0.1", "1"],
        &["CONFIG", "REWRITE"],
        &["CONFIG", "RESETSTAT"],
        &["MIGRATE", "127.0.0.1", "1", "k", "0", "1000"],
        &["SAVE"],
        &["BGSAVE"],
        &["DEBUG", "SLEEP", "0"],
    ];
    for cmd in refused {
        let reply = text(&c.call(cmd).await);
        assert!(
            reply.starts_with("-NOPERM policy deny-admin: "),
            "{cmd:?}: {reply}"
        );
    }
    // What clients and their libraries use stays allowed.
    for cmd in [
        &["ACL", "WHOAMI"][..],
        &["CLIENT", "LIST"],
        &["INFO", "server"],
        &["ROLE"],
        &["CONFIG", "GET", "maxmemory"],
        &["MODULE", "LIST"],
    ] {
        let reply = c.call(cmd).await;
        assert_ne!(reply.first(), Some(&b'-'), "{cmd:?}: {}", show(&reply));
    }
    // Nothing refused reached Redis: no new user (but the proxy's own script user), still a
    // primary, writes still accepted, the proxy's own connections alive.
    let users = String::from_utf8_lossy(&redis.direct(&["ACL", "USERS"]).await).into_owned();
    assert!(
        users.starts_with("*2\r\n$7\r\ndefault\r\n$28\r\nrpp-scripts-"),
        "{users}"
    );
    assert!(
        redis
            .direct(&["ROLE"])
            .await
            .starts_with(b"*3\r\n$6\r\nmaster\r\n")
    );
    assert_eq!(c.call(&["SET", "still", "writable"]).await, b"+OK\r\n");
}

/// Every command the table puts in `@admin` or `@dangerous` is refused by the default policy
/// unless it is on the list the file documents as allowed: a command added to the table (a
/// Redis upgrade) cannot slip through unnoticed.
#[test]
fn every_admin_or_dangerous_command_is_denied_or_documented_as_allowed() {
    use redis_policy_proxy::commands::{AclCategories, all_commands};
    use redis_policy_proxy::policy::{Client, Verdict};
    // Read-only or connection-local, used by clients; each named in policy/default.yaml.
    const ALLOWED: &[&str] = &[
        "info",
        "role",
        "lastsave",
        "config|get",
        "client|list",
        "client|no-evict",
        "client|unblock",
        "slowlog|get",
        "slowlog|len",
        "latency|doctor",
        "latency|graph",
        "latency|histogram",
        "latency|history",
        "latency|latest",
        "module|list",
        "cluster|count-failure-reports",
        "cluster|replicas",
        "cluster|slaves",
        // Application commands whose risk is keys, not the server: SORT's BY/GET patterns
        // are confined by namespacing, RESTORE is a write like any other (KEYS and FLUSH*
        // are refused by their own rules, which this test counts too).
        "sort",
        "sort_ro",
        "restore",
        "restore-asking",
    ];
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let config = redis_policy_proxy::setup::load(&path).expect("default policy loads");
    let policy = redis_policy_proxy::setup::policy(&config).expect("default policy compiles");
    let client = Client {
        id: 1,
        addr: std::net::Ipv4Addr::LOCALHOST.into(),
        tenant: 0,
        user: 0,
        again: false,
    };
    let admin = AclCategories::from_category(b"admin").unwrap();
    let dangerous = AclCategories::from_category(b"dangerous").unwrap();
    let mut leaks = Vec::new();
    for spec in all_commands() {
        let risky = spec.in_categories(admin) || spec.in_categories(dangerous);
        if !risky || !spec.subcommands.is_empty() {
            continue;
        }
        let mut argv: Vec<String> = spec.name.split('|').map(str::to_string).collect();
        argv.extend(["a", "b", "c"].map(String::from));
        let refused = matches!(policy.check(&client, &argv[..]), Verdict::Refuse(_));
        let allowed = ALLOWED.contains(&spec.name);
        if refused == allowed {
            leaks.push(format!(
                "{} ({})",
                spec.name,
                if refused {
                    "refused but listed as allowed"
                } else {
                    "not refused"
                }
            ));
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// A proxy in front of `redis` running `policy/default.yaml` with `upstream.script_acl` set.
async fn default_policy_with_script_acl(redis: &RedisServer, mode: &str) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let text = common::default_policy_enforced().replace(
        "  script_acl: confine\n",
        &format!("  script_acl: {mode}\n"),
    );
    let mut config = redis_policy_proxy::setup::from_yaml(&text, &path).expect("policy loads");
    config.set_upstream(redis.addr());
    Proxy::start(config).await
}

/// `/readyz`'s body once the script ACL check has reported (it runs beside serving).
async fn readyz_after_acl_check(proxy: &Proxy) -> String {
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (status, body) = http_get(proxy.admin, "/readyz").await;
        if status == 200 && (body.contains("cannot run") || body.contains("scripts could run")) {
            return body;
        }
        assert!(
            std::time::Instant::now() < until,
            "no script ACL check: {body}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

/// Scripts run as the proxy's upstream user, which could run KEYS or FLUSHALL though the
/// policy refuses them: the proxy says so at start (log, metric, /readyz).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_warns_when_scripts_could_run_what_the_policy_denies() {
    let redis = RedisServer::start();
    let proxy = default_policy_with_script_acl(&redis, "check").await;
    let body = readyz_after_acl_check(&proxy).await;
    assert!(
        body.contains("scripts could run what the policy denies as upstream user `default`: ")
            && body.contains("KEYS")
            && body.contains("FLUSHALL"),
        "{body}"
    );
    let metrics = http_get(proxy.admin, "/metrics").await.1;
    assert!(
        sample(&metrics, "rpp_script_acl_open_commands") > 0.0,
        "{metrics}"
    );
    // Checking changed nothing on the server.
    assert_eq!(
        redis.direct(&["ACL", "LIST"]).await,
        b"*1\r\n$34\r\nuser default on nopass ~* &* +@all\r\n".to_vec()
    );
}

/// With `script_acl: apply` the proxy gives its upstream user the ACL mirroring the deny
/// rules, so a script cannot run what the proxy refuses; everything the policy allows works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_acl_applied_a_script_cannot_run_what_the_policy_denies() {
    let redis = RedisServer::start();
    redis.direct(&["SET", "data", "kept"]).await;
    let proxy = default_policy_with_script_acl(&redis, "apply").await;
    let body = readyz_after_acl_check(&proxy).await;
    assert!(
        body.contains(
            "upstream user `default` cannot run the commands the policy denies (ACL applied)"
        ),
        "{body}"
    );
    let metrics = http_get(proxy.admin, "/metrics").await.1;
    assert_eq!(
        sample(&metrics, "rpp_script_acl_open_commands"),
        0.0,
        "{metrics}"
    );
    let mut c = Raw::connect(proxy.addr).await;
    for script in [
        "return redis.call('KEYS','*')",
        "return redis.call('FLUSHALL')",
        "return redis.call('SWAPDB', 0, 1)",
    ] {
        let reply = text(&c.call(&["EVAL", script, "0"]).await);
        assert!(
            reply.starts_with(
                "-ERR The user executing the script can't run this command or subcommand"
            ),
            "{script}: {reply}"
        );
    }
    assert_eq!(redis.direct(&["GET", "data"]).await, b"$4\r\nkept\r\n");
    // What the policy allows still runs, in scripts and directly.
    assert_eq!(
        c.call(&["EVAL", "return redis.call('GET', KEYS[1])", "1", "data"])
            .await,
        b"$4\r\nkept\r\n"
    );
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert!(c.call(&["SCAN", "0"]).await.starts_with(b"*2\r\n"));
}

/// A `scripts` rule lets a tenant run only the scripts and functions the operator listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripts_rule_runs_only_listed_scripts_for_its_tenant() {
    let redis = RedisServer::start();
    // sha1("return 1")
    let sha = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";
    let yaml = format!(
        "upstream:\n  address: {}\naccess:\n  identities:\n    - {{tenant: app, cidr: 127.0.0.1/32}}\nrules:\n  - id: reviewed-scripts\n    tenants: [app]\n    scripts:\n      allow: listed\n      sha1: ['{sha}']\n      functions: [put]\n    message: ask for a script review\n  - id: no-scripts\n    tenants: [default]\n    scripts: {{allow: none}}\n",
        redis.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&yaml, Path::new("s.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["EVAL", "return 1", "0"]).await, b":1\r\n");
    assert_eq!(c.call(&["EVALSHA", sha, "0"]).await, b":1\r\n");
    let reply = text(
        &c.call(&["EVAL", "return redis.call('KEYS','*')", "0"])
            .await,
    );
    assert!(
        reply.starts_with(
            "-NOPERM policy reviewed-scripts: EVAL of a script that is not listed (sha1 "
        ) && reply.ends_with("); ask for a script review\r\n"),
        "{reply}"
    );
    let lib = "#!lua name=rpp\nredis.register_function('put', function(keys, args) return redis.call('SET', keys[1], args[1]) end)";
    let reply = text(&c.call(&["FUNCTION", "LOAD", lib]).await);
    assert!(
        reply.starts_with("-NOPERM policy reviewed-scripts: FUNCTION LOAD would change"),
        "{reply}"
    );
    redis.direct(&["FUNCTION", "LOAD", lib]).await;
    assert_eq!(c.call(&["FCALL", "put", "1", "k", "v"]).await, b"+OK\r\n");
    redis
        .direct(&[
            "FUNCTION",
            "LOAD",
            "REPLACE",
            &lib.replace("'put'", "'other'"),
        ])
        .await;
    let reply = text(&c.call(&["FCALL", "other", "1", "k", "v"]).await);
    assert!(
        reply.contains("FCALL of function `other`, which is not listed"),
        "{reply}"
    );
}

/// The shipped `policy/default.yaml` (the container's default) in front of a Redis with
/// existing data changes none of it: its data-changing rules are in audit mode, so writes
/// keep their keys as they were and the audit counts what enforcing would have done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_default_policy_changes_no_data_until_its_rules_are_enforced() {
    let redis = RedisServer::start();
    seed_persistent_keys(&redis).await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let mut config = redis_policy_proxy::setup::load(&path).expect("default policy loads");
    config.set_upstream(redis.addr());
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    write_through(&mut c).await;
    for key in [
        "config:features",
        "counter",
        "config:name",
        "old",
        "fresh:hash",
        "fresh:string",
        "mset:new",
    ] {
        assert_eq!(pttl(&redis, key).await, -1, "{key}");
    }
    let mut pipeline = Vec::new();
    for i in 0..300 {
        pipeline.extend(resp(&["XADD", "events", "*", "n", &i.to_string()]));
    }
    c.send(&pipeline).await;
    c.collect_frames(300, DEADLINE).await;
    assert_eq!(redis.direct(&["XLEN", "events"]).await, b":300\r\n");
    // What is still enforced: refusals, which change nothing.
    assert!(c.call(&["KEYS", "*"]).await.starts_with(b"-NOPERM"));
    let metrics = http_get(proxy.admin, "/metrics").await.1;
    for rule in ["ttl-default", "streams-capped"] {
        let series = format!(
            "rpp_policy_decisions_total{{rule=\"{rule}\",tenant=\"default\",outcome=\"audited\"}}"
        );
        assert!(sample(&metrics, &series) > 0.0, "{series} in {metrics}");
    }
}

/// The deployment artefacts start the rules that change data in audit mode and validate: the
/// container's default (`policy/default.yaml`, per the Dockerfile) and the Kubernetes
/// ConfigMap's policy.
#[test]
fn deployment_artefacts_validate_and_start_data_changing_rules_in_audit_mode() {
    use redis_policy_proxy::policy::Mode;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("/etc/redis-policy-proxy/default.yaml"));
    let manifest =
        std::fs::read_to_string(root.join("deploy/kubernetes/redis-policy-proxy.yaml")).unwrap();
    let start = manifest
        .find("  policy.yaml: |\n")
        .expect("the ConfigMap's policy")
        + 17;
    let configmap: String = manifest[start..]
        .lines()
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    let shipped = [
        (
            "policy/default.yaml",
            std::fs::read_to_string(root.join("policy/default.yaml")).unwrap(),
        ),
        ("the ConfigMap", configmap),
    ];
    for (name, text) in shipped {
        // The ConfigMap's upstream password comes from the pod's Secret (password_env), not
        // set here: tests/deploy.rs checks that wiring.
        let mut config = redis_policy_proxy::Config::parse(&text, Path::new(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        config.secret_problems.clear();
        redis_policy_proxy::setup::validate(&config, Path::new(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for rule in &config.rules {
            let changes_data = rule.ttl.is_some() || rule.stream_maxlen.is_some();
            if changes_data {
                assert_eq!(rule.mode, Mode::Audit, "{name}: rule {}", rule.id.value);
            }
        }
        let ids: Vec<&str> = config.rules.iter().map(|r| r.id.value.as_str()).collect();
        assert!(
            ids.contains(&"ttl-default") && ids.contains(&"streams-capped"),
            "{name}: {ids:?}"
        );
    }
}

/// Every refusal message of the shipped policies points at something that exists: no "see the
/// guide" that no one ships, and any file it names is in the repository.
#[test]
fn refusal_messages_point_at_things_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in ["policy/default.yaml", "policy/passthrough.yaml"] {
        let config = redis_policy_proxy::setup::load(&root.join(name)).unwrap();
        for rule in &config.rules {
            let Some(message) = &rule.message else {
                continue;
            };
            assert!(
                !message.to_ascii_lowercase().contains("guide"),
                "{name}: rule {} points at a guide: {message}",
                rule.id.value
            );
            for word in message.split_whitespace() {
                let word = word.trim_matches(|c: char| "()`,;.".contains(c));
                if word.ends_with(".md") || word.ends_with(".yaml") {
                    assert!(root.join(word).exists(), "{name}: {word} does not exist");
                }
            }
        }
    }
}

/// `script_acl: apply` only takes rights away: applied to a least-privilege proxy user, it
/// grants none of CONFIG SET, SHUTDOWN, DEBUG, FLUSHALL (a leading `+@all` did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_the_acl_never_grants_the_proxy_user_anything() {
    let redis = RedisServer::start();
    redis
        .direct(&[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">app-pw",
            "~*",
            "&*",
            "-@all",
            "+@read",
            "+@write",
            "+@connection",
            "+info",
            "+acl|whoami",
            "+acl|setuser",
            "+acl|dryrun",
        ])
        .await;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let text_yaml = common::default_policy_enforced()
        .replace("  script_acl: confine\n", "  script_acl: apply\n");
    let mut config = redis_policy_proxy::setup::from_yaml(&text_yaml, &path).expect("loads");
    config.set_upstream(redis.addr());
    config.upstream.username = Some("app".into());
    config.upstream.password = Some("app-pw".into());
    let proxy = Proxy::start(config).await;
    readyz_after_acl_check(&proxy).await;
    for cmd in [
        &["config", "set", "maxmemory", "1"][..],
        &["shutdown"],
        &["debug", "sleep", "0"],
        &["flushall"],
        &["keys", "*"],
    ] {
        let mut dry = vec!["ACL", "DRYRUN", "app"];
        dry.extend_from_slice(cmd);
        let reply = redis.direct(&dry).await;
        assert!(reply.starts_with(b"$"), "{cmd:?} allowed: {}", text(&reply));
    }
    assert_eq!(
        redis.direct(&["ACL", "DRYRUN", "app", "get", "k"]).await,
        b"+OK\r\n"
    );
}
