//! The policy in front of servers newer than the built-in Redis 7.0.15 table (issue 27): the
//! proxy reads the server's `COMMAND` at connect (`commands::learned`, `server_facts`) and
//! every rule judges the commands and options the table lacks. Each test runs in front of each
//! server of the matrix (`common::matrix_servers`: Redis 8.0 and Valkey 9.1 from
//! `scripts/build-servers.sh`), checking what the server has (`COMMAND INFO`), so a finding
//! of the issue is tested wherever the server can show it.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{Proxy, Raw, RedisServer, resp};

const SEVEN_DAYS_MS: i64 = 7 * 24 * 3600 * 1000;

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

/// Whether the server has `command` (`hsetex`, `client|setinfo`).
async fn has(redis: &RedisServer, command: &str) -> bool {
    let words: Vec<&str> = std::iter::once("COMMAND")
        .chain(std::iter::once("DOCS"))
        .chain(command.split('|').take(1))
        .collect();
    let reply = redis.direct(&words).await;
    let known = !reply.starts_with(b"*0\r\n") && !reply.starts_with(b"%0\r\n");
    match command.split_once('|') {
        Some((_, sub)) => known && text(&reply).to_ascii_lowercase().contains(sub),
        None => known,
    }
}

fn int(reply: &[u8]) -> i64 {
    text(reply)
        .trim_start_matches(':')
        .trim_end()
        .parse()
        .unwrap_or_else(|_| panic!("not an integer reply: {}", text(reply)))
}

/// The one integer of a one-element array reply (HTTL, HPTTL).
fn first_int(reply: &[u8]) -> i64 {
    let t = text(reply);
    let line = t
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no element: {t}"));
    line.trim_start_matches(':').parse().unwrap()
}

/// `policy/default.yaml` with every rule enforced, in front of `redis`, after the proxy has
/// read the server's commands (the startup waits for that read).
async fn default_policy(redis: &RedisServer) -> Proxy {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/default.yaml");
    // The read guard too (the rollout leaves it in audit).
    let yaml =
        common::default_policy_enforced().replace("    mode: audit\n", "    mode: enforce\n");
    let mut config =
        redis_policy_proxy::setup::from_yaml(&yaml, &path).expect("default policy loads");
    config.set_upstream(redis.addr());
    Proxy::start(config).await
}

