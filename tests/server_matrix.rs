//! The proxy in front of the newer servers of the matrix (docs/compatibility.md): Redis 8.0 and
//! Valkey 9.1 as `scripts/build-servers.sh` builds them, beside Debian's redis-server 7.0.15
//! that every other test runs against. What is checked here is what the proxy knows today
//! (the 7.0 command table): the data path, RESP3, the default policy's rules on the commands
//! it knows, namespaced tenants, a cluster and a Sentinel-managed primary. What the issue-27
//! findings are about (commands and options newer than 7.0) is not here: those need proxy
//! behaviour that does not exist yet.
//!
//! A server that is not built is skipped with a `SKIPPED:` line, or fails the test under
//! `RPP_SERVER_MATRIX=require` (which `.ci/run` sets once the build succeeded):
//! `common::matrix_servers`.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::cluster::RedisCluster;
use common::sentinel::{MASTER, SentinelSetup};
use common::{DEADLINE, Proxy, Raw, RedisServer};

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// `INFO server`'s version of the server family `name` names (`valkey_version` on Valkey,
/// whose `redis_version` stays 7.2.4 for clients that test it).
async fn server_version(redis: &RedisServer, name: &str) -> String {
    let info = text(&redis.direct(&["INFO", "server"]).await);
    let field = if name.starts_with("valkey") {
        "valkey_version:"
    } else {
        "redis_version:"
    };
    info.lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in INFO server: {info}"))
        .trim()
        .to_string()
}

/// `policy/default.yaml`, every data-changing rule enforced, in front of `redis`.
async fn default_policy(redis: &RedisServer) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    let mut config =
        redis_policy_proxy::setup::from_yaml(&common::default_policy_enforced(), &path)
            .expect("default policy loads");
    config.set_upstream(redis.addr());
    Proxy::start(config).await
}

async fn pttl(redis: &RedisServer, key: &str) -> i64 {
    let reply = text(&redis.direct(&["PTTL", key]).await);
    reply.trim_start_matches(':').trim_end().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_matrix_server_is_the_version_it_is_named_after_and_serves_through_the_proxy() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let version = server_version(&redis, name).await;
        let want = name.split('-').nth(1).unwrap();
        assert!(
            version.starts_with(&format!("{want}.")),
            "{name}: {} reports version {version}",
            bin.display()
        );
        let proxy = Proxy::to(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n", "{name}");
        assert_eq!(c.call(&["GET", "k"]).await, b"$1\r\nv\r\n", "{name}");
        assert_eq!(c.call(&["HSET", "h", "f", "1"]).await, b":1\r\n", "{name}");
        // RESP3 through the proxy: HELLO's map, then a map reply.
        let hello = c.call(&["HELLO", "3"]).await;
        assert!(hello.starts_with(b"%"), "{name}: {}", text(&hello));
        assert!(
            text(&hello).contains(&version),
            "{name}: HELLO names the server's version: {}",
            text(&hello)
        );
        assert_eq!(
            c.call(&["HGETALL", "h"]).await,
            b"%1\r\n$1\r\nf\r\n$1\r\n1\r\n",
            "{name}"
        );
        // A pipeline's replies in order, MULTI/EXEC on the session's own connection.
        c.send(b"MULTI\r\nINCR n\r\nINCR n\r\nEXEC\r\nGET n\r\n")
            .await;
        assert_eq!(
            c.collect_frames(5, DEADLINE).await.joined(),
            b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1\r\n:2\r\n$1\r\n2\r\n",
            "{name}"
        );
        eprintln!(
            "{name}: {} ({version}) serves through the proxy",
            bin.display()
        );
    }
}

