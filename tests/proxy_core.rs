//! The proxy against a real redis-server: transparency (byte-for-byte the same replies as
//! Redis), connection state (RESP version, db, name, transactions, subscriptions, tracking),
//! pipelining, blocking commands, scripts, upstream failures and graceful shutdown.

#![allow(
    clippy::disallowed_methods,
    reason = "integration tests wait on real redis-server and proxy processes in wall-clock time"
)]

mod common;

use common::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

// ---------------------------------------------------------------------------------------------
// Transparency
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_multibulk_commands_match_redis() {
    let pair = Pair::start().await;
    assert_eq!(pair.compare(b"PING\r\n", 1).await, b"+PONG\r\n");
    assert_eq!(pair.compare(b"*1\r\n$4\r\nPING\r\n", 1).await, b"+PONG\r\n");
    // LF-only terminator, arguments, quoting and escapes in inline commands.
    pair.compare(
        b"PING\nECHO hello\r\nSET \"a b\" 'c d'\r\nGET \"a b\"\r\nECHO \"x\\x41\\ty\"\r\n",
        5,
    )
    .await;
    // Empty lines and empty or null multibulks are skipped, as Redis does.
    assert_eq!(
        pair.compare(b"\r\n\n*0\r\n*-1\r\nPING\r\n", 1).await,
        b"+PONG\r\n"
    );
    // A bare bulk header at top level is an inline command named "$3".
    pair.compare(b"$3\r\nfoo\r\n", 2).await;
}