async fn pttl(redis: &RedisServer, key: &str) -> i64 {
    int(&redis.direct(&["PTTL", key]).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_names_the_server_it_is_in_front_of() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        let info = text(&c.call(&["INFO", "proxy"]).await);
        let family = name.split('-').next().unwrap();
        assert!(
            info.contains(&format!("proxy_upstream_server:{family}\r\n")),
            "{name}: {info}"
        );
        let version = name.split('-').nth(1).unwrap();
        assert!(
            info.contains(&format!("proxy_upstream_server_version:{version}.")),
            "{name}: {info}"
        );
        let (_, ready) = common::http_get(proxy.admin, "/readyz").await;
        assert!(
            ready.contains(&format!("upstream server {family} {version}.")),
            "{name}: {ready}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_writes_get_their_ttl_and_stay_under_the_maximum() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        let ten_years = (10 * 365 * 24 * 3600).to_string();
        if has(&redis, "hsetex").await {
            // HSETEX creates a hash: it gets the key TTL (HSET's 3600 s).
            assert_eq!(
                c.call(&["HSETEX", "m:h", "FIELDS", "1", "f", "v"]).await,
                b":1\r\n",
                "{name}"
            );
            let ttl = pttl(&redis, "m:h").await;
            assert!(
                ttl > 0 && ttl <= 3_600_000,
                "{name}: HSETEX left PTTL {ttl}"
            );
            // Field TTLs above the maximum are cut to it, whichever command sets them.
            c.call(&["HSETEX", "m:h2", "EX", &ten_years, "FIELDS", "1", "f", "v"])
                .await;
            c.call(&["HSETEX", "m:h", "FIELDS", "1", "g", "v"]).await;
            c.call(&["HEXPIRE", "m:h", &ten_years, "FIELDS", "1", "g"])
                .await;
            c.call(&["HSETEX", "m:h", "FIELDS", "1", "x", "v"]).await;
            c.call(&["HGETEX", "m:h", "PX", "99999999999999", "FIELDS", "1", "x"])
                .await;
            // A field TTL given, the hash still gets the key TTL.
            let ttl = pttl(&redis, "m:h2").await;
            assert!(ttl > 0, "{name}: HSETEX … EX left the hash with PTTL {ttl}");
            for (key, field) in [("m:h2", "f"), ("m:h", "g"), ("m:h", "x")] {
                let ttl = first_int(&redis.direct(&["HPTTL", key, "FIELDS", "1", field]).await);
                assert!(
                    ttl > 0 && ttl <= SEVEN_DAYS_MS,
                    "{name}: field {key}.{field} has PTTL {ttl}"
                );
            }
        }
        if has(&redis, "msetex").await {
            c.call(&["MSETEX", "1", "m:k1", "v", "KEEPTTL"]).await;
            let ttl = pttl(&redis, "m:k1").await;
            assert!(ttl > 0, "{name}: MSETEX KEEPTTL left PTTL {ttl}");
            c.call(&["MSETEX", "1", "m:k2", "v", "EX", &ten_years])
                .await;
            let ttl = pttl(&redis, "m:k2").await;
            assert!(
                ttl > 0 && ttl <= SEVEN_DAYS_MS,
                "{name}: MSETEX EX 10y left PTTL {ttl}"
            );
        }
        if has(&redis, "vadd").await {
            c.call(&["VADD", "m:v", "VALUES", "2", "1", "2", "e1"])
                .await;
            let ttl = pttl(&redis, "m:v").await;
            assert!(ttl > 0, "{name}: VADD left PTTL {ttl}");
        }
        // Valkey 8.1+: `IFEQ EX` compares with "EX"; it is no expiry option and the key keeps
        // the TTL the rule gives every SET.
        assert_eq!(c.call(&["SET", "m:s", "EX"]).await, b"+OK\r\n");
        let reply = text(&c.call(&["SET", "m:s", "v", "IFEQ", "EX"]).await);
        if reply == "+OK\r\n" {
            assert_eq!(redis.direct(&["GET", "m:s"]).await, b"$1\r\nv\r\n");
            assert!(
                pttl(&redis, "m:s").await > 0,
                "{name}: IFEQ EX stripped the TTL"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_writes_and_reads_meet_the_value_cap_and_the_read_guard() {
    let big = "x".repeat(110 * 1024);
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        let mut tried = Vec::new();
        if has(&redis, "hsetex").await {
            tried.push(c.call(&["HSETEX", "b:h", "FIELDS", "1", "f", &big]).await);
        }
        if has(&redis, "msetex").await {
            tried.push(c.call(&["MSETEX", "1", "b:k", &big]).await);
        }
        if has(&redis, "vsetattr").await {
            c.call(&["VADD", "b:v", "VALUES", "2", "1", "2", "e1"])
                .await;
            let attr = format!("{{\"a\":\"{big}\"}}");
            tried.push(c.call(&["VSETATTR", "b:v", "e1", &attr]).await);
        }
        if has(&redis, "vadd").await {
            // A vector of 2^63-1 floats: refused by the cap (Redis 8.0.6 aborted on it).
            tried.push(
                c.call(&[
                    "VADD",
                    "b:huge",
                    "VALUES",
                    "9223372036854775807",
                    "0.5",
                    "1",
                    "e",
                ])
                .await,
            );
        }
        assert!(!tried.is_empty(), "{name} has none of the newer writes");
        for reply in tried {
            assert!(
                text(&reply).starts_with("-ERR policy max-value-size: "),
                "{name}: {}",
                text(&reply)
            );
        }
        assert_eq!(redis.direct(&["EXISTS", "b:h", "b:k"]).await, b":0\r\n");
        if has(&redis, "vrandmember").await {
            for i in 2..30 {
                let e = format!("e{i}");
                c.call(&["VADD", "b:v", "VALUES", "2", "1", &i.to_string(), &e])
                    .await;
            }
            let reply = text(&c.call(&["VRANDMEMBER", "b:v", "-5000"]).await);
            assert!(
                reply.starts_with("-ERR policy unbounded-reads: "),
                "{name}: {reply}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_admin_commands_are_denied_and_their_reads_allowed() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        if !has(&redis, "commandlog").await {
            continue;
        }
        let proxy = default_policy(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        // SLOWLOG RESET's newer spelling is denied like it.
        let reply = text(&c.call(&["COMMANDLOG", "RESET", "slow"]).await);
        assert!(
            reply.starts_with("-NOPERM policy deny-admin: "),
            "{name}: {reply}"
        );
        // An @admin command newer than the table, by its category.
        let reply = text(
            &c.call(&[
                "CLUSTER",
                "MIGRATESLOTS",
                "SLOTSRANGE",
                "1",
                "2",
                "NODE",
                "x",
            ])
            .await,
        );
        assert!(
            reply.starts_with("-NOPERM policy deny-admin: "),
            "{name}: {reply}"
        );
        // The reads the policy allows by name.
        let reply = text(&c.call(&["COMMANDLOG", "LEN", "slow"]).await);
        assert!(reply.starts_with(':'), "{name}: {reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_count_newer_and_unknown_commands() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let yaml = "rules:\n  - id: rl\n    rate_limit: {requests: 5, window_ms: 60000}\n";
        let mut config = redis_policy_proxy::setup::from_yaml(yaml, Path::new("rl.yaml")).unwrap();
        config.set_upstream(redis.addr());
        let proxy = Proxy::start(config).await;
        let mut c = Raw::connect(proxy.addr).await;
        let newer: &[&str] = if has(&redis, "hgetex").await {
            &["HGETEX", "h", "FIELDS", "1", "f"]
        } else {
            &["WAITAOF", "0", "0", "0"]
        };
        let mut limited = 0;
        for i in 0..20 {
            let reply = if i % 2 == 0 {
                c.call(newer).await
            } else {
                c.call(&["NOSUCHCOMMAND", "x"]).await
            };
            if text(&reply).contains("policy rl:") {
                limited += 1;
            }
        }
        assert_eq!(limited, 15, "{name}: 5 of 20 may pass");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_tenants_keep_the_newer_commands_they_can_be_confined_in() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let (_proxy, mut a, mut b) = common::two_tenants(&redis).await;
        let waitaof = text(&a.call(&["WAITAOF", "0", "0", "0"]).await);
        assert!(waitaof.starts_with("*2"), "{name}: {waitaof}");
        // OFF: ON is refused in front of Redis 8 (`a_no_touch_client_cannot_stop_the_server`).
        assert_eq!(
            a.call(&["CLIENT", "NO-TOUCH", "off"]).await,
            b"+OK\r\n",
            "{name}"
        );
        a.call(&["ZADD", "z", "1", "m"]).await;
        let rank = text(&a.call(&["ZRANK", "z", "m", "WITHSCORE"]).await);
        assert!(rank.starts_with("*2"), "{name}: {rank}");
        assert_eq!(redis.direct(&["ZCARD", "a:z"]).await, b":1\r\n");
        if has(&redis, "hsetex").await {
            assert_eq!(
                a.call(&["HSETEX", "h", "FIELDS", "1", "f", "v"]).await,
                b":1\r\n"
            );
            assert_eq!(redis.direct(&["HGET", "a:h", "f"]).await, b"$1\r\nv\r\n");
            assert_eq!(
                b.call(&["HGETEX", "h", "FIELDS", "1", "f"]).await,
                b"*1\r\n$-1\r\n",
                "{name}: tenant b reads its own h, not a's"
            );
        }
        // CLIENT SETINFO is the client's own: the other tenant's CLIENT INFO does not show it,
        // and no shared upstream connection carries it.
        assert_eq!(
            a.call(&["CLIENT", "SETINFO", "LIB-NAME", "alicelib"]).await,
            b"+OK\r\n",
            "{name}"
        );
        let own = text(&a.call(&["CLIENT", "INFO"]).await);
        assert!(own.contains("lib-name=alicelib"), "{name}: {own}");
        let other = text(&b.call(&["CLIENT", "INFO"]).await);
        assert!(!other.contains("alicelib"), "{name}: {other}");
        let upstream = text(&redis.direct(&["CLIENT", "LIST"]).await);
        assert!(!upstream.contains("alicelib"), "{name}: {upstream}");
        // Valkey 8+'s per-connection traffic counters are the shared connection's, every
        // tenant's: not shown as the client's.
        for field in ["tot-cmds=", "tot-net-in=", "tot-net-out="] {
            if let Some(at) = other.find(field) {
                assert!(
                    other[at + field.len()..].starts_with("0 ")
                        || other[at + field.len()..].starts_with("0\n"),
                    "{name}: {other}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_client_list_filters_are_read_about_the_proxys_clients() {
    for (name, bin) in common::matrix_servers() {
        if !name.starts_with("valkey") {
            continue;
        }
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut me = Raw::connect(proxy.addr).await;
        let mut other = Raw::connect(proxy.addr).await;
        assert_eq!(other.call(&["PING"]).await, b"+PONG\r\n");
        let id = text(&me.call(&["CLIENT", "ID"]).await);
        let id = id.trim_start_matches(':').trim();
        let lines = |reply: Vec<u8>| {
            let t = text(&reply);
            t.lines().filter(|l| l.starts_with("id=")).count()
        };
        // The readiness probe's connection (`Proxy::start`) is closed, but its session ends
        // when the proxy reads the close, which a loaded machine may not have done yet.
        let until = std::time::Instant::now() + common::DEADLINE;
        let mut all = lines(me.call(&["CLIENT", "LIST", "USER", "default"]).await);
        while all > 2 && std::time::Instant::now() < until {
            tokio::time::sleep(common::POLL).await;
            all = lines(me.call(&["CLIENT", "LIST", "USER", "default"]).await);
        }
        assert_eq!(all, 2, "{name}: both clients, the caller included");
        let skip = text(&me.call(&["CLIENT", "LIST", "SKIPME", "yes"]).await);
        assert!(!skip.contains(&format!("id={id} ")), "{name}: {skip}");
        assert_eq!(lines(skip.into_bytes()), 1, "{name}");
        let old = lines(me.call(&["CLIENT", "LIST", "MAXAGE", "100000"]).await);
        assert_eq!(old, 0, "{name}: nobody connected that long ago");
        let reply = text(&me.call(&["CLIENT", "LIST", "USER"]).await);
        assert!(reply.starts_with("-ERR syntax error"), "{name}: {reply}");
    }
}

/// Redis 6.0 (Debian bullseye's; Debian has no 6.2), built by `scripts/build-servers.sh
/// redis-6.0`: older than the proxy supports, and `/readyz` says so instead of serving it
/// with a TTL rule whose `PEXPIRE … NX` the server does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_older_than_7_0_is_named_and_not_ready() {
    let bin = common::server_cache().join("redis-6.0/bin/redis-server");
    if !bin.exists() {
        assert!(
            !common::matrix_required(),
            "redis-6.0 is not built although RPP_SERVER_MATRIX=require"
        );
        eprintln!("SKIPPED: redis-6.0 not built (scripts/build-servers.sh redis-6.0)");
        return;
    }
    let redis = RedisServer::start_binary(&bin, &[]);
    let proxy = default_policy(&redis).await;
    let (status, body) = common::http_get(proxy.admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("upstream server redis 6.0.16 is older than 7.0.0"),
        "{body}"
    );
}

/// Valkey 9.1 runs `CONFIG "SET\0" …` as CONFIG SET, and Redis does when the name's hash
/// lands in SET's bucket: the proxy answers any subcommand name with a NUL as an unknown
/// one, before the rules, in front of every server (`session::route::nul_in_name`), so it
/// never runs (the deny rules would refuse it as CONFIG SET too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_suffixed_subcommands_meet_the_deny_rules() {
    let mut servers = vec![("redis-7.0".to_string(), common::server_binary())];
    servers.extend(
        common::matrix_servers()
            .into_iter()
            .map(|(n, b)| (n.to_string(), b)),
    );
    for (name, bin) in servers {
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut c = Raw::connect(proxy.addr).await;
        let reply = text(&c.call(&["CONFIG", "SET\0", "maxmemory", "12345"]).await);
        assert_eq!(
            reply, "-ERR unknown subcommand 'SET'. Try CONFIG HELP.\r\n",
            "{name}"
        );
        let maxmemory = text(&redis.direct(&["CONFIG", "GET", "maxmemory"]).await);
        assert!(!maxmemory.contains("12345"), "{name}: {maxmemory}");
    }
}

/// Redis 8.0.6 stops (SIGSEGV) when a client with `CLIENT NO-TOUCH ON` writes to a key another
/// client is blocked on: through the proxy any tenant could stop the server for all. In front
/// of Redis 8 the proxy refuses NO-TOUCH ON; in front of Valkey it goes on. Either way the
/// write then wakes the blocked client and the server stays up. Found by the invariant fuzzer
/// with `INVARIANT_FUZZ_NEWER=1` (seed 931307021, step 41,675).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_touch_client_cannot_stop_the_server() {
    for (name, bin) in common::matrix_servers() {
        let redis = RedisServer::start_binary(&bin, &[]);
        let proxy = default_policy(&redis).await;
        let mut blocked = Raw::connect(proxy.addr).await;
        blocked.send(&resp(&["BLPOP", "nt:q", "0"])).await;
        // Blocked on the server once its client shows `cmd=blpop` there.
        let mut waits = 0;
        while !text(&redis.direct(&["CLIENT", "LIST"]).await).contains("cmd=blpop") {
            waits += 1;
            assert!(waits < 500, "{name}: BLPOP never blocked");
            tokio::task::yield_now().await;
        }
        let mut writer = Raw::connect(proxy.addr).await;
        let no_touch = text(&writer.call(&["CLIENT", "NO-TOUCH", "ON"]).await);
        if name.starts_with("redis-8") {
            assert!(
                no_touch.starts_with("-ERR CLIENT NO-TOUCH ON is refused"),
                "{name}: {no_touch}"
            );
        } else {
            assert_eq!(no_touch, "+OK\r\n", "{name}");
        }
        assert_eq!(
            writer.call(&["RPUSH", "nt:q", "x"]).await,
            b":1\r\n",
            "{name}"
        );
        let popped = blocked.read_frames(1).await;
        assert_eq!(
            text(&popped[0]),
            "*2\r\n$4\r\nnt:q\r\n$1\r\nx\r\n",
            "{name}"
        );
        assert_eq!(redis.direct(&["PING"]).await, b"+PONG\r\n", "{name}");
    }
}
