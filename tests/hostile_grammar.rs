//! A hostile client's spellings of commands, through the proxy and a real redis-server: two
//! namespaced tenants behind `policy/default.yaml` with every rule enforced. Each case is one
//! the rules once read differently from Redis (a keyword with a NUL suffix, a repeated or
//! decoy option, a destination GETKEYS misreports); each checks what Redis itself holds
//! afterwards, not only the reply.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use std::path::Path;

use common::{Proxy, Raw, RedisServer};

const ALICE: &str = "6624974ea2baffac164422e4490376c1c31313cd97724ae8ce62fb3f0a0370f2"; // alicepw
const BOB: &str = "e8f318657ce39ec4edeecbbee28fd72dea2261d8a6b2155ce4977393e0ea721b"; // bobpw

/// Seven days in ms: default.yaml's `max`.
const MAX_TTL_MS: i64 = 604_800_000;

/// default.yaml with every rule enforced (the range guard too), and tenants `a` (alice) and
/// `b` (bob) in namespaces `a:` and `b:`.
async fn proxy(redis: &RedisServer) -> Proxy {
    let base =
        common::default_policy_enforced().replace("    mode: audit\n", "    mode: enforce\n");
    assert!(!base.contains("mode: audit\n"), "every rule enforced");
    let yaml = format!(
        "{base}\naccess:\n  require_auth: true\n  users:\n    - {{name: alice, password_sha256: {ALICE}}}\n    - {{name: bob, password_sha256: {BOB}}}\n  identities:\n    - {{tenant: a, user: alice}}\n    - {{tenant: b, user: bob}}\n  namespaces:\n    a: 'a:'\n    b: 'b:'\n"
    );
    let mut config =
        redis_policy_proxy::setup::from_yaml(&yaml, Path::new("hostile.yaml")).unwrap();
    config.set_upstream(redis.addr());
    Proxy::spawn(config).await
}

async fn login(proxy: &Proxy, user: &str, password: &str) -> Raw {
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.call(&["AUTH", user, password]).await, b"+OK\r\n");
    c
}

fn text(reply: &[u8]) -> String {
    String::from_utf8_lossy(reply).into_owned()
}