fn resp2_battery() -> (Vec<u8>, usize) {
    let mut input = resp_cmds(&[
        "SET s hello",
        "GET s",
        "GET missing",
        "INCR n",
        "INCRBY n 41",
        "INCRBYFLOAT f 1.5",
        "APPEND s !!",
        "STRLEN s",
        "MSET a 1 b 2",
        "MGET a b missing",
        "DEL a b missing",
        "EXISTS s",
        "TYPE s",
        "RPUSH l x y z",
        "LRANGE l 0 -1",
        "LPOP l",
        "HSET h f1 v1 f2 v2",
        "HGETALL h",
        "HGET h nope",
        "SADD set 3 1 2",
        "SMEMBERS set",
        "ZADD z 1 one 2.5 two",
        "ZRANGE z 0 -1 WITHSCORES",
        "ZSCORE z two",
        "XADD st 1-1 a 1",
        "XRANGE st - +",
        "GET l",
        "NOSUCHCOMMAND arg",
        "GET",
        "SET s v EX notanumber",
        "OBJECT ENCODING s",
        "EXPIRE s 100",
        "TTL s",
        "PERSIST s",
        "DBSIZE",
        "HELLO 4",
        "CONFIG GET maxmemory-policy",
    ]);
    let mut n = 37;
    input.extend_from_slice(&resp(&["ECHO", ""]));
    input.extend_from_slice(&resp(&[&b"SET"[..], b"bin", b"a\r\nb\0c$3\r\n*1\r\n"]));
    input.extend_from_slice(&resp(&["GET", "bin"]));
    let big = vec![b'x'; 1 << 20];
    input.extend_from_slice(&resp(&[&b"SET"[..], b"big", &big]));
    input.extend_from_slice(&resp(&["GET", "big"]));
    n += 5;
    (input, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_byte_identical_to_redis_resp2() {
    let pair = Pair::start().await;
    let (input, n) = resp2_battery();
    pair.compare(&input, n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_byte_identical_to_redis_resp3() {
    let pair = Pair::start().await;
    let (battery, n) = resp2_battery();
    let mut extra = resp_cmds(&[
        "HGETALL nope",
        "SMEMBERS set",
        "ZSCORE z one",
        "ZRANGE z 0 -1 WITHSCORES",
        "EXISTS s",
        "CONFIG GET maxmemory",
        "ZINCRBY z 0.5 one",
        "HELLO",
    ]);
    extra.extend_from_slice(&resp_cmds(&["HELLO 2", "HGETALL h", "GET missing"]));
    pair.compare_steps(&[
        step(0, b"HELLO 3\r\n", 1),
        step(0, &battery, n),
        step(0, &extra, 11),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp2_and_resp3_clients_share_the_port() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    redis.direct(&["HSET", "h", "f", "v"]).await;

    let mut r2 = Raw::connect(proxy.addr).await;
    let mut r3 = Raw::connect(proxy.addr).await;
    assert!(r3.request(b"HELLO 3\r\n", 1).await.starts_with(b"%7\r\n"));
    let rounds = 200;
    let batch = resp_cmds(&["HGETALL h", "GET missing"]).repeat(rounds);
    // Both clients pipeline at the same time, so a shared upstream could mix them up.
    let (a, b) = tokio::join!(
        r2.request(&batch, 2 * rounds),
        r3.request(&batch, 2 * rounds)
    );
    let want2 = b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n$-1\r\n".repeat(rounds);
    let want3 = b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n_\r\n".repeat(rounds);
    assert!(a == want2, "RESP2 client got {}", show(&a));
    assert!(b == want3, "RESP3 client got {}", show(&b));

    // The redis crate, both protocols.
    let mut c2 = connect(&proxy.url()).await;
    let (mut c3, _pushes) = connect_resp3(&proxy.url()).await;
    for _ in 0..20 {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg("h");
        let (v2, v3) = tokio::join!(
            cmd.query_async::<redis::Value>(&mut c2),
            cmd.query_async::<redis::Value>(&mut c3),
        );
        assert!(matches!(v2.unwrap(), redis::Value::Array(_)));
        assert!(matches!(v3.unwrap(), redis::Value::Map(_)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crate_commands_pipelines_and_transactions() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut con = connect(&proxy.url()).await;
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    let missing: Option<String> = redis::cmd("GET")
        .arg("nope")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(missing, None);
    let err = redis::cmd("INCR")
        .arg("k")
        .query_async::<i64>(&mut con)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not an integer"), "{err}");

    let (a, b): (i64, i64) = redis::pipe()
        .cmd("INCR")
        .arg("p")
        .cmd("INCRBY")
        .arg("p")
        .arg(10)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((a, b), (1, 11));
    let (x, y): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("INCR")
        .arg("t")
        .cmd("INCR")
        .arg("t")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!((x, y), (1, 2));

    // Many concurrent requests on one multiplexed connection keep their pairing.
    let futs = (0..200).map(|i| {
        let mut c = con.clone();
        async move {
            let echoed: String = redis::cmd("ECHO")
                .arg(format!("m{i}"))
                .query_async(&mut c)
                .await
                .unwrap();
            assert_eq!(echoed, format!("m{i}"));
        }
    });
    tokio::time::timeout(DEADLINE, futures_join_all(futs))
        .await
        .expect("concurrent requests timed out");
    assert_eq!(redis.direct(&["GET", "t"]).await, b"$1\r\n2\r\n");
}

async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) {
    let mut set = tokio::task::JoinSet::new();
    for f in futs {
        set.spawn(f);
    }
    while let Some(r) = set.join_next().await {
        r.expect("task panicked");
    }
}

// ---------------------------------------------------------------------------------------------
// Handshakes and per-connection state
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_3_auth_against_password_protected_upstream() {
    let direct = RedisServer::start_with(&["--requirepass", "secret"]);
    let upstream = RedisServer::start_with(&["--requirepass", "secret"]);
    let mut config = config_for(&upstream.addr());
    config.upstream.password = Some("secret".to_string());
    let proxy = Proxy::start(config).await;
    let pair = Pair {
        direct,
        upstream,
        proxy,
    };
    // Wrong credentials: the same error as Redis, and the connection is still usable.
    pair.compare_steps(&[
        step(0, b"HELLO 3 AUTH default wrong\r\n", 1),
        step(0, b"AUTH wrong\r\n", 1),
        step(0, b"AUTH default wrong\r\n", 1),
    ])
    .await;
    let t = pair
        .compare_steps(&[
            step(0, b"HELLO 3 AUTH default secret\r\n", 1),
            step(
                0,
                b"SET k v\r\nGET k\r\nGET missing\r\nHSET h f v\r\nHGETALL h\r\n",
                5,
            ),
            step(1, b"AUTH secret\r\nPING\r\n", 2),
        ])
        .await;
    assert!(t[0].starts_with(b"%7\r\n"), "{}", show(&t[0]));
    assert_eq!(
        t[1],
        b"+OK\r\n$1\r\nv\r\n_\r\n:1\r\n%1\r\n$1\r\nf\r\n$1\r\nv\r\n"
    );
    assert_eq!(pair.upstream.direct(&["GET", "k"]).await, b"$1\r\nv\r\n");

    // The redis crate authenticates with HELLO 3 AUTH through the URL.
    let url = format!("redis://:secret@{}/?protocol=resp3", pair.proxy.addr);
    let mut con = connect(&url).await;
    let v: String = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_auth_with_acl_user() {
    let acl = ["--user", "app", "on", ">apppass", "~*", "&*", "+@all"];
    let direct = RedisServer::start_with(&acl);
    let upstream = RedisServer::start_with(&acl);
    let mut config = config_for(&upstream.addr());
    config.upstream.username = Some("app".to_string());
    config.upstream.password = Some("apppass".to_string());
    let proxy = Proxy::start(config).await;
    let pair = Pair {
        direct,
        upstream,
        proxy,
    };
    let t = pair
        .compare_steps(&[
            step(0, b"HELLO 3 AUTH app nope\r\n", 1),
            step(0, b"HELLO 3 AUTH app apppass\r\n", 1),
            step(0, b"ACL WHOAMI\r\nSET k v\r\nGET k\r\n", 3),
        ])
        .await;
    assert!(t[0].starts_with(b"-WRONGPASS"), "{}", show(&t[0]));
    assert_eq!(t[2], b"$3\r\napp\r\n+OK\r\n$1\r\nv\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_setinfo_is_answered_as_redis_answers_it() {
    let pair = Pair::start().await;
    // Redis 7.0 has no CLIENT SETINFO (7.2 added it): a transparent proxy answers exactly
    // what its upstream answers, here an unknown-subcommand error.
    pair.compare_steps(&[
        step(0, b"CLIENT SETINFO lib-name x\r\n", 1),
        step(0, b"CLIENT SETINFO lib-ver 1.0\r\n", 1),
        step(0, b"PING\r\n", 1),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_setname_getname_are_per_client() {
    let pair = Pair::start().await;
    pair.compare_steps(&[
        step(0, b"CLIENT SETNAME n1\r\nCLIENT GETNAME\r\n", 2),
        step(1, b"CLIENT GETNAME\r\n", 1),
        step(1, b"CLIENT SETNAME n2\r\n", 1),
        step(0, b"CLIENT GETNAME\r\n", 1),
        step(1, b"CLIENT GETNAME\r\n", 1),
        step(0, b"CLIENT SETNAME bad\\ name\r\n", 1),
        step(0, b"CLIENT SETNAME \"\"\r\nCLIENT GETNAME\r\n", 2),
    ])
    .await;

    let proxy = &pair.proxy;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    assert_eq!(a.request(b"CLIENT SETNAME alpha\r\n", 1).await, b"+OK\r\n");
    assert_eq!(b.request(b"CLIENT GETNAME\r\n", 1).await, b"$-1\r\n");
    assert_eq!(b.request(b"CLIENT SETNAME beta\r\n", 1).await, b"+OK\r\n");
    let rounds = 100;
    let q = b"CLIENT GETNAME\r\nPING\r\n".repeat(rounds);
    let (ra, rb) = tokio::join!(a.request(&q, 2 * rounds), b.request(&q, 2 * rounds));
    assert_eq!(ra, b"$5\r\nalpha\r\n+PONG\r\n".repeat(rounds));
    assert_eq!(rb, b"$4\r\nbeta\r\n+PONG\r\n".repeat(rounds));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_routes_keys_to_that_db_per_client() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    assert_eq!(
        a.request(b"SELECT 2\r\nSET k in2\r\n", 2).await,
        b"+OK\r\n+OK\r\n"
    );
    assert_eq!(b.request(b"SET k in0\r\n", 1).await, b"+OK\r\n");
    let rounds = 100;
    let gets = b"GET k\r\n".repeat(rounds);
    let (ra, rb) = tokio::join!(a.request(&gets, rounds), b.request(&gets, rounds));
    assert_eq!(ra, b"$3\r\nin2\r\n".repeat(rounds));
    assert_eq!(rb, b"$3\r\nin0\r\n".repeat(rounds));

    let mut d = redis.raw().await;
    assert_eq!(d.request(b"GET k\r\n", 1).await, b"$3\r\nin0\r\n");
    assert_eq!(
        d.request(b"SELECT 2\r\nGET k\r\n", 2).await,
        b"+OK\r\n$3\r\nin2\r\n"
    );
    // Out-of-range db: Redis's own error.
    assert_eq!(
        a.request(b"SELECT 99\r\n", 1).await,
        b"-ERR DB index is out of range\r\n"
    );

    // The redis crate selects the db from the URL during its handshake.
    let mut con = connect(&format!("redis://{}/3", proxy.addr)).await;
    let () = redis::cmd("SET")
        .arg("k3")
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        d.request(b"SELECT 3\r\nGET k3\r\n", 2).await,
        b"+OK\r\n$1\r\nv\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_is_forwarded() {
    let pair = Pair::start().await;
    let got = pair.compare(b"READONLY\r\nREADWRITE\r\nPING\r\n", 3).await;
    assert!(got.starts_with(b"-ERR"), "{}", show(&got));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_restores_connection_defaults() {
    let pair = Pair::start().await;
    let t = pair
        .compare_steps(&[
            step(0, b"HELLO 3\r\n", 1),
            step(0, b"SELECT 2\r\nCLIENT SETNAME x\r\nSUBSCRIBE ch\r\n", 3),
            step(0, b"MULTI\r\nSET a 1\r\n", 2),
            step(0, b"RESET\r\n", 1),
            step(
                0,
                b"GET missing\r\nCLIENT GETNAME\r\nSET k v\r\nEXEC\r\n",
                4,
            ),
            step(1, b"PUBLISH ch m\r\n", 1),
        ])
        .await;
    assert_eq!(t[3], b"+RESET\r\n");
    assert_eq!(
        t[4], b"$-1\r\n$-1\r\n+OK\r\n-ERR EXEC without MULTI\r\n",
        "after RESET: RESP2, no name, not in MULTI"
    );
    assert_eq!(t[5], b":0\r\n", "RESET unsubscribes");
    // db 0 again: the key is in db 0 of the upstream, and `a` was never set.
    assert_eq!(pair.upstream.direct(&["GET", "k"]).await, b"$1\r\nv\r\n");
    let mut d = pair.upstream.raw().await;
    assert_eq!(
        d.request(b"SELECT 2\r\nDBSIZE\r\n", 2).await,
        b"+OK\r\n:0\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_work_after_reset_or_protocol_switch() {
    let pair = Pair::start().await;
    pair.compare_steps(&[
        // RESET after stateful commands, then a new transaction right away.
        step(0, b"SUBSCRIBE ch\r\n", 1),
        step(0, b"RESET\r\nMULTI\r\nSET a 1\r\nEXEC\r\n", 4),
        step(1, b"WATCH w\r\nRESET\r\nWATCH w\r\nMULTI\r\nEXEC\r\n", 5),
        // A protocol switch after a transaction, then another transaction.
        step(2, b"MULTI\r\nINCR n\r\nEXEC\r\n", 3),
        step(2, b"HELLO 3\r\n", 1),
        step(2, b"MULTI\r\nGET missing\r\nEXEC\r\n", 3),
        step(2, b"HELLO 2\r\n", 1),
        step(2, b"WATCH w\r\nMULTI\r\nGET missing\r\nEXEC\r\n", 4),
        step(2, b"PING\r\n", 1),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_is_answered_right_after_start() {
    // A client may connect the moment the listener exists; HELLO must not fail just because
    // the proxy has not finished its own upstream handshake yet.
    let redis = RedisServer::start();
    for round in 0..20 {
        let proxy = Proxy::spawn(config_for(&redis.addr())).await;
        let mut c = Raw::connect(proxy.addr).await;
        let got = c.request(b"HELLO 3\r\nGET k\r\n", 2).await;
        assert!(
            got.starts_with(b"%7\r\n") && got.ends_with(b"_\r\n"),
            "round {round}: {}",
            show(&got)
        );
        let mut c = Raw::connect(proxy.addr).await;
        let got = c.request(b"HELLO 2\r\n", 1).await;
        assert!(got.starts_with(b"*14\r\n"), "round {round}: {}", show(&got));
        proxy.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reply_modes_match_redis() {
    let pair = Pair::start().await;
    let t = pair
        .compare_steps(&[step(
            0,
            b"CLIENT REPLY SKIP\r\nSET a 1\r\nGET a\r\nCLIENT REPLY OFF\r\nSET b 2\r\n\
              GET b\r\nCLIENT REPLY ON\r\nGET b\r\n",
            3,
        )])
        .await;
    assert_eq!(t[0], b"$1\r\n1\r\n+OK\r\n$1\r\n2\r\n");
}

/// Redis gives every connection its own id; HELLO reports it and CLIENT ID returns the same
/// number, and CLIENT INFO describes the caller's own connection. Clients use these ids for
/// CLIENT KILL ID, CLIENT UNBLOCK and tracking redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_identity_is_consistent_per_connection() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    async fn ids(proxy: &Proxy) -> (Vec<u8>, Vec<u8>) {
        let mut c = Raw::connect(proxy.addr).await;
        let hello = c.request(b"HELLO 2\r\n", 1).await;
        let pos = hello
            .windows(8)
            .position(|w| w == b"$2\r\nid\r\n")
            .expect("HELLO reply has an id");
        let hello_id = split_frames(&hello[pos + 8..]).0.remove(0);
        let client_id = c.request(b"CLIENT ID\r\n", 1).await;
        (hello_id, client_id)
    }
    let (h1, c1) = ids(&proxy).await;
    let (h2, c2) = ids(&proxy).await;
    assert_eq!(h1, c1, "HELLO id and CLIENT ID of one connection differ");
    assert_eq!(h2, c2, "HELLO id and CLIENT ID of one connection differ");
    assert_ne!(h1, h2, "two client connections report the same id");

    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.request(b"CLIENT SETNAME me\r\n", 1).await, b"+OK\r\n");
    let info = c.request(b"CLIENT INFO\r\n", 1).await;
    assert!(
        String::from_utf8_lossy(&info).contains(" name=me "),
        "CLIENT INFO is not about the caller: {}",
        show(&info)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_auth_when_the_proxy_has_no_password() {
    let direct = RedisServer::start_with(&["--requirepass", "secret"]);
    let upstream = RedisServer::start_with(&["--requirepass", "secret"]);
    // The proxy itself cannot log in, so no readiness probe; clients bring credentials.
    let proxy = Proxy::spawn(config_for(&upstream.addr())).await;
    let pair = Pair {
        direct,
        upstream,
        proxy,
    };
    let mut c = Raw::connect(pair.proxy.addr).await;
    let denied = c.request(b"GET k\r\n", 1).await;
    assert!(denied.starts_with(b"-"), "{}", show(&denied));
    let t = pair
        .compare_steps(&[
            step(0, b"AUTH wrong\r\n", 1),
            step(0, b"AUTH secret\r\nSET k v\r\nGET k\r\n", 3),
            step(1, b"HELLO 3 AUTH default secret\r\n", 1),
            step(1, b"GET k\r\nHGETALL nope\r\n", 2),
        ])
        .await;
    assert_eq!(t[1], b"+OK\r\n+OK\r\n$1\r\nv\r\n");
    assert_eq!(t[3], b"$1\r\nv\r\n%0\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_roundtrip_unchanged() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let value: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut input = resp(&[&b"SET"[..], b"big", &value]);
    input.extend_from_slice(&resp(&["GET", "big"]));
    input.extend_from_slice(&resp(&["STRLEN", "big"]));
    let got = pipeline(proxy.addr, input, 3).await;
    assert_eq!(got.frames.len(), 3, "closed: {}", got.closed);
    assert_eq!(got.frames[0], b"+OK\r\n");
    assert!(
        got.frames[1] == bulk(&value),
        "GET big returned different bytes"
    );
    assert_eq!(got.frames[2], format!(":{}\r\n", value.len()).as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_vanishing_mid_pipeline_does_not_confuse_others() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut b = Raw::connect(proxy.addr).await;
    for round in 0..5 {
        {
            let mut a = Raw::connect(proxy.addr).await;
            a.send(&resp_cmds(&["INCR gone"]).repeat(10_000)).await;
            // Dropped without reading a single reply.
        }
        let mut want = Vec::new();
        let mut input = Vec::new();
        for i in 0..200 {
            let s = format!("r{round}-{i}");
            input.extend_from_slice(&resp(&["ECHO", s.as_str()]));
            want.extend_from_slice(&bulk(s.as_bytes()));
        }
        assert_eq!(b.request(&input, 200).await, want, "round {round}");
    }
    assert_eq!(exchange(proxy.addr, b"PING\r\n", 1).await, b"+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnected_clients_release_their_upstream_state() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    {
        let mut s = Raw::connect(proxy.addr).await;
        s.request(b"SUBSCRIBE ch\r\n", 1).await;
        let mut b = Raw::connect(proxy.addr).await;
        b.send(b"BLPOP q 0\r\n").await;
        let mut m = Raw::connect(proxy.addr).await;
        m.request(b"MULTI\r\nSET x 1\r\n", 2).await;
        redis.wait_blocked_clients(1).await;
    }
    // All three closed: the subscription, the blocked pop and the transaction must go too.
    let mut d = redis.raw().await;
    let until = std::time::Instant::now() + DEADLINE;
    loop {
        let subs = d.request(b"PUBLISH ch x\r\n", 1).await;
        let info = String::from_utf8_lossy(&d.request(b"INFO clients\r\n", 1).await).to_string();
        if subs == b":0\r\n" && info.contains("blocked_clients:0\r\n") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "upstream state of closed clients was not released: PUBLISH -> {}, {info}",
            show(&subs)
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(
        d.request(b"RPUSH q v\r\nLLEN q\r\nGET x\r\n", 3).await,
        b":1\r\n:1\r\n$-1\r\n"
    );
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(c.request(b"SET y 2\r\n", 1).await, b"+OK\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quit_replies_ok_and_closes() {
    let pair = Pair::start().await;
    assert_eq!(pair.compare_until_close(b"QUIT\r\n").await, b"+OK\r\n");
    assert_eq!(
        pair.compare_until_close(b"PING\r\nSET k v\r\nQUIT\r\nSET k w\r\n")
            .await,
        b"+PONG\r\n+OK\r\n+OK\r\n"
    );
    assert_eq!(pair.upstream.direct(&["GET", "k"]).await, b"$1\r\nv\r\n");
    // Still serving.
    assert_eq!(
        exchange(pair.proxy.addr, b"PING\r\n", 1).await,
        b"+PONG\r\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Pipelining
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_of_10000_commands_in_one_write_returns_in_order() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut input = Vec::new();
    let mut want = Vec::new();
    for i in 0..5000 {
        input.extend_from_slice(&resp(&[
            "SET".to_string(),
            format!("key:{i}"),
            format!("value:{i}"),
        ]));
        input.extend_from_slice(&resp(&["GET".to_string(), format!("key:{i}")]));
        want.push(b"+OK\r\n".to_vec());
        want.push(bulk(format!("value:{i}").as_bytes()));
    }
    let got = pipeline(proxy.addr, input, want.len()).await;
    assert_frames_eq(&got, &want);
    assert_eq!(redis.direct(&["DBSIZE"]).await, b":5000\r\n");
}

fn assert_frames_eq(got: &Collected, want: &[Vec<u8>]) {
    if let Some(i) = (0..want.len()).find(|&i| got.frames.get(i) != Some(&want[i])) {
        panic!(
            "reply {i} of {} wrong (got {} replies, closed: {}): expected {}, got {}",
            want.len(),
            got.frames.len(),
            got.closed,
            show(&want[i]),
            got.frames.get(i).map(|f| show(f)).unwrap_or_default()
        );
    }
}

/// A 10,000-command pipeline mixing commands that need a dedicated upstream connection
/// (MULTI/EXEC, WATCH, SELECT, blocking pops, CLIENT SETNAME) with plain ones.
fn mixed_pipeline() -> (Vec<u8>, usize) {
    let mut input = Vec::new();
    let mut n = 0;
    let mut i = 0;
    while n < 10_000 {
        let mut add = |cmds: &[String]| {
            for c in cmds {
                let args: Vec<&str> = c.split(' ').collect();
                input.extend_from_slice(&resp(&args));
                n += 1;
            }
        };
        match i % 50 {
            0 => add(&[
                "MULTI".into(),
                "INCR tx".into(),
                format!("SET t:{i} {i}"),
                "EXEC".into(),
            ]),
            10 => add(&[
                "SELECT 1".into(),
                format!("SET db1:{i} {i}"),
                format!("GET db1:{i}"),
                "SELECT 0".into(),
                format!("GET db1:{i}"),
            ]),
            20 => add(&[format!("RPUSH q {i}"), "BLPOP q 1".into()]),
            30 => add(&[
                "WATCH w".into(),
                "MULTI".into(),
                format!("SET w {i}"),
                "EXEC".into(),
            ]),
            40 => add(&[format!("CLIENT SETNAME c{i}"), "CLIENT GETNAME".into()]),
            45 if i % 1000 == 45 => add(&["BRPOP emptyq 0.01".into()]),
            _ => add(&["INCR counter".into(), format!("ECHO e{i}")]),
        }
        i += 1;
    }
    (input, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_pipeline_with_stateful_commands_matches_redis() {
    let pair = Pair::start().await;
    let (input, n) = mixed_pipeline();
    let want = pipeline(pair.direct.addr(), input.clone(), n).await;
    assert_eq!(want.frames.len(), n, "direct Redis answered short");
    let got = pipeline(pair.proxy.addr, input, n).await;
    assert_frames_eq(&got, &want.frames);
    // Effects landed where SELECT said.
    let mut d = pair.upstream.raw().await;
    assert_eq!(
        d.request(b"SELECT 1\r\nGET db1:10\r\nSELECT 0\r\nGET db1:10\r\n", 4)
            .await,
        b"+OK\r\n$2\r\n10\r\n+OK\r\n$-1\r\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_with_tiny_inflight_and_queue_limits_completes() {
    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.limits.max_inflight.value = 16;
    config.upstream.queue_depth.value = 4;
    let proxy = Proxy::start(config).await;
    let (input, n) = mixed_pipeline();
    let got = pipeline(proxy.addr, input, n).await;
    assert_eq!(
        got.frames.len(),
        n,
        "closed: {}, rest: {}",
        got.closed,
        show(&got.rest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_keep_their_own_reply_order() {
    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.upstream.connections.value = 4;
    config.upstream.queue_depth.value = 8;
    let proxy = Proxy::start(config).await;
    let addr = proxy.addr;
    let mut set = tokio::task::JoinSet::new();
    for c in 0..50 {
        set.spawn(async move {
            let key = format!("ctr:{c}");
            let mut input = Vec::new();
            let mut want = Vec::new();
            for i in 1..=200 {
                input.extend_from_slice(&resp(&["INCR", key.as_str()]));
                want.push(format!(":{i}\r\n").into_bytes());
            }
            let got = pipeline(addr, input, want.len()).await;
            assert_frames_eq(&got, &want);
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("client task failed");
    }
}

// ---------------------------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_exec_discard_match_redis() {
    let pair = Pair::start().await;
    pair.compare_steps(&[
        step(0, b"MULTI\r\nSET a 1\r\nINCR a\r\nGET a\r\nEXEC\r\n", 5),
        step(0, b"MULTI\r\nSET a\r\nEXEC\r\n", 3),
        step(
            0,
            b"MULTI\r\nINCR z\r\nMULTI\r\nDISCARD\r\nDISCARD\r\nEXEC\r\n",
            6,
        ),
        step(0, b"MULTI\r\nSET s x\r\nINCR s\r\nEXEC\r\n", 4),
        step(0, b"MULTI\r\nEXEC\r\nWATCH a\r\nUNWATCH\r\n", 4),
        step(1, b"HELLO 3\r\n", 1),
        step(1, b"MULTI\r\nGET missing\r\nHGETALL nope\r\nEXEC\r\n", 4),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_does_not_capture_other_clients_commands() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    assert_eq!(
        a.request(b"MULTI\r\nSET x 1\r\n", 2).await,
        b"+OK\r\n+QUEUED\r\n"
    );
    assert_eq!(
        b.request(b"SET y 2\r\nGET x\r\n", 2).await,
        b"+OK\r\n$-1\r\n"
    );
    assert_eq!(a.request(b"EXEC\r\n", 1).await, b"*1\r\n+OK\r\n");
    assert_eq!(b.request(b"GET x\r\n", 1).await, b"$1\r\n1\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_conflict_aborts_exec_resp2_and_resp3() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;

    // Conflict from another proxy client: RESP2 null array.
    assert_eq!(
        a.request(b"WATCH w\r\nMULTI\r\nSET w a\r\n", 3).await,
        b"+OK\r\n+OK\r\n+QUEUED\r\n"
    );
    assert_eq!(b.request(b"SET w b\r\n", 1).await, b"+OK\r\n");
    assert_eq!(a.request(b"EXEC\r\n", 1).await, b"*-1\r\n");
    assert_eq!(b.request(b"GET w\r\n", 1).await, b"$1\r\nb\r\n");

    // No conflict: EXEC runs.
    assert_eq!(
        a.request(b"WATCH w\r\nMULTI\r\nSET w a\r\nEXEC\r\n", 4)
            .await,
        b"+OK\r\n+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n"
    );

    // Conflict from a direct client, RESP3: null.
    let mut a = Raw::connect(proxy.addr).await;
    assert!(a.request(b"HELLO 3\r\n", 1).await.starts_with(b"%7\r\n"));
    assert_eq!(
        a.request(b"WATCH w\r\nMULTI\r\nSET w c\r\n", 3).await,
        b"+OK\r\n+OK\r\n+QUEUED\r\n"
    );
    assert_eq!(redis.direct(&["SET", "w", "direct"]).await, b"+OK\r\n");
    assert_eq!(a.request(b"EXEC\r\n", 1).await, b"_\r\n");
    assert_eq!(redis.direct(&["GET", "w"]).await, b"$6\r\ndirect\r\n");

    // The redis crate sees a failed transaction as nil.
    let mut c1 = connect(&proxy.url()).await;
    let mut c2 = connect(&proxy.url()).await;
    let () = redis::cmd("WATCH")
        .arg("cw")
        .query_async(&mut c1)
        .await
        .unwrap();
    let () = redis::cmd("SET")
        .arg("cw")
        .arg(1)
        .query_async(&mut c2)
        .await
        .unwrap();
    let r: Option<(String,)> = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("cw")
        .arg(2)
        .query_async(&mut c1)
        .await
        .unwrap();
    assert_eq!(r, None);
}

// ---------------------------------------------------------------------------------------------
// Pub/sub
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_resp2_matches_redis() {
    let pair = Pair::start().await;
    let t = pair
        .compare_steps(&[
            step(0, b"SUBSCRIBE ch1 ch2\r\n", 2),
            step(0, b"PSUBSCRIBE p*\r\n", 1),
            step(0, b"SSUBSCRIBE sch\r\n", 1),
            step(0, b"GET k\r\nPING\r\nPING hi\r\n", 3),
            step(
                1,
                b"PUBLISH ch1 hello\r\nPUBLISH px world\r\nSPUBLISH sch shard\r\n",
                3,
            ),
            step(0, b"", 3),
            step(0, b"UNSUBSCRIBE ch1\r\nPUNSUBSCRIBE p*\r\n", 2),
            step(1, b"PUBLISH ch1 gone\r\nPUBLISH ch2 still\r\n", 2),
            step(0, b"", 1),
            step(0, b"SUNSUBSCRIBE sch\r\nUNSUBSCRIBE ch2\r\n", 2),
            step(0, b"GET k\r\n", 1),
        ])
        .await;
    assert_eq!(
        t[5],
        b"*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$5\r\nhello\r\n\
          *4\r\n$8\r\npmessage\r\n$2\r\np*\r\n$2\r\npx\r\n$5\r\nworld\r\n\
          *3\r\n$8\r\nsmessage\r\n$3\r\nsch\r\n$5\r\nshard\r\n"
    );
    assert_eq!(t[7], b":0\r\n:1\r\n");
    assert_eq!(
        t[10], b"$-1\r\n",
        "back to normal mode after unsubscribing all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_resp3_pushes_interleave_with_replies() {
    let pair = Pair::start().await;
    let t = pair
        .compare_steps(&[
            step(0, b"HELLO 3\r\n", 1),
            step(0, b"SUBSCRIBE ch\r\nGET k\r\nSET k v\r\n", 3),
            step(1, b"PUBLISH ch hello\r\n", 1),
            step(0, b"", 1),
            step(0, b"GET k\r\nPING\r\nPSUBSCRIBE p*\r\nSSUBSCRIBE s1\r\n", 4),
            step(1, b"PUBLISH pa x\r\nSPUBLISH s1 y\r\n", 2),
            step(0, b"", 2),
            step(0, b"UNSUBSCRIBE ch\r\nECHO e\r\n", 2),
            step(1, b"PUBLISH ch nobody\r\n", 1),
        ])
        .await;
    assert_eq!(
        t[1],
        b">3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n_\r\n+OK\r\n"
    );
    assert_eq!(t[3], b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n");
    assert_eq!(t[8], b":0\r\n");

    // The same through the redis crate: subscribe, then ordinary commands on the same
    // connection, and messages arrive as pushes.
    let (mut con, mut pushes) = connect_resp3(&pair.proxy.url()).await;
    con.subscribe("news").await.unwrap();
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    let mut publisher = connect(&pair.proxy.url()).await;
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg("news")
        .arg("flash")
        .query_async(&mut publisher)
        .await
        .unwrap();
    assert_eq!(receivers, 1);
    let msg = next_push(&mut pushes, redis::PushKind::Message).await;
    assert_eq!(
        msg.data,
        vec![
            redis::Value::BulkString(b"news".to_vec()),
            redis::Value::BulkString(b"flash".to_vec())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_subscriber_does_not_stall_other_clients() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let addr = proxy.addr;

    // Subscribes and then never reads again.
    let mut slow = Raw::connect(addr).await;
    slow.request(b"SUBSCRIBE big\r\n", 1).await;
    // Subscribes and reads everything.
    let mut fast = Raw::connect(addr).await;
    fast.request(b"SUBSCRIBE big\r\n", 1).await;

    let messages = 200;
    let payload = vec![b'p'; 64 * 1024];
    let publisher = tokio::spawn(async move {
        let mut p = Raw::connect(addr).await;
        for _ in 0..messages {
            let r = p.call(&[&b"PUBLISH"[..], b"big", &payload]).await;
            assert_eq!(r, b":2\r\n");
        }
    });
    let reader = tokio::spawn(async move {
        let frames = fast.read_frames(messages).await;
        assert!(
            frames
                .iter()
                .all(|f| f.starts_with(b"*3\r\n$7\r\nmessage\r\n"))
        );
    });
    let mut others = tokio::task::JoinSet::new();
    for c in 0..20 {
        others.spawn(async move {
            let mut r = Raw::connect(addr).await;
            for i in 0..50 {
                let k = format!("o:{c}:{i}");
                let req = resp_cmds(&[&format!("SET {k} x"), &format!("GET {k}")]);
                assert_eq!(r.request(&req, 2).await, b"+OK\r\n$1\r\nx\r\n");
            }
        });
    }
    while let Some(r) = others.join_next().await {
        r.expect("other client stalled or failed");
    }
    tokio::time::timeout(DEADLINE * 2, publisher)
        .await
        .expect("publisher stalled")
        .expect("publisher failed");
    tokio::time::timeout(DEADLINE * 2, reader)
        .await
        .expect("reading subscriber stalled behind the slow one")
        .expect("reading subscriber failed");
    drop(slow);
}

// ---------------------------------------------------------------------------------------------
// Blocking commands
// ---------------------------------------------------------------------------------------------

/// Blocks one client with `block`, checks 100 other clients complete commands meanwhile, then
/// runs `unblock` and expects `expected` on the blocked client.
async fn blocking_command_blocks_only_its_client(
    setup: &[&str],
    block: &str,
    unblock: &str,
    expected: &[u8],
) {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let addr = proxy.addr;
    let mut admin = Raw::connect(addr).await;
    for s in setup {
        admin.request(&resp_cmds(&[s]), 1).await;
    }
    let mut blocked = Raw::connect(addr).await;
    blocked.send(&resp_cmds(&[block])).await;
    redis.wait_blocked_clients(1).await;

    let mut others = tokio::task::JoinSet::new();
    for c in 0..100 {
        others.spawn(async move {
            let mut r = Raw::connect(addr).await;
            let k = format!("o:{c}");
            let got = r
                .request(
                    &resp_cmds(&[&format!("SET {k} {c}"), &format!("GET {k}"), "PING"]),
                    3,
                )
                .await;
            assert_eq!(
                got,
                [
                    b"+OK\r\n".to_vec(),
                    bulk(c.to_string().as_bytes()),
                    b"+PONG\r\n".to_vec()
                ]
                .concat()
            );
        });
    }
    let all = async {
        while let Some(r) = others.join_next().await {
            r.expect("client failed while another was blocked");
        }
    };
    tokio::time::timeout(DEADLINE, all)
        .await
        .unwrap_or_else(|_| panic!("other clients stalled while one was blocked in {block}"));

    admin.request(&resp_cmds(&[unblock]), 1).await;
    let got = blocked.read_frame().await;
    assert!(
        got == expected,
        "{block}: expected {}, got {}",
        show(expected),
        show(&got)
    );
    assert_eq!(blocked.request(b"PING\r\n", 1).await, b"+PONG\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blpop_blocks_only_its_client() {
    blocking_command_blocks_only_its_client(
        &[],
        "BLPOP q 0",
        "RPUSH q x",
        b"*2\r\n$1\r\nq\r\n$1\r\nx\r\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brpop_blocks_only_its_client() {
    blocking_command_blocks_only_its_client(
        &[],
        "BRPOP q 0",
        "LPUSH q y",
        b"*2\r\n$1\r\nq\r\n$1\r\ny\r\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blmove_blocks_only_its_client() {
    blocking_command_blocks_only_its_client(
        &[],
        "BLMOVE src dst LEFT RIGHT 0",
        "RPUSH src m",
        b"$1\r\nm\r\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bzpopmin_blocks_only_its_client() {
    blocking_command_blocks_only_its_client(
        &[],
        "BZPOPMIN z 0",
        "ZADD z 1 m",
        b"*3\r\n$1\r\nz\r\n$1\r\nm\r\n$1\r\n1\r\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xread_block_blocks_only_its_client() {
    blocking_command_blocks_only_its_client(
        &[],
        "XREAD BLOCK 0 STREAMS s $",
        "XADD s 1-1 f v",
        b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xreadgroup_block_blocks_only_its_client() {
    blocking_command_blocks_only_its_client(
        &["XGROUP CREATE s g $ MKSTREAM"],
        "XREADGROUP GROUP g c BLOCK 0 STREAMS s >",
        "XADD s 1-1 f v",
        b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\nf\r\n$1\r\nv\r\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_blocked_clients_at_once_and_timeouts() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut blocked = Vec::new();
    for i in 0..10 {
        let mut c = Raw::connect(proxy.addr).await;
        c.send(format!("BLPOP bq{i} 0\r\n").as_bytes()).await;
        blocked.push(c);
    }
    redis.wait_blocked_clients(10).await;
    let mut p = Raw::connect(proxy.addr).await;
    for _ in 0..100 {
        assert_eq!(p.request(b"PING\r\n", 1).await, b"+PONG\r\n");
    }
    for (i, c) in blocked.iter_mut().enumerate().rev() {
        let key = format!("bq{i}");
        assert_eq!(p.call(&["RPUSH", key.as_str(), "v"]).await, b":1\r\n");
        let want = [b"*2\r\n".to_vec(), bulk(key.as_bytes()), bulk(b"v")].concat();
        assert_eq!(c.read_frame().await, want);
    }
    // A timeout is answered with the null array, and the connection stays usable.
    assert_eq!(
        p.request(b"BLPOP nothing 0.05\r\nPING\r\n", 2).await,
        b"*-1\r\n+PONG\r\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Scripts and functions
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_evalsha_script_load_and_fcall_match_redis() {
    let pair = Pair::start().await;
    let script = "return redis.call('INCR', KEYS[1])";
    let loaded = pair.direct.direct(&["SCRIPT", "LOAD", script]).await;
    let sha = String::from_utf8(loaded[5..45].to_vec()).unwrap();
    let library = "#!lua name=mylib\nredis.register_function('myfunc', function(keys, args) return args[1] end)";
    let mut s = Vec::new();
    s.extend_from_slice(&resp(&["EVAL", "return {KEYS[1],ARGV[1]}", "1", "k", "a"]));
    s.extend_from_slice(&resp(&["SCRIPT", "LOAD", script]));
    s.extend_from_slice(&resp(&["EVALSHA", &sha, "1", "cnt"]));
    s.extend_from_slice(&resp(&["EVALSHA", &sha, "1", "cnt"]));
    s.extend_from_slice(&resp(&["EVALSHA", &"f".repeat(40), "0"]));
    s.extend_from_slice(&resp(&["SCRIPT", "EXISTS", &sha, &"f".repeat(40)]));
    s.extend_from_slice(&resp(&["EVAL", "return redis.error_reply('boom')", "0"]));
    s.extend_from_slice(&resp(&["EVAL", "this is not lua", "0"]));
    s.extend_from_slice(&resp(&[
        "EVAL_RO",
        "return redis.call('GET', KEYS[1])",
        "1",
        "cnt",
    ]));
    s.extend_from_slice(&resp(&["FUNCTION", "LOAD", library]));
    s.extend_from_slice(&resp(&["FCALL", "myfunc", "0", "hello"]));
    s.extend_from_slice(&resp(&["FUNCTION", "LOAD", library]));
    s.extend_from_slice(&resp(&["FUNCTION", "DELETE", "mylib"]));
    s.extend_from_slice(&resp(&["FCALL", "myfunc", "0", "hello"]));
    let t = pair
        .compare_steps(&[
            step(0, &s, 14),
            step(1, b"HELLO 3\r\n", 1),
            step(1, resp(&["EVAL", "return {1, 'two', {3}}", "0"]), 1),
        ])
        .await;
    let out = String::from_utf8_lossy(&t[0]).to_string();
    assert!(out.contains("$5\r\nhello\r\n"), "{out}");
    assert!(out.contains(":2\r\n"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// Client-side caching
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tracking_delivers_invalidation_pushes_resp3() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let mut a = Raw::connect(proxy.addr).await;
    let mut b = Raw::connect(proxy.addr).await;
    assert!(a.request(b"HELLO 3\r\n", 1).await.starts_with(b"%7\r\n"));
    assert_eq!(
        a.request(b"CLIENT TRACKING ON\r\nGET tk\r\n", 2).await,
        b"+OK\r\n_\r\n"
    );
    assert_eq!(b.request(b"SET tk 1\r\n", 1).await, b"+OK\r\n");
    assert_eq!(
        a.read_frame().await,
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\ntk\r\n"
    );
    // Read again (tracked again), modified directly this time.
    assert_eq!(a.request(b"GET tk\r\n", 1).await, b"$1\r\n1\r\n");
    assert_eq!(redis.direct(&["DEL", "tk"]).await, b":1\r\n");
    assert_eq!(
        a.read_frame().await,
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$2\r\ntk\r\n"
    );
    assert_eq!(a.request(b"PING\r\n", 1).await, b"+PONG\r\n");
    // The client that did not enable tracking got nothing extra.
    assert_eq!(b.request(b"PING\r\n", 1).await, b"+PONG\r\n");
    assert_eq!(
        a.request(b"CLIENT TRACKING OFF\r\nPING\r\n", 2).await,
        b"+OK\r\n+PONG\r\n"
    );
}

// ---------------------------------------------------------------------------------------------
// Upstream trouble
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_answers_every_command_with_an_error() {
    let port = free_port();
    let upstream = format!("127.0.0.1:{port}");
    let mut config = config_for(&upstream);
    config.upstream.connect_timeout_ms.value = 500;
    let proxy = Proxy::spawn(config).await;
    for round in 0..2 {
        let mut c = Raw::connect(proxy.addr).await;
        c.send(b"PING\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\nGET k\r\n")
            .await;
        let frames = c.read_frames(3).await;
        for f in &frames {
            let text = String::from_utf8_lossy(f);
            // Never sent: LOADING, the error code clients retry as transient.
            assert!(
                text.starts_with("-LOADING ")
                    && text.contains(&upstream)
                    && text.contains("the command was not run"),
                "round {round}: expected a -LOADING naming {upstream}, got {text:?}"
            );
        }
    }
    let mut con = connect(&proxy.url()).await;
    let err = redis::cmd("GET")
        .arg("k")
        .query_async::<Option<String>>(&mut con)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&upstream), "{err}");
}

async fn wait_proxy_serves(proxy: &Proxy) {
    let addr = proxy.addr;
    wait_until("the proxy to answer PING again", || async move {
        let Some(mut c) = Raw::try_connect(addr, Duration::from_secs(1)).await else {
            return false;
        };
        if c.stream.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let got = c.collect_frames(1, Duration::from_secs(1)).await;
        got.frames.first().map(|f| f.as_slice()) == Some(&b"+PONG\r\n"[..])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_killed_mid_pipeline_answers_every_command_then_recovers() {
    let mut redis = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    let mut config = config_for(&redis.addr());
    config.upstream.reconnect_min_ms.value = 10;
    config.upstream.reconnect_max_ms.value = 100;
    config.upstream.connect_timeout_ms.value = 1000;
    let proxy = Proxy::start(config).await;
    assert_eq!(exchange(proxy.addr, b"PING\r\n", 1).await, b"+PONG\r\n");

    // A script that never ends keeps the whole pipeline in flight until Redis dies.
    let commands = 1001;
    let mut input = resp(&["EVAL", "while true do end", "0"]);
    for _ in 1..commands {
        input.extend_from_slice(&resp(&["INCR", "c"]));
    }
    let client = tokio::spawn(pipeline(proxy.addr, input, commands));
    let mut d = Raw::connect(redis.addr()).await;
    let until = std::time::Instant::now() + DEADLINE;
    while !d.request(b"PING\r\n", 1).await.starts_with(b"-BUSY") {
        assert!(
            std::time::Instant::now() < until,
            "Redis never became busy running the script: was it forwarded?"
        );
        tokio::time::sleep(POLL).await;
    }
    drop(d);
    redis.kill();

    let got = tokio::time::timeout(DEADLINE * 4, client)
        .await
        .expect("client never finished")
        .expect("client task failed");
    assert_eq!(
        got.frames.len(),
        commands,
        "every command sent needs a reply (closed: {}, rest: {})",
        got.closed,
        show(&got.rest)
    );
    for (i, f) in got.frames.iter().enumerate() {
        assert!(
            f.starts_with(b"-"),
            "reply {i} is not an error: {}",
            show(f)
        );
    }

    // While Redis is down, a new client gets an error, not a hang.
    let mut c = Raw::connect(proxy.addr).await;
    let down = c.request(b"PING\r\n", 1).await;
    assert!(down.starts_with(b"-"), "{}", show(&down));

    redis.restart();
    wait_proxy_serves(&proxy).await;
    let mut c = Raw::connect(proxy.addr).await;
    assert_eq!(
        c.request(b"SET after restart\r\nGET after\r\n", 2).await,
        b"+OK\r\n$7\r\nrestart\r\n"
    );
    assert_eq!(redis.direct(&["GET", "after"]).await, b"$7\r\nrestart\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_death_reaches_blocked_and_subscribed_clients() {
    let mut redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    let upstream = redis.addr();
    let mut blocked = Raw::connect(proxy.addr).await;
    blocked.send(b"BLPOP q 0\r\n").await;
    let mut sub = Raw::connect(proxy.addr).await;
    sub.request(b"SUBSCRIBE ch\r\n", 1).await;
    redis.wait_blocked_clients(1).await;
    redis.kill();

    // The blocked command is in flight: it gets an error reply naming the upstream.
    let c = blocked.collect_frames(1, DEADLINE).await;
    let reply = c.frames.first().unwrap_or_else(|| {
        panic!(
            "blocked client got no reply (closed: {}) after the upstream died",
            c.closed
        )
    });
    let text = String::from_utf8_lossy(reply);
    assert!(
        text.starts_with("-ERR") && text.contains(&upstream),
        "{text:?}"
    );
    // The subscriber's subscriptions are gone with the upstream: like Redis going away, its
    // connection ends (it must not silently wait forever for messages).
    let (rest, closed) = sub.read_to_close(DEADLINE).await;
    assert!(
        closed,
        "subscriber left open after losing its subscriptions: {}",
        show(&rest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_proxy_recovers_after_upstream_restart() {
    let mut redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.upstream.reconnect_min_ms.value = 10;
    config.upstream.reconnect_max_ms.value = 100;
    let proxy = Proxy::start(config).await;
    // Warm pooled and dedicated upstream connections, then kill Redis under them.
    let mut held = Raw::connect(proxy.addr).await;
    assert_eq!(
        held.request(b"PING\r\nSELECT 1\r\nSET k v\r\n", 3).await,
        b"+PONG\r\n+OK\r\n+OK\r\n"
    );
    redis.restart();
    wait_proxy_serves(&proxy).await;
    // The client that was connected through the outage still gets an answer for every
    // command (an error, or a result once reconnected), never silence.
    held.send(b"PING\r\n").await;
    let c = held.collect_frames(1, DEADLINE).await;
    assert!(
        c.frames.len() == 1 || c.closed,
        "held client got neither a reply nor a close: {}",
        show(&c.rest)
    );
}

// ---------------------------------------------------------------------------------------------
// Graceful shutdown
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_inflight_blpop_timeout_reply_then_closes() {
    let redis = RedisServer::start();
    let mut proxy = Proxy::to(&redis).await;
    let mut idle = Raw::connect(proxy.addr).await;
    assert_eq!(idle.request(b"PING\r\n", 1).await, b"+PONG\r\n");
    let mut a = Raw::connect(proxy.addr).await;
    a.send(b"BLPOP q 0.5\r\n").await;
    redis.wait_blocked_clients(1).await;

    proxy.begin_shutdown();
    let (bytes, closed) = a.read_to_close(DEADLINE).await;
    assert_eq!(
        bytes,
        b"*-1\r\n",
        "in-flight BLPOP must get its reply before the close ({})",
        show(&bytes)
    );
    assert!(closed, "connection not closed after the drain");
    let (rest, closed) = idle.read_to_close(DEADLINE).await;
    assert!(closed && rest.is_empty(), "idle client: {}", show(&rest));
    proxy.wait_stopped().await.expect("run() returned an error");
    assert!(
        tokio::net::TcpStream::connect(proxy.addr).await.is_err(),
        "connection accepted after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_connections_while_draining() {
    let redis = RedisServer::start();
    let mut config = config_for(&redis.addr());
    config.shutdown_grace_ms.value = 30_000;
    let mut proxy = Proxy::start(config).await;
    let mut a = Raw::connect(proxy.addr).await;
    a.send(b"BLPOP q 0\r\n").await;
    redis.wait_blocked_clients(1).await;

    proxy.begin_shutdown();
    let addr = proxy.addr;
    wait_until(
        "new connections to be refused during the drain",
        || async move { tokio::net::TcpStream::connect(addr).await.is_err() },
    )
    .await;
    assert!(
        !proxy.is_finished(),
        "run() returned before the in-flight BLPOP was answered"
    );

    assert_eq!(redis.direct(&["RPUSH", "q", "x"]).await, b":1\r\n");
    let (bytes, closed) = a.read_to_close(DEADLINE).await;
    assert_eq!(bytes, b"*2\r\n$1\r\nq\r\n$1\r\nx\r\n", "{}", show(&bytes));
    assert!(closed, "connection not closed after the drain");
    proxy.wait_stopped().await.expect("run() returned an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_without_clients_returns_ok() {
    let redis = RedisServer::start();
    let proxy = Proxy::to(&redis).await;
    assert_eq!(exchange(proxy.addr, b"PING\r\n", 1).await, b"+PONG\r\n");
    proxy.stop().await;
}
