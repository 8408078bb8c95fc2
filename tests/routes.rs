//! Routes (docs/routes.md) against real redis-servers: keys sent by prefix to separate
//! instances (and databases), the guide's patterns landing where they belong, multi-key
//! commands split or refused with both routes named, whole-keyspace commands walking every
//! route, pub/sub by channel prefix, rules scoped to a route, readiness and metrics per route.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{DEADLINE, Proxy, Raw, RedisServer, http_get, sample, show};

/// A cache instance (the `default` upstream, routes `cache` and db-2 `archive`) and a queue
/// instance (route `queue`).
struct Two {
    cache: RedisServer,
    queue: RedisServer,
}

impl Two {
    fn start() -> Two {
        Two {
            cache: RedisServer::start(),
            queue: RedisServer::start(),
        }
    }

    /// Both instances with the eviction policy the other one needs: each route's check
    /// has a finding.
    fn start_swapped_eviction() -> Two {
        Two {
            cache: RedisServer::start_with(&[
                "--maxmemory",
                "64mb",
                "--maxmemory-policy",
                "noeviction",
            ]),
            queue: RedisServer::start_with(&[
                "--maxmemory",
                "64mb",
                "--maxmemory-policy",
                "allkeys-lru",
            ]),
        }
    }

    /// The guide's layout, `extra` (rules, access…) appended.
    fn config(&self, extra: &str) -> redis_policy_proxy::Config {
        let text = format!(
            "upstream:\n  address: {cache}\nupstreams:\n  queue:\n    address: {queue}\n\
             routes:\n  - name: cache\n    prefixes: [\"cache:\", \"session:\"]\n\
             \x20 - name: queue\n    upstream: queue\n    prefixes: [\"queue:\", \"stream:\", \"events:\"]\n\
             \x20 - name: archive\n    prefixes: [\"archive:\"]\n    db: 2\n{extra}",
            cache = self.cache.addr(),
            queue = self.queue.addr(),
        );
        redis_policy_proxy::setup::from_yaml(&text, Path::new("routes.yaml"))
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// `EXISTS key` on `redis` directly, as a number.
async fn exists(redis: &RedisServer, key: &str) -> bool {
    redis.direct(&["EXISTS", key]).await == b":1\r\n"
}

/// `EXISTS key` in database `db` of `redis`.
async fn exists_in(redis: &RedisServer, db: &str, key: &str) -> bool {
    let mut c = redis.raw().await;
    assert_eq!(c.call(&["SELECT", db]).await, b"+OK\r\n");
    c.call(&["EXISTS", key]).await == b":1\r\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_patterns_land_on_their_routes_instance() {
    let two = Two::start();
    let proxy = Proxy::start(two.config("")).await;
    let mut c = Raw::connect(proxy.addr).await;
    // Cache-aside: a miss, then the value written with a TTL.
    assert_eq!(c.call(&["GET", "cache:user:1"]).await, b"$-1\r\n");
    assert_eq!(
        c.call(&["SET", "cache:user:1", "{}", "EX", "300"]).await,
        b"+OK\r\n"
    );
    assert_eq!(c.call(&["GET", "cache:user:1"]).await, b"$2\r\n{}\r\n");
    // Sessions.
    assert_eq!(
        c.call(&["HSET", "session:abc", "user", "1"]).await,
        b":1\r\n"
    );
    assert_eq!(c.call(&["EXPIRE", "session:abc", "1800"]).await, b":1\r\n");
    // A lock, taken and released by the guide's compare-and-delete script (declared key).
    assert_eq!(
        c.call(&["SET", "cache:lock:job", "token", "NX", "PX", "30000"])
            .await,
        b"+OK\r\n"
    );
    let unlock = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
    assert_eq!(
        c.call(&["EVAL", unlock, "1", "cache:lock:job", "token"])
            .await,
        b":1\r\n"
    );
    // A fixed-window rate limit, on the default route.
    assert_eq!(c.call(&["INCR", "ratelimit:ip:1"]).await, b":1\r\n");
    assert_eq!(c.call(&["EXPIRE", "ratelimit:ip:1", "60"]).await, b":1\r\n");
    // A queue, and a stream with a consumer group.
    assert_eq!(c.call(&["LPUSH", "queue:jobs", "j1"]).await, b":1\r\n");
    assert_eq!(
        c.call(&["BRPOP", "queue:jobs", "1"]).await,
        b"*2\r\n$10\r\nqueue:jobs\r\n$2\r\nj1\r\n"
    );
    let id = c.call(&["XADD", "stream:orders", "*", "o", "1"]).await;
    assert!(id.starts_with(b"$"), "{}", show(&id));
    assert_eq!(
        c.call(&["XGROUP", "CREATE", "stream:orders", "billing", "0"])
            .await,
        b"+OK\r\n"
    );
    let read = c
        .call(&[
            "XREADGROUP",
            "GROUP",
            "billing",
            "w1",
            "COUNT",
            "1",
            "STREAMS",
            "stream:orders",
            ">",
        ])
        .await;
    assert!(show(&read).contains("stream:orders"), "{}", show(&read));
    let id = String::from_utf8_lossy(&id[id.iter().position(|&b| b == b'\n').unwrap() + 1..])
        .trim_end()
        .to_string();
    assert_eq!(
        c.call(&["XACK", "stream:orders", "billing", &id]).await,
        b":1\r\n"
    );
    // Everything is where its route says, and nowhere else.
    for key in ["cache:user:1", "session:abc", "ratelimit:ip:1"] {
        assert!(exists(&two.cache, key).await, "{key} on the cache instance");
        assert!(!exists(&two.queue, key).await, "{key} not on the queue's");
    }
    assert!(exists(&two.queue, "stream:orders").await);
    assert!(!exists(&two.cache, "stream:orders").await);
    assert!(!exists(&two.cache, "cache:lock:job").await, "unlocked");
    // A route's own database.
    assert_eq!(c.call(&["SET", "archive:2025", "x"]).await, b"+OK\r\n");
    assert!(exists_in(&two.cache, "2", "archive:2025").await);
    assert!(!exists(&two.cache, "archive:2025").await, "not in db 0");
    assert_eq!(c.call(&["GET", "archive:2025"]).await, b"$1\r\nx\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_stays_on_one_route_and_a_cross_route_one_aborts() {
    let two = Two::start();
    let proxy = Proxy::start(two.config("")).await;
    let mut c = Raw::connect(proxy.addr).await;
    // Tag invalidation in one MULTI: the tag's members and the tag, all on the cache route.
    c.call(&["SADD", "cache:tag:user1", "cache:a", "cache:b"])
        .await;
    c.call(&["MSET", "cache:a", "1", "cache:b", "2"]).await;
    let got = c
        .request(
            &common::resp_cmds(&[
                "MULTI",
                "DEL cache:a cache:b",
                "DEL cache:tag:user1",
                "EXEC",
            ]),
            4,
        )
        .await;
    assert_eq!(
        show(&got),
        show(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:2\r\n:1\r\n")
    );
    assert!(!exists(&two.cache, "cache:a").await);
    // A key of another route inside the transaction: refused while queuing, EXEC aborts,
    // nothing of it ran on either instance.
    let got = c
        .request(
            &common::resp_cmds(&["MULTI", "SET cache:x 1", "LPUSH queue:y 1", "EXEC"]),
            4,
        )
        .await;
    let text = show(&got);
    assert!(
        text.contains("CROSSROUTE") && text.contains("cache") && text.contains("queue"),
        "{text}"
    );
    assert!(text.contains("EXECABORT"), "{text}");
    assert!(!exists(&two.cache, "cache:x").await);
    assert!(!exists(&two.queue, "queue:y").await);
    // WATCH on one route, then a key of another: the session is held on the first.
    assert_eq!(c.call(&["WATCH", "queue:w"]).await, b"+OK\r\n");
    let refused = c.call(&["GET", "cache:w"]).await;
    assert!(refused.starts_with(b"-CROSSROUTE"), "{}", show(&refused));
    assert_eq!(c.call(&["UNWATCH"]).await, b"+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_commands_split_across_routes_or_are_refused_naming_both() {
    let two = Two::start();
    let proxy = Proxy::start(two.config("")).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        c.call(&["MSET", "cache:a", "1", "queue:b", "2", "plain", "3"])
            .await,
        b"+OK\r\n"
    );
    assert!(exists(&two.cache, "cache:a").await);
    assert!(exists(&two.queue, "queue:b").await);
    assert!(exists(&two.cache, "plain").await);
    assert_eq!(
        c.call(&["MGET", "queue:b", "cache:a", "nope", "plain"])
            .await,
        b"*4\r\n$1\r\n2\r\n$1\r\n1\r\n$-1\r\n$1\r\n3\r\n"
    );
    assert_eq!(
        c.call(&["EXISTS", "cache:a", "queue:b", "queue:none"])
            .await,
        b":2\r\n"
    );
    let refused = c.call(&["RPOPLPUSH", "queue:b", "cache:list"]).await;
    let text = String::from_utf8_lossy(&refused);
    assert!(
        text.starts_with("-CROSSROUTE") && text.contains("(queue, default/cache)"),
        "{text}"
    );
    // Routes on one instance and database share it: no refusal between them.
    assert_eq!(
        c.call(&["SUNIONSTORE", "cache:u", "session:s", "plain-set"])
            .await,
        b":0\r\n"
    );
    assert_eq!(
        c.call(&["DEL", "cache:a", "queue:b", "plain"]).await,
        b":3\r\n"
    );
    // Set reads across routes are answered from each route's members, as across slots.
    assert_eq!(c.call(&["SADD", "queue:s", "a", "b"]).await, b":2\r\n");
    assert_eq!(c.call(&["SADD", "cache:s", "b", "c"]).await, b":2\r\n");
    assert_eq!(
        c.call(&["SINTER", "queue:s", "cache:s"]).await,
        b"*1\r\n$1\r\nb\r\n"
    );
    assert_eq!(
        c.call(&["SDIFF", "cache:s", "queue:s", "nope"]).await,
        b"*1\r\n$1\r\nc\r\n"
    );
    assert_eq!(
        c.call(&["SINTERCARD", "2", "queue:s", "cache:s"]).await,
        b":1\r\n"
    );
    assert_eq!(c.call(&["DEL", "queue:s", "cache:s"]).await, b":2\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_keyspace_commands_walk_every_route() {
    let two = Two::start();
    let proxy = Proxy::start(two.config(
        "rules:\n  - id: no-flush-queue\n    deny: [FLUSHALL, FLUSHDB]\n    routes: [queue]\n",
    ))
    .await;
    let mut c = Raw::connect(proxy.addr).await;
    for key in ["cache:1", "cache:2", "queue:1", "stream:1", "x"] {
        assert_eq!(c.call(&["SET", key, "v"]).await, b"+OK\r\n");
    }
    assert_eq!(c.call(&["DBSIZE"]).await, b":5\r\n");
    let keys = String::from_utf8_lossy(&c.call(&["KEYS", "*"]).await).into_owned();
    assert!(keys.starts_with("*5"), "{keys}");
    for key in ["cache:1", "queue:1", "stream:1", "x"] {
        assert!(keys.contains(key), "{keys}");
    }
    // SCAN to the end collects every route's keys once.
    let mut cursor = "0".to_string();
    let mut seen = Vec::new();
    loop {
        let reply = c.call(&["SCAN", &cursor, "COUNT", "100"]).await;
        let text = String::from_utf8_lossy(&reply).into_owned();
        let lines: Vec<&str> = text.split("\r\n").collect();
        cursor = lines[2].to_string();
        seen.extend(
            lines[4..]
                .iter()
                .filter(|l| !l.is_empty() && !l.starts_with('$'))
                .map(|l| l.to_string()),
        );
        if cursor == "0" {
            break;
        }
    }
    seen.sort();
    assert_eq!(seen, ["cache:1", "cache:2", "queue:1", "stream:1", "x"]);
    // A rule scoped to the queue route holds for FLUSHALL: it would empty that route too.
    let refused = c.call(&["FLUSHALL"]).await;
    assert!(
        show(&refused).contains("no-flush-queue"),
        "{}",
        show(&refused)
    );
    assert_eq!(c.call(&["DBSIZE"]).await, b":5\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_goes_to_the_route_its_channel_names() {
    let two = Two::start();
    let proxy = Proxy::start(two.config("")).await;
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(
        sub.call(&["SUBSCRIBE", "events:orders"]).await,
        b"*3\r\n$9\r\nsubscribe\r\n$13\r\nevents:orders\r\n:1\r\n"
    );
    // The subscription is on the queue instance, where PUBLISH of the channel goes.
    let numsub = two
        .queue
        .direct(&["PUBSUB", "NUMSUB", "events:orders"])
        .await;
    assert_eq!(numsub, b"*2\r\n$13\r\nevents:orders\r\n:1\r\n");
    let mut publisher = Raw::connect(proxy.addr).await;
    assert_eq!(
        publisher.call(&["PUBLISH", "events:orders", "o1"]).await,
        b":1\r\n"
    );
    assert_eq!(
        sub.read_frame().await,
        b"*3\r\n$7\r\nmessage\r\n$13\r\nevents:orders\r\n$2\r\no1\r\n"
    );
    // A pattern goes by its literal start; a channel of another route cannot join.
    assert_eq!(
        sub.call(&["PSUBSCRIBE", "events:*"]).await,
        b"*3\r\n$10\r\npsubscribe\r\n$8\r\nevents:*\r\n:2\r\n"
    );
    let refused = sub.call(&["SUBSCRIBE", "cache:news"]).await;
    assert!(refused.starts_with(b"-CROSSROUTE"), "{}", show(&refused));
    assert_eq!(
        sub.call(&["UNSUBSCRIBE", "events:orders"]).await,
        b"*3\r\n$11\r\nunsubscribe\r\n$13\r\nevents:orders\r\n:1\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_scoped_to_a_route_holds_there_only() {
    let two = Two::start();
    let proxy = Proxy::start(two.config(
        "rules:\n  - id: small-cache-values\n    max_value_bytes: 8\n    routes: [cache]\n    message: cache values stay small\n",
    ))
    .await;
    let mut c = Raw::connect(proxy.addr).await;
    let big = "0123456789abcdef";
    let refused = c.call(&["SET", "cache:big", big]).await;
    let text = show(&refused);
    assert!(
        text.contains("small-cache-values") && text.contains("cache values stay small"),
        "{text}"
    );
    assert!(!exists(&two.cache, "cache:big").await);
    assert_eq!(c.call(&["SET", "queue:big", big]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "other:big", big]).await, b"+OK\r\n");
    // MSET with one key in the route: the rule applies to the whole command.
    let refused = c.call(&["MSET", "queue:a", big, "cache:a", big]).await;
    assert!(show(&refused).contains("small-cache-values"));
    assert!(!exists(&two.queue, "queue:a").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_tenant_is_routed_by_the_key_it_names() {
    let two = Two::start();
    let extra = "access:\n  users:\n    - name: t1\n      password_sha256: \
                 \"a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3\"\n  \
                 identities:\n    - {tenant: t1, user: t1}\n  namespaces:\n    t1: \"t1:\"\n";
    let proxy = Proxy::start(two.config(extra)).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", "t1", "123"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["LPUSH", "queue:jobs", "1"]).await, b":1\r\n");
    assert_eq!(c.call(&["SET", "cache:a", "1"]).await, b"+OK\r\n");
    assert!(exists(&two.queue, "t1:queue:jobs").await);
    assert!(exists(&two.cache, "t1:cache:a").await);
    assert_eq!(
        c.call(&["MGET", "cache:a", "queue:none"]).await,
        b"*2\r\n$1\r\n1\r\n$-1\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_and_metrics_are_per_route() {
    let mut two = Two::start();
    let proxy = Proxy::start(two.config("")).await;
    let mut c = Raw::connect(proxy.addr).await;
    c.call(&["SET", "queue:a", "1"]).await;
    c.call(&["GET", "queue:a"]).await;
    c.call(&["GET", "cache:a"]).await;
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    assert!(
        sample(&metrics, "rpp_route_commands_total{route=\"queue\"}") >= 2.0,
        "{metrics}"
    );
    assert!(sample(&metrics, "rpp_route_commands_total{route=\"cache\"}") >= 1.0);
    let (status, ready) = http_get(proxy.admin, "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready.contains("route queue") && ready.contains("route archive"),
        "{ready}"
    );
    // The queue instance goes away: not ready, the route named; its keys get an error that
    // names the upstream, the other routes still serve.
    let mut sub = Raw::connect(proxy.addr).await;
    assert!(
        sub.call(&["SUBSCRIBE", "events:a"])
            .await
            .starts_with(b"*3")
    );
    two.queue.kill();
    // The subscriber's route server is gone: it is closed, not moved to another route's
    // server where its channel's messages never arrive.
    let (_, closed) = sub.read_to_close(DEADLINE).await;
    assert!(closed, "the subscriber of the dead route was left open");
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (status, ready) = http_get(proxy.admin, "/readyz").await;
        if status == 503 {
            assert!(ready.contains("route queue: no connection"), "{ready}");
            break;
        }
        assert!(std::time::Instant::now() < until, "still ready: {ready}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed = c.call(&["GET", "queue:a"]).await;
    assert!(failed.starts_with(b"-"), "{}", show(&failed));
    assert_eq!(c.call(&["GET", "cache:a"]).await, b"$-1\r\n");
}

#[test]
fn route_mistakes_are_named_with_their_line() {
    let bad = "upstream:\n  address: 127.0.0.1:6379\nupstreams:\n  queue:\n    address: nowhere\n  \
               spare:\n    address: 127.0.0.1:1\nroutes:\n  - name: cache\n    prefixes: [\"cache:\"]\n    \
               upstream: caches\n  - name: cache\n    prefixes: [\"cache:\", \"\"]\n    upstream: queue\n    \
               db: 99\n  - name: vip\n    prefixes: [\"v:\"]\n    tenants: [nobody]\n\
               rules:\n  - id: r\n    deny: [KEYS]\n    routes: [nope]\n";
    let err = redis_policy_proxy::setup::from_yaml(bad, Path::new("bad.yaml"))
        .unwrap_err()
        .to_string();
    for expected in [
        "`upstreams.queue.address`",
        "`upstreams.spare`: is used by no route",
        "`routes[0].upstream`: no upstream `caches`",
        "`routes[1].name`: `cache` names two routes",
        "`routes[1].prefixes[0]`: `cache:` is already a prefix of route `cache`",
        "`routes[1].prefixes[1]`: must not be empty",
        "`routes[1].db`: must be between 0 and 15",
        "`routes[2].tenants`: tenant `nobody` has no namespace",
        "`rules[0].routes`: no route `nope`",
    ] {
        assert!(err.contains(expected), "missing {expected:?} in:\n{err}");
    }
    assert!(err.contains("bad.yaml"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_routes_upstream_is_judged_under_its_own_role() {
    let two = Two::start_swapped_eviction();
    // The queue upstream is a queue, the default one a cache.
    let text = format!(
        "upstream:\n  address: {}\n  role: cache\n  memory_check_ms: 100\nupstreams:\n  queue:\n    address: {}\n    role: queue\n    memory_check_ms: 100\nroutes:\n  - name: queue\n    upstream: queue\n    prefixes: [\"queue:\"]\n",
        two.cache.addr(),
        two.queue.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&text, Path::new("r.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    let until = std::time::Instant::now() + DEADLINE;
    let info = loop {
        let info = String::from_utf8_lossy(&c.call(&["INFO", "proxy"]).await).into_owned();
        if info.contains("proxy_eviction_findings:2\r\n") {
            break info;
        }
        assert!(std::time::Instant::now() < until, "{info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        info.contains("proxy_route_queue_upstream_role:queue"),
        "{info}"
    );
    assert!(
        info.contains("proxy_route_queue_upstream_maxmemory_policy:allkeys-lru"),
        "{info}"
    );
    assert!(
        info.contains("proxy_route_default_upstream_role:cache"),
        "{info}"
    );
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    assert_eq!(sample(&metrics, "rpp_eviction_findings"), 2.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_managed_route_follows_its_failover() {
    let cache = RedisServer::start();
    let queue = common::sentinel::SentinelSetup::start();
    let sentinels = queue
        .sentinel_addrs()
        .iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "upstream:\n  address: {}\nupstreams:\n  queue:\n    mode: sentinel\n    sentinel:\n      \
         sentinels: [{sentinels}]\n      master_name: {}\nroutes:\n  - name: queue\n    \
         upstream: queue\n    prefixes: [\"queue:\"]\n",
        cache.addr(),
        common::sentinel::MASTER,
    );
    let config = redis_policy_proxy::setup::from_yaml(&text, Path::new("s.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["LPUSH", "queue:jobs", "1"]).await, b":1\r\n");
    assert_eq!(c.call(&["SET", "other", "1"]).await, b"+OK\r\n");
    assert!(exists(&queue.primary, "queue:jobs").await);
    assert!(!exists(&cache, "queue:jobs").await);
    assert!(exists(&cache, "other").await);
    queue.failover();
    // Writes for the route reach the promoted replica once the pool follows it; the other
    // route never noticed.
    let until = std::time::Instant::now() + DEADLINE * 2;
    loop {
        let mut c = Raw::connect(proxy.addr).await;
        if c.call(&["LPUSH", "queue:after", "1"]).await == b":1\r\n" {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the route never followed the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(exists(&queue.replica, "queue:after").await);
    assert_eq!(c.call(&["GET", "other"]).await, b"$1\r\n1\r\n");
}

/// `EXISTS key` on the cluster node at `addr`, directly (a node answers MOVED for a key it
/// does not own, which is not `:1`).
async fn exists_at(addr: &str, key: &str) -> bool {
    Raw::connect(addr).await.call(&["EXISTS", key]).await == b":1\r\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_in_front_of_a_redis_cluster_routes_by_slot_inside_it() {
    let cache = RedisServer::start();
    let cluster = common::cluster::RedisCluster::start(3, 0);
    let seed = cluster.nodes()[0].addr();
    let text = format!(
        "upstream:\n  address: {}\nupstreams:\n  queue:\n    mode: cluster\n    cluster:\n      \
         seeds: [{seed}]\nroutes:\n  - name: queue\n    upstream: queue\n    \
         prefixes: [\"queue:\", \"stream:\", \"events:\"]\n",
        cache.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&text, Path::new("c.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let (status, ready) = http_get(proxy.admin, "/readyz").await;
        if status == 200 {
            assert!(
                ready.contains("route queue (cluster): 3 primaries up"),
                "{ready}"
            );
            break;
        }
        assert!(std::time::Instant::now() < until, "not ready: {ready}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut c = Raw::connect(proxy.addr).await;
    // Keys of the cluster route land on the primary of their slot.
    let keys: Vec<String> = (0..12).map(|i| format!("queue:job:{i}")).collect();
    for key in &keys {
        assert_eq!(c.call(&["SET", key, "1"]).await, b"+OK\r\n");
        let owner = cluster.primary_for_slot(redis_policy_proxy::cluster::slot(key.as_bytes()));
        assert!(exists_at(&owner, key).await, "{key} on {owner}");
        assert!(!exists(&cache, key).await);
    }
    assert_eq!(c.call(&["SET", "cache:a", "1"]).await, b"+OK\r\n");
    assert!(exists(&cache, "cache:a").await);
    // Split across slots of the cluster and the other route, answered in the client's order.
    let mget = c
        .call(&[
            "MGET",
            "queue:job:0",
            "cache:a",
            "queue:job:5",
            "queue:nope",
        ])
        .await;
    assert_eq!(mget, b"*4\r\n$1\r\n1\r\n$1\r\n1\r\n$1\r\n1\r\n$-1\r\n");
    // Two slots of the cluster: Redis Cluster's own error; the cluster and another route:
    // both routes named.
    let (a, b) = (
        &keys[0],
        &keys[1..]
            .iter()
            .find(|k| {
                redis_policy_proxy::cluster::slot(k.as_bytes())
                    != redis_policy_proxy::cluster::slot(keys[0].as_bytes())
            })
            .unwrap(),
    );
    let refused = c.call(&["RENAME", a, b]).await;
    assert!(refused.starts_with(b"-CROSSSLOT"), "{}", show(&refused));
    let refused = c.call(&["RENAME", a, "cache:b"]).await;
    let text = String::from_utf8_lossy(&refused);
    assert!(
        text.starts_with("-CROSSROUTE") && text.contains("(queue, default)"),
        "{text}"
    );
    // A transaction on one slot of the cluster route (hash tags), a stream with a group.
    let got = c
        .request(
            &common::resp_cmds(&[
                "MULTI",
                "LPUSH queue:{t}:a 1",
                "LPUSH queue:{t}:b 2",
                "EXEC",
            ]),
            4,
        )
        .await;
    assert_eq!(
        show(&got),
        show(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n:1\r\n")
    );
    assert!(
        c.call(&["XADD", "stream:o", "*", "k", "v"])
            .await
            .starts_with(b"$")
    );
    assert_eq!(
        c.call(&["XGROUP", "CREATE", "stream:o", "g", "0"]).await,
        b"+OK\r\n"
    );
    // Whole-keyspace commands cover the cluster's primaries and the other route.
    assert_eq!(c.call(&["DBSIZE"]).await, b":16\r\n");
    // Pub/sub on the cluster route.
    let mut sub = Raw::connect(proxy.addr).await;
    assert_eq!(
        sub.call(&["SUBSCRIBE", "events:x"]).await,
        b"*3\r\n$9\r\nsubscribe\r\n$8\r\nevents:x\r\n:1\r\n"
    );
    assert_eq!(c.call(&["PUBLISH", "events:x", "m"]).await, b":1\r\n");
    assert_eq!(
        sub.read_frame().await,
        b"*3\r\n$7\r\nmessage\r\n$8\r\nevents:x\r\n$1\r\nm\r\n"
    );
    // An empty slot of the route moves to another primary: the proxy's map still names the
    // old owner, which answers MOVED; followed, and the map learns it, the other route
    // untouched.
    let key = "queue:{moved}";
    let s = redis_policy_proxy::cluster::slot(key.as_bytes());
    let source = cluster.primary_for_slot(s);
    let target = common::cluster::other_primary(&cluster, &source);
    let target_id = common::cluster::node_id(&cluster, &target);
    for p in cluster.primaries() {
        let reply = Raw::connect(&p)
            .await
            .request(&common::cluster::setslot(s, "NODE", &target_id), 1)
            .await;
        assert_eq!(reply, b"+OK\r\n", "{p}");
    }
    assert_eq!(c.call(&["SET", key, "m"]).await, b"+OK\r\n");
    assert!(
        exists_at(&target, key).await,
        "{key} on the new owner {target}"
    );
    assert_eq!(c.call(&["GET", key]).await, b"$1\r\nm\r\n");
    assert_eq!(c.call(&["GET", "cache:a"]).await, b"$1\r\n1\r\n");
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    assert!(
        sample(&metrics, "rpp_upstream_redirections_total{kind=\"moved\"}") >= 1.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalescing_is_per_route_upstream() {
    let two = Two::start();
    let text = format!(
        "upstream:\n  address: {}\nupstreams:\n  queue:\n    address: {}\n    coalesce_reads: true\n\
         routes:\n  - name: hot\n    upstream: queue\n    prefixes: [\"hot:\"]\n",
        two.cache.addr(),
        two.queue.addr()
    );
    let config = redis_policy_proxy::setup::from_yaml(&text, Path::new("co.yaml")).unwrap();
    let proxy = Proxy::start(config).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["SET", "hot:k", "v"]).await, b"+OK\r\n");
    assert_eq!(c.call(&["SET", "cold:k", "v"]).await, b"+OK\r\n");
    let (hot_before, cold_before) = (
        two.queue.command_calls("get").await,
        two.cache.command_calls("get").await,
    );
    const CLIENTS: usize = 100;
    const READS: usize = 20;
    common::all_at_once(proxy.addr, CLIENTS, |_, mut c| async move {
        for _ in 0..READS {
            assert_eq!(c.call(&["GET", "hot:k"]).await, b"$1\r\nv\r\n");
            assert_eq!(c.call(&["GET", "cold:k"]).await, b"$1\r\nv\r\n");
        }
    })
    .await;
    let reads = (CLIENTS * READS) as u64;
    let hot = two.queue.command_calls("get").await - hot_before;
    let cold = two.cache.command_calls("get").await - cold_before;
    assert_eq!(cold, reads, "the default route does not coalesce");
    let (_, metrics) = http_get(proxy.admin, "/metrics").await;
    let shared = sample(&metrics, "rpp_coalesced_reads_total") as u64;
    assert_eq!(hot + shared, reads, "every hot read sent or shared");
    assert!(shared > 0, "no read shared: {hot} sent");
    eprintln!("hot route: {hot} upstream GETs for {reads} client reads ({shared} shared)");
}

#[test]
fn the_example_file_is_valid_and_routes_as_it_says() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/examples/routes.yaml");
    let config = redis_policy_proxy::setup::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let table = redis_policy_proxy::setup::route_table(&config).expect("routes");
    let route = |key: &str| table.names()[usize::from(table.route_of(key.as_bytes()))].clone();
    assert_eq!(route("cache:user:1"), "cache");
    assert_eq!(route("session:abc"), "cache");
    for key in ["queue:jobs", "stream:orders", "events:x"] {
        assert_eq!(route(key), "queue", "{key}");
    }
    assert_eq!(route("user:1"), "default");
    let queue = config.named_upstream("queue").unwrap();
    assert_eq!(queue.address.value, "127.0.0.1:6390");
}