async fn pttl(redis: &RedisServer, key: &str) -> i64 {
    let reply = text(&redis.direct(&["PTTL", key]).await);
    reply.trim_start_matches(':').trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_suffixed_and_repeated_expiry_options_are_judged_as_redis_applies_them() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    assert_eq!(a.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    let reply = a.call(&[&b"GETEX"[..], b"k", b"PERSIST\0"]).await;
    assert!(text(&reply).starts_with("-"), "{}", text(&reply));
    assert!(
        pttl(&redis, "a:k").await > 0,
        "GETEX PERSIST\\0 kept the TTL"
    );

    // A word Redis 7.0 does not know (Valkey 8.1's IFEQ takes the next word as its value, so
    // `SET k v IFEQ EX` would drop the TTL there): refused, never forwarded unjudged.
    let reply = text(&a.call(&["SET", "k", "v", "IFEQ", "EX"]).await);
    assert!(reply.contains("syntax error"), "{reply}");
    assert!(pttl(&redis, "a:k").await > 0);

    for args in [
        vec![&b"GETEX"[..], b"k", b"EX\0", b"99999999999"],
        vec![&b"SET"[..], b"k", b"v", b"EX", b"10", b"EX", b"99999999999"],
        vec![&b"SET"[..], b"k", b"v", b"pxat\0x", b"99999999999999"],
    ] {
        let reply = a.call(&args).await;
        assert!(!text(&reply).starts_with("-"), "{args:?}: {}", text(&reply));
        let ttl = pttl(&redis, "a:k").await;
        assert!(ttl > 0 && ttl <= MAX_TTL_MS, "{args:?}: PTTL {ttl}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_created_without_a_ttl_get_one_whatever_the_form() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    assert_eq!(a.call(&["PFMERGE", "hll"]).await, b"+OK\r\n");
    assert!(
        pttl(&redis, "a:hll").await > 0,
        "PFMERGE dest with no sources"
    );
    assert_eq!(a.call(&["SET", "src", "v"]).await, b"+OK\r\n");
    redis.direct(&["PERSIST", "a:src"]).await;
    assert_eq!(a.call(&["COPY", "src", "dst", "DB", "0"]).await, b":1\r\n");
    assert!(pttl(&redis, "a:dst").await > 0, "COPY … DB 0");
    // The lock: prefix keeps a lock's own PX, and gives 30 s to other writes under it.
    assert_eq!(a.call(&["HSET", "lock:h", "f", "v"]).await, b":1\r\n");
    let ttl = pttl(&redis, "a:lock:h").await;
    assert!(ttl > 0 && ttl <= 30_000, "lock: hash: {ttl}");
    assert_eq!(
        a.call(&["SET", "lock:job", "t", "NX", "PX", "5000"]).await,
        b"+OK\r\n"
    );
    let ttl = pttl(&redis, "a:lock:job").await;
    assert!(ttl > 4_000 && ttl <= 5_000, "lock keeps its PX: {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destinations_are_the_ones_the_command_writes() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    let mut b = login(&proxy, "bob", "bobpw").await;
    assert_eq!(b.call(&["SET", "secret", "bobs"]).await, b"+OK\r\n");
    assert_eq!(a.call(&["RPUSH", "mine", "x"]).await, b":1\r\n");
    // From a's side, `b:secret` is a name inside a's namespace; raw `b:secret` is bob's key.
    let reply = a
        .call(&[
            "SORT", "mine", "ALPHA", "LIMIT", "0", "10", "STORE", "limit", "STORE", "b:secret",
        ])
        .await;
    assert_eq!(reply, b":1\r\n");
    assert_eq!(redis.direct(&["GET", "b:secret"]).await, b"$4\r\nbobs\r\n");
    assert_eq!(redis.direct(&["TYPE", "a:b:secret"]).await, b"+list\r\n");

    assert_eq!(
        a.call(&["GEOADD", "g", "13.361389", "38.115556", "p"])
            .await,
        b":1\r\n"
    );
    let reply = a
        .call(&[
            "GEORADIUS",
            "g",
            "13",
            "38",
            "200",
            "km",
            "COUNT",
            "10",
            "STORE",
            "x",
            "STORE",
            "b:secret",
        ])
        .await;
    assert_eq!(reply, b":1\r\n");
    assert_eq!(redis.direct(&["GET", "b:secret"]).await, b"$4\r\nbobs\r\n");
    assert!(
        pttl(&redis, "a:b:secret").await > 0,
        "the written key got its TTL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_see_every_spelling_of_a_large_read() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    for args in [
        vec![&b"SCAN"[..], b"0", b"COUNT\0", b"5000"],
        vec![
            &b"SCAN"[..],
            b"0",
            b"COUNT",
            b"5000",
            b"MATCH",
            b"COUNT",
            b"MATCH",
            b"*",
        ],
        vec![&b"ZRANGE"[..], b"z", b"-inf", b"+inf", b"BYSCORE\0"],
        vec![&b"XRANGE"[..], b"s", b"-", b"+", b"COUNT\0", b"100000"],
        vec![&b"LMPOP"[..], b"1", b"l", b"LEFT", b"COUNT\0", b"100000"],
        vec![
            &b"SORT"[..],
            b"l",
            b"GET",
            b"#",
            b"BY",
            b"LIMIT",
            b"GET",
            b"10",
        ],
    ] {
        let reply = text(&a.call(&args).await);
        assert!(reply.starts_with("-ERR policy"), "{args:?}: {reply}");
    }
    // The value cap sees BITFIELD's type read as Redis reads it (`u8\0` is u8).
    let reply = text(
        &a.call(&[&b"BITFIELD"[..], b"bf", b"SET", b"u8\0", b"8000000", b"1"])
            .await,
    );
    assert!(reply.starts_with("-ERR policy max-value-size"), "{reply}");
    assert_eq!(redis.direct(&["EXISTS", "a:bf"]).await, b":0\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_stream_read_of_any_spelling_never_blocks_the_shared_connection() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    let mut b = login(&proxy, "bob", "bobpw").await;
    assert_eq!(
        a.call(&["XGROUP", "CREATE", "xs", "STREAMS", "$", "MKSTREAM"])
            .await,
        b"+OK\r\n"
    );
    // A group named STREAMS, then BLOCK: Redis blocks the reader.
    a.send(&common::resp(&[
        "XREADGROUP",
        "GROUP",
        "STREAMS",
        "c1",
        "BLOCK",
        "0",
        "STREAMS",
        "xs",
        ">",
    ]))
    .await;
    redis.wait_blocked_clients(1).await;
    let mut a2 = login(&proxy, "alice", "alicepw").await;
    a2.send(&common::resp(&[
        &b"XREAD"[..],
        b"BLOCK\0",
        b"0",
        b"STREAMS",
        b"xs",
        b"$",
    ]))
    .await;
    redis.wait_blocked_clients(2).await;
    // Bob's commands go through the shared connection, which neither read holds.
    for _ in 0..3 {
        assert_eq!(b.call(&["PING"]).await, b"+PONG\r\n");
    }
    assert_eq!(b.call(&["SET", "k", "v"]).await, b"+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_options_with_nul_suffixes_stay_confined() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut a = login(&proxy, "alice", "alicepw").await;
    // A live upstream client id: Redis would accept the redirect to it.
    let mut direct = redis.raw().await;
    let id = text(&direct.call(&["CLIENT", "ID"]).await);
    let id = id.trim_start_matches(':').trim().to_string();
    let reply = text(
        &a.call(&[
            &b"CLIENT"[..],
            b"TRACKING",
            b"on",
            b"REDIRECT\0",
            id.as_bytes(),
        ])
        .await,
    );
    assert!(reply.starts_with("-"), "REDIRECT\\0 refused: {reply}");
    // BCAST\0 is BCAST: the namespace's PREFIX is added, so another tenant's writes are not
    // announced to this client.
    let mut b = login(&proxy, "bob", "bobpw").await;
    let mut t = login(&proxy, "alice", "alicepw").await;
    assert_eq!(t.call(&["HELLO", "3"]).await[0], b'%');
    assert_eq!(
        t.call(&[&b"CLIENT"[..], b"TRACKING", b"on", b"BCAST\0"])
            .await,
        b"+OK\r\n"
    );
    assert_eq!(b.call(&["SET", "bobkey", "v"]).await, b"+OK\r\n");
    assert_eq!(a.call(&["SET", "mine", "v"]).await, b"+OK\r\n");
    // The first push t gets is about its own tenant's key.
    let push = text(&t.read_frame().await);
    assert!(push.contains("mine") && !push.contains("bobkey"), "{push}");
}

/// HELLO's options are read as Redis reads them: `AUTH\0` logs in (the proxy checks a proxy
/// user's password, a wrong one is refused), `SETNAME\0` names the connection. (They were
/// refused as unknown options, where Redis accepts them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_options_with_nul_suffixes_work_as_directly() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let mut c = Raw::connect(proxy.addr).await;
    let wrong = text(
        &c.call(&[&b"HELLO"[..], b"3", b"AUTH\0", b"alice", b"nope"])
            .await,
    );
    assert!(wrong.starts_with("-WRONGPASS"), "{wrong}");
    let hello = c
        .call(&[
            &b"HELLO"[..],
            b"3",
            b"AUTH\0x",
            b"alice",
            b"alicepw",
            b"SETNAME\0",
            b"n1",
        ])
        .await;
    assert_eq!(hello[0], b'%', "{}", text(&hello));
    assert_eq!(c.call(&["CLIENT", "GETNAME"]).await, b"$2\r\nn1\r\n");
    // Alice's namespace applies: her key is stored under her prefix.
    assert_eq!(c.call(&["SET", "k", "v"]).await, b"+OK\r\n");
    assert_eq!(redis.direct(&["EXISTS", "k"]).await, b":0\r\n");
}

/// Redis finds command names in a hash table hashed over the whole name but compared with
/// `strcasecmp`: `PING\0<junk>` runs PING when its hash lands in PING's bucket, which depends
/// on the junk and the server's random seed. Straight to Redis, some of a few thousand
/// spellings run the command (about one in 200 on Redis 7.0); through the proxy none may,
/// or `FLUSHALL\0<junk>` would get past `deny-flush` for whoever tries enough of them. The
/// same for a subcommand (`CLIENT REPLY\0 OFF` once went to a shared connection as an
/// unknown one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_in_a_command_name_never_runs_the_command() {
    const SPELLINGS: usize = 3000;
    let redis = RedisServer::start();
    let proxy = proxy(&redis).await;
    let pings = |n: usize| {
        let mut out = Vec::new();
        for i in 0..n {
            out.extend(common::resp(&[format!("PING\0{i}")]));
        }
        out
    };
    // Directly, the premise: some spellings run PING.
    let mut direct = redis.raw().await;
    direct.send(&pings(SPELLINGS)).await;
    let replies = direct.read_frames(SPELLINGS).await;
    let ran = replies
        .iter()
        .filter(|r| r.as_slice() == b"+PONG\r\n")
        .count();
    assert!(
        ran > 0,
        "no NUL-suffixed PING ran on Redis itself: the premise changed"
    );

    let mut c = login(&proxy, "alice", "alicepw").await;
    c.send(&pings(SPELLINGS)).await;
    for (i, reply) in c.read_frames(SPELLINGS).await.iter().enumerate() {
        assert_eq!(
            text(reply),
            "-ERR unknown command 'PING', with args beginning with: \r\n",
            "spelling {i}"
        );
    }
    let mut c = login(&proxy, "bob", "bobpw").await;
    let mut ctl = redis.raw().await;
    assert_eq!(ctl.call(&["SET", "canary", "v"]).await, b"+OK\r\n");
    let mut flushes = Vec::new();
    for i in 0..SPELLINGS {
        flushes.extend(common::resp(&[format!("FLUSHALL\0{i}")]));
    }
    c.send(&flushes).await;
    c.read_frames(SPELLINGS).await;
    assert_eq!(ctl.call(&["EXISTS", "canary"]).await, b":1\r\n");
    // A subcommand: the session's own reading of CLIENT REPLY must not be bypassed either.
    let mut subs = Vec::new();
    for i in 0..200 {
        subs.extend(common::resp(&["CLIENT", &format!("REPLY\0{i}"), "OFF"]));
    }
    subs.extend(common::resp(&["PING", "still-here"]));
    c.send(&subs).await;
    let replies = c.read_frames(201).await;
    assert!(text(&replies[0]).starts_with("-ERR unknown subcommand 'REPLY'. Try CLIENT HELP."));
    assert_eq!(replies[200], b"$10\r\nstill-here\r\n");
}
