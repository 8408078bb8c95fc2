//! The shipped default policy, enforced through the proxy against a real Redis: refusals name
//! the rule and the better pattern, and nothing refused reaches the server.

mod common;

use std::path::Path;

use common::{DEADLINE, Proxy, Raw, RedisServer};
use redis_policy_proxy::Config;

/// A proxy in front of `redis` running `policy/default.yaml`.
async fn default_policy(redis: &RedisServer) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let mut config = Config::load(&path).expect("default policy loads");
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
    let config = Config::from_yaml(&yaml, Path::new("rl.yaml")).unwrap();
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