/// The rules on the commands the proxy's table knows: deny rules, range guards, the value cap
/// and the TTL rule (its hidden `PEXPIRE … NX` needs 7.0, which every matrix server has), and
/// the guide's patterns unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_policy_holds_for_known_commands_on_each_matrix_server() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        assert!(
            text(&c.call(&["KEYS", "*"]).await).starts_with("-NOPERM policy deny-keys: "),
            "{name}"
        );
        assert_eq!(c.call(&["SET", "keep", "1"]).await, b"+OK\r\n");
        assert!(
            text(&c.call(&["FLUSHALL"]).await).starts_with("-NOPERM policy deny-flush: "),
            "{name}"
        );
        assert!(
            text(&c.call(&["CONFIG", "SET", "maxmemory", "1"]).await)
                .starts_with("-NOPERM policy deny-admin: "),
            "{name}"
        );
        assert_eq!(redis.direct(&["EXISTS", "keep"]).await, b":1\r\n", "{name}");
        let reply = text(&c.call(&["SCAN", "0", "COUNT", "5000"]).await);
        assert!(
            reply.starts_with("-ERR policy scan-count: "),
            "{name}: {reply}"
        );
        let big = "x".repeat(102_401);
        let reply = text(&c.call(&["SET", "blob", &big]).await);
        assert!(
            reply.starts_with("-ERR policy max-value-size: "),
            "{name}: {reply}"
        );
        let reply = text(&c.call(&["HSET", "hblob", "f", &big]).await);
        assert!(
            reply.starts_with("-ERR policy max-value-size: "),
            "{name}: {reply}"
        );
        assert_eq!(redis.direct(&["EXISTS", "blob", "hblob"]).await, b":0\r\n");

        let hour = 3_600_000;
        let writes: &[(&[&str], &str)] = &[
            (&["SET", "s", "v"], "s"),
            (&["HSET", "h", "f", "v"], "h"),
            (&["SADD", "set", "a"], "set"),
            (&["ZADD", "z", "1", "a"], "z"),
            (&["RPUSH", "l", "a"], "l"),
            (&["INCR", "counter"], "counter"),
            (&["PFADD", "hll", "a"], "hll"),
            (&["COPY", "s", "copy"], "copy"),
        ];
        for (cmd, key) in writes {
            let reply = c.call(cmd).await;
            assert!(
                !reply.starts_with(b"-"),
                "{name}: {cmd:?}: {}",
                text(&reply)
            );
            let ttl = pttl(&redis, key).await;
            assert!(
                ttl > hour - 60_000 && ttl <= hour,
                "{name}: {cmd:?}: PTTL {key} = {ttl}"
            );
        }
        c.call(&["EXPIRE", "h", "30"]).await;
        c.call(&["HSET", "h", "g", "w"]).await;
        assert!(
            pttl(&redis, "h").await <= 30_000,
            "{name}: a chosen TTL is kept"
        );
        assert_eq!(
            c.call(&["SETEX", "long", "99999999", "v"]).await,
            b"+OK\r\n"
        );
        assert!(
            pttl(&redis, "long").await <= 604_800_000,
            "{name}: TTL cut to 7 days"
        );
        let reply = text(&c.call(&["PERSIST", "long"]).await);
        assert!(
            reply.starts_with("-NOPERM policy ttl-default: "),
            "{name}: {reply}"
        );

        // The guide's patterns: a Lua rate limit, a stream with a consumer group, pub/sub.
        common::guide_patterns(&mut c, proxy.addr, name).await;
        assert!(
            pttl(&redis, "events").await > 0,
            "{name}: the stream has a TTL"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_tenants_stay_in_their_namespace_on_each_matrix_server() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let (_proxy, mut a, mut b) = common::two_tenants(&redis).await;
        assert_eq!(a.call(&["SET", "k", "from-a"]).await, b"+OK\r\n", "{name}");
        assert_eq!(b.call(&["SET", "k", "from-b"]).await, b"+OK\r\n", "{name}");
        assert_eq!(a.call(&["GET", "k"]).await, b"$6\r\nfrom-a\r\n", "{name}");
        assert_eq!(redis.direct(&["GET", "a:k"]).await, b"$6\r\nfrom-a\r\n");
        assert_eq!(redis.direct(&["GET", "b:k"]).await, b"$6\r\nfrom-b\r\n");
        assert_eq!(redis.direct(&["EXISTS", "k"]).await, b":0\r\n", "{name}");
        assert_eq!(
            a.call(&["SCAN", "0", "COUNT", "100"]).await,
            b"*2\r\n$1\r\n0\r\n*1\r\n$1\r\nk\r\n",
            "{name}: SCAN shows the tenant's own names only"
        );
        a.send(b"MULTI\r\nINCR n\r\nEXEC\r\n").await;
        assert_eq!(
            a.collect_frames(3, DEADLINE).await.joined(),
            b"+OK\r\n+QUEUED\r\n*1\r\n:1\r\n",
            "{name}"
        );
        assert_eq!(
            redis.direct(&["GET", "a:n"]).await,
            b"$1\r\n1\r\n",
            "{name}"
        );
        // MSETEX (Valkey 9.1): `numkeys` key/value pairs, a key every second argument. Its
        // third key went unprefixed while the proxy read the spec's last key as
        // `first + numkeys - 1` (namespace sweep, seed 451896339).
        if text(&redis.direct(&["COMMAND", "INFO", "MSETEX"]).await).contains("msetex") {
            let reply = a
                .call(&[
                    "MSETEX", "3", "m1", "x", "m2", "y", "m3", "z", "PX", "100000",
                ])
                .await;
            assert!(!reply.starts_with(b"-"), "{name}: {}", text(&reply));
            for key in ["m1", "m2", "m3"] {
                assert_eq!(
                    redis.direct(&["EXISTS", key]).await,
                    b":0\r\n",
                    "{name}: {key}"
                );
                let prefixed = format!("a:{key}");
                assert_eq!(
                    redis.direct(&["EXISTS", &prefixed]).await,
                    b":1\r\n",
                    "{name}: {prefixed}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_each_matrix_server_is_routed_by_slot() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisCluster::start_binary(&bin, 3, 0, &[]);
        let seed = redis.live_addrs()[0].clone();
        let proxy = Proxy::start(common::cluster::proxy_config(&seed, &[])).await;
        let mut c = Raw::connect(proxy.addr).await;
        for i in 0..60 {
            let key = format!("k{i}");
            assert_eq!(c.call(&["SET", &key, &key]).await, b"+OK\r\n", "{name}");
        }
        for i in (0..60).step_by(7) {
            let key = format!("k{i}");
            let want = format!("${}\r\n{key}\r\n", key.len());
            assert_eq!(text(&c.call(&["GET", &key]).await), want, "{name}");
        }
        // Every primary got some of the keys: the proxy routed by slot.
        for node in redis.primaries() {
            let size = text(&Raw::connect(&node).await.call(&["DBSIZE"]).await);
            assert_ne!(size, ":0\r\n", "{name}: {node} got no key");
        }
        // MSET over several slots is split by the proxy, in the client's order; MSETNX, which
        // cannot be split, gets Redis's CROSSSLOT.
        assert_eq!(
            c.call(&["MSET", "a", "1", "b", "2", "c", "3"]).await,
            b"+OK\r\n",
            "{name}"
        );
        assert_eq!(
            c.call(&["MGET", "c", "b", "a"]).await,
            b"*3\r\n$1\r\n3\r\n$1\r\n2\r\n$1\r\n1\r\n",
            "{name}"
        );
        let reply = text(&c.call(&["MSETNX", "a", "1", "b", "2"]).await);
        assert!(reply.starts_with("-CROSSSLOT"), "{name}: {reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_managed_primary_of_each_matrix_server_is_served() {
    for (name, bin) in common::matrix_servers() {
        let setup = SentinelSetup::start_binary(&bin);
        let text_yaml = format!(
            "upstream:\n  mode: sentinel\n  sentinel:\n    sentinels: [{}]\n    master_name: {MASTER}\n    timeout_ms: 500\n",
            setup.sentinel_addrs().join(", ")
        );
        let config =
            redis_policy_proxy::setup::from_yaml(&text_yaml, Path::new("sentinel-test.yaml"))
                .expect("sentinel config parses");
        let proxy = Proxy::start(config).await;
        let mut c = Raw::connect(proxy.addr).await;
        assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n", "{name}");
        assert_eq!(
            setup.primary.direct(&["GET", "k"]).await,
            b"$1\r\nv\r\n",
            "{name}: the write reached the primary"
        );
        assert_eq!(c.call(&["GET", "k"]).await, b"$1\r\nv\r\n", "{name}");
    }
}

/// CLIENT subcommands spelled with a NUL byte, in front of Debian's 7.0 and each matrix
/// server. Redis 6 (`strcasecmp` in each parser) and Valkey 9.1 (its subcommand lookup) run
/// `REPLY\0` as REPLY; Redis 7+ refuses it. The proxy answers every such name as unknown
/// (`session::route::nul_in_name`), in Redis 7's words, so none reaches a shared upstream
/// connection: another client of it keeps tracking off, no name and its replies, and the
/// upstream's client list never reaches a tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_subcommands_spelled_with_a_nul_never_reach_a_shared_connection() {
    let mut servers = vec![("redis-7.0", common::server_binary())];
    servers.extend(common::matrix_servers());
    for (name, bin) in servers {
        let redis = RedisServer::start_binary(&bin, &[]);
        let mut config = common::config_for(&redis.addr());
        config.upstream.connections.value = 1;
        config.upstream.dedicated_warm.value = 0;
        let proxy = Proxy::start(config).await;
        let mut a = Raw::connect(proxy.addr).await;
        let mut b = Raw::connect(proxy.addr).await;
        assert_eq!(b.call(&["PING"]).await, b"+PONG\r\n", "{name}");

        for (command, sub) in [
            (&["CLIENT", "TRACKING\0", "ON"][..], "TRACKING"),
            (&["CLIENT", "SETNAME\0x", "named"], "SETNAME"),
            (&["CLIENT", "LIST\0"], "LIST"),
            (&["CLIENT", "KILL\0", "TYPE", "normal"], "KILL"),
        ] {
            let reply = text(&a.call(command).await);
            assert_eq!(
                reply,
                format!("-ERR unknown subcommand '{sub}'. Try CLIENT HELP.\r\n"),
                "{name}: {command:?}"
            );
        }
        // REPLY OFF refused: the refusal, then the next command's reply.
        a.send(&common::resp(&["CLIENT", "REPLY\0", "OFF"])).await;
        a.send(&common::resp(&["PING", "seen"])).await;
        let got = a.collect_frames(2, DEADLINE).await.joined();
        assert_eq!(
            text(&got),
            "-ERR unknown subcommand 'REPLY'. Try CLIENT HELP.\r\n$4\r\nseen\r\n",
            "{name}"
        );

        // The shared connection took none of it (TRACKINGINFO is 6.2+; before it, the
        // flags of every upstream connection but the one asking).
        let tracking = if name == "redis-6.0" {
            let list = text(&redis.direct(&["CLIENT", "LIST"]).await);
            list.lines().filter(|l| !l.contains("cmd=client")).any(|l| {
                l.split(' ')
                    .any(|f| f.starts_with("flags=") && f.contains('t'))
            })
        } else {
            let info = b.call(&["CLIENT", "TRACKINGINFO"]).await;
            !info.starts_with(b"*6\r\n$5\r\nflags\r\n*1\r\n$3\r\noff\r\n")
        };
        assert!(!tracking, "{name}: tracking went on a shared connection");
        assert!(
            !text(&redis.direct(&["CLIENT", "LIST"]).await).contains("name=named"),
            "{name}: an upstream connection took the name"
        );
        assert_eq!(b.call(&["PING"]).await, b"+PONG\r\n", "{name}");
    }
}
